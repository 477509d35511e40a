//! Numbers as Ray reads them (pydantic v2's lax mode), for the config's numeric
//! fields.
//!
//! An integer field takes an integer, a float with no fractional part (`2.0`,
//! `1.5e9`), or text that spells an integer (`"2"`, `" +2 "`, `"1_000"`, `"2.0"`);
//! not `"1e3"`, `"0x10"`, `2.5` or `"2.5"`. A float field takes any number, or
//! text that spells one (`"2.5"`, `"1e3"`, `"inf"`). A boolean is never a number
//! (pydantic reads `true` as 1; Flotilla refuses it: a departure, since a boolean
//! where a count belongs is a mistake). Range rules are checked afterwards, by the
//! field's own validation.
//!
//! The same functions read the MessagePack of a checkpoint, where every number is
//! stored as a number.

use std::{collections::BTreeMap, fmt};

use serde::{
    Deserialize, Deserializer,
    de::{self, Visitor},
};

use crate::error::shown;

/// An integer, read laxly.
struct Int(i128);

/// A float, read laxly.
pub(super) struct Float(pub(super) f64);

/// `s` as pydantic reads text as an integer: surrounding whitespace, a sign,
/// digits with single `_` between them, and optionally `.` and zeros.
fn int_text(s: &str) -> Option<i128> {
    let t = s.trim();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (digits, zeros) = t.split_once('.').unwrap_or((t, "0"));
    if zeros.is_empty() || !zeros.bytes().all(|b| b == b'0') {
        return None;
    }
    let clean = underscores(digits)?;
    // One sign at most: `i128::parse` would take a second one (`--5`), and
    // negating its `i128::MIN` overflows.
    if !clean.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i128 = clean.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// `s` without the `_` Python allows between digits, or `None` if one is
/// misplaced (leading, trailing, doubled, or next to a non-digit).
fn underscores(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        if c == '_' {
            let before = i.checked_sub(1).and_then(|j| b.get(j));
            let after = b.get(i + 1);
            if !(before.is_some_and(u8::is_ascii_digit) && after.is_some_and(u8::is_ascii_digit)) {
                return None;
            }
        } else {
            out.push(c);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// `s` as Python's `float()` reads text (which pydantic uses): whitespace,
/// `_` between digits, `inf`, `nan`, exponents.
fn float_text(s: &str) -> Option<f64> {
    let t = s.trim();
    let clean = if t.contains('_') {
        underscores(t)?
    } else {
        t.to_owned()
    };
    clean.parse().ok()
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(i128::from(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int(i128::from(v)))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Int, E> {
                i128::try_from(v)
                    .map(Int)
                    .map_err(|_| E::custom(format!("integer {v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                if !v.is_finite() {
                    Err(E::custom(format!(
                        "expected an integer, got {v} (not a finite number)"
                    )))
                } else if v.fract() != 0.0 {
                    Err(E::custom(format!(
                        "expected an integer, got {v}, a number with a fractional part"
                    )))
                } else if v.abs() > 1e36 {
                    Err(E::custom(format!("integer {v} is too large")))
                } else {
                    Ok(Int(v as i128))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Int, E> {
                int_text(v).map(Int).ok_or_else(|| {
                    E::custom(format!(
                        "expected an integer, got {:?}: unable to parse the text as an integer",
                        shown(v)
                    ))
                })
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Int, E> {
                Err(E::custom(format!(
                    "expected an integer, got the boolean {v}"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Float;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Float, E> {
                Ok(Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Float, E> {
                float_text(v).map(Float).ok_or_else(|| {
                    E::custom(format!(
                        "expected a number, got {:?}: unable to parse the text as a number",
                        shown(v)
                    ))
                })
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Float, E> {
                Err(E::custom(format!("expected a number, got the boolean {v}")))
            }
        }
        // Read typeless, as the integers are: the YAML reader then infers what
        // YAML 1.1 (Ray's PyYAML) reads as a number (`1_000`, `0x10`) and hands
        // text over as text, for `float_text` (`"inf"`, `"1_000.5"`). Asked for
        // a float, it would refuse both. `.inf` and `.nan` pass through as
        // floats (see `parse::options`); the field's validation refuses them
        // where they do not belong.
        d.deserialize_any(V)
    }
}

fn ranged<T: TryFrom<i128>, E: de::Error>(v: i128, min: i128, max: i128) -> Result<T, E> {
    if v < min {
        return Err(E::custom(format!("must be >= {min}, got {v}")));
    }
    if v > max {
        return Err(E::custom(format!("must be at most {max}, got {v}")));
    }
    T::try_from(v).map_err(|_| E::custom(format!("{v} is out of range")))
}

/// An optional `u32`, read laxly; `null` is `None`.
pub(super) fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Option::<Int>::deserialize(d)?
        .map(|Int(v)| ranged(v, 0, i128::from(u32::MAX)))
        .transpose()
}

/// An optional `u16` (a port), read laxly; `null` is `None`.
pub(super) fn opt_u16<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    Option::<Int>::deserialize(d)?
        .map(|Int(v)| ranged(v, 0, i128::from(u16::MAX)))
        .transpose()
}

/// An optional `u64`, read laxly; `null` is `None`.
pub(super) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<Int>::deserialize(d)?
        .map(|Int(v)| ranged(v, 0, i128::from(u64::MAX)))
        .transpose()
}

/// An optional `f64`, read laxly; `null` is `None`.
pub(super) fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(Option::<Float>::deserialize(d)?.map(|f| f.0))
}

/// An optional map of names to numbers (`resources`), values read laxly.
pub(super) fn opt_f64_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, f64>>, D::Error> {
    Ok(Option::<BTreeMap<String, Float>>::deserialize(d)?
        .map(|m| m.into_iter().map(|(k, v)| (k, v.0)).collect()))
}

/// An optional list of maps of names to numbers (`placement_group_bundles`).
pub(super) fn opt_f64_maps<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<BTreeMap<String, f64>>>, D::Error> {
    Ok(
        Option::<Vec<BTreeMap<String, Float>>>::deserialize(d)?.map(|v| {
            v.into_iter()
                .map(|m| m.into_iter().map(|(k, v)| (k, v.0)).collect())
                .collect()
        }),
    )
}

/// An optional integer read strictly, as Ray's `StrictInt` (`max_queued_requests`):
/// an integer, never text, a float or a boolean.
pub(super) fn opt_strict_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    const STRICT: &str = "expected an integer, written as one (Ray reads this field strictly: \
                          no text, no decimal point)";
    struct Strict(i64);
    impl<'de> Deserialize<'de> for Strict {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Strict;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(
                        "an integer, written as one (Ray reads this field strictly: \
                         no text, no decimal point)",
                    )
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<Strict, E> {
                    Ok(Strict(v))
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<Strict, E> {
                    i64::try_from(v)
                        .map(Strict)
                        .map_err(|_| E::custom(format!("integer {v} is too large")))
                }
                fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
                    Err(E::custom(format!("{STRICT}, got the number {v}")))
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Strict, E> {
                    Err(E::custom(format!("{STRICT}, got the text {:?}", shown(v))))
                }
                fn visit_bool<E: de::Error>(self, v: bool) -> Result<Strict, E> {
                    Err(E::custom(format!("{STRICT}, got the boolean {v}")))
                }
            }
            d.deserialize_any(V)
        }
    }
    Ok(Option::<Strict>::deserialize(d)?.map(|s| s.0))
}

/// Parse an integer from text as the lax rules do (for `num_replicas`).
pub(super) fn parse_int_text(s: &str) -> Option<i128> {
    int_text(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_from_text_follow_pydantic() {
        for (t, v) in [
            ("2", 2),
            (" 2 ", 2),
            ("+2", 2),
            ("-3", -3),
            ("2.0", 2),
            ("2.00", 2),
            ("0002", 2),
            ("1_000", 1000),
        ] {
            assert_eq!(int_text(t), Some(v), "{t}");
        }
        for t in [
            "2.",
            "2.5",
            "1e3",
            "0x10",
            "1__0",
            "_1",
            "1_",
            "",
            "+",
            "3.0000001",
            "--5",
            "+-5",
            "-+5",
            "--170141183460469231731687303715884105728",
            "-170141183460469231731687303715884105729",
        ] {
            assert_eq!(int_text(t), None, "{t}");
        }
    }

    #[test]
    fn floats_from_text_follow_python() {
        assert_eq!(float_text("1e3"), Some(1000.0));
        assert_eq!(float_text(" 1.5 "), Some(1.5));
        assert_eq!(float_text("1_0.5"), Some(10.5));
        assert_eq!(float_text(".5e1"), Some(5.0));
        assert_eq!(float_text("inf"), Some(f64::INFINITY));
        assert_eq!(float_text("0x1p3"), None);
        assert_eq!(float_text("1__0"), None);
    }
}
