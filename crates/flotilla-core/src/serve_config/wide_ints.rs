//! Integers a config writes that do not fit in 64 bits: serde-saphyr hands
//! such a literal to a free-form value (`args`, `user_config`) as a float,
//! which would change it without a word (PyYAML keeps it exact), so it is
//! refused, at its position.
//!
//! The free-form value reader notes every whole float beyond 64-bit
//! integers it is given ([`note_float`]); only then is the text read again,
//! for a plain integer literal of that value. A text field's digits (a
//! `name`), a float field's number and a legacy octal literal that fits
//! (read exactly) never come to it.

use std::cell::RefCell;

use granit_parser::{Event, Parser, ScalarStyle};

use crate::error::{Error, shown};

thread_local! {
    /// The floats noted during this thread's parse, `None` outside one.
    static SUSPECTS: RefCell<Option<Vec<f64>>> = const { RefCell::new(None) };
}

/// A parse on this thread, watched for floats that may be wide integers
/// until this is dropped (a parse within it watched on its own, the outer
/// one's floats kept for it).
pub(super) struct Watch(Option<Vec<f64>>);

/// Watch the parse that follows.
pub(super) fn watch() -> Watch {
    Watch(SUSPECTS.with(|s| s.replace(Some(Vec::new()))))
}

impl Drop for Watch {
    fn drop(&mut self) {
        let outer = self.0.take();
        SUSPECTS.with(|s| *s.borrow_mut() = outer);
    }
}

/// A float given to a free-form value: noted, during a watched parse, if it
/// is whole and beyond what `i64` and `u64` hold (what a too-wide integer
/// literal reads as).
pub(crate) fn note_float(v: f64) {
    const I64_MIN: f64 = -9_223_372_036_854_775_808.0;
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    if v.fract() == 0.0 && (v <= I64_MIN || v >= U64_END) {
        SUSPECTS.with(|s| {
            if let Some(found) = s.borrow_mut().as_mut() {
                found.push(v);
            }
        });
    }
}

/// The first plain integer literal in `text` too wide for 64 bits that a
/// free-form value read as a float during the watched parse, as an error at
/// its position.
pub(super) fn too_wide(text: &str) -> Option<Error> {
    let suspects = SUSPECTS.with(|s| s.borrow_mut().take()).unwrap_or_default();
    if suspects.is_empty() {
        return None;
    }
    for event in Parser::new_from_str(text) {
        // The first parse succeeded; this one fails no sooner.
        let Ok((Event::Scalar(value, ScalarStyle::Plain, _, None), span)) = event else {
            continue;
        };
        if is_wide_integer(&value) && value.parse::<f64>().is_ok_and(|f| suspects.contains(&f)) {
            return Some(Error::Parse {
                line: span.start.line() as u64,
                column: span.start.col() as u64 + 1,
                message: format!(
                    "the integer {} does not fit in 64 bits; quote it to keep it as text",
                    shown(&value)
                ),
            });
        }
    }
    None
}

/// A decimal integer literal (an optional sign, then digits) that neither
/// `i64` nor `u64` holds.
fn is_wide_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<i64>().is_err()
        && s.parse::<u64>().is_err()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::ServeConfig;

    fn config(args: &str) -> String {
        format!("applications:\n  - name: a\n    import_path: x:y\n    args: {args}\n")
    }

    #[test]
    fn an_integer_too_wide_for_64_bits_is_refused_at_its_place() {
        for wide in [
            "123456789012345678901234567890",
            "18446744073709551616",
            "-9223372036854775809",
        ] {
            let e = ServeConfig::from_yaml(&config(&format!("{{n: {wide}}}"))).unwrap_err();
            match e {
                Error::Parse {
                    line: 4,
                    column: 15,
                    ref message,
                } if message.contains(wide) && message.contains("64 bits") => {}
                other => panic!("{wide}: {other:?}"),
            }
        }
    }

    #[test]
    fn integers_that_fit_and_text_that_looks_like_one_are_kept() {
        for (args, expect) in [
            ("{n: 18446744073709551615}", "18446744073709551615"),
            ("{n: -9223372036854775808}", "-9223372036854775808"),
            (
                "{n: '123456789012345678901234567890'}",
                "\"123456789012345678901234567890\"",
            ),
            ("{n: 1.0e+30}", "1e+30"),
        ] {
            let c = ServeConfig::from_yaml(&config(args)).unwrap();
            let v: serde_json::Value = c.applications[0].args.decode().unwrap();
            assert_eq!(v["n"].to_string(), expect, "{args}");
        }
        // Nor are digits in a comment, a block of text, a text field, or a
        // legacy octal literal that fits.
        let text = "applications:\n  - name: a\n    import_path: x:y\n    \
                    # 123456789012345678901234567890\n    args:\n      note: |\n        \
                    123456789012345678901234567890\n";
        let c = ServeConfig::from_yaml(text).unwrap();
        let v: serde_json::Value = c.applications[0].args.decode().unwrap();
        assert_eq!(v["note"], "123456789012345678901234567890\n");
        let c = ServeConfig::from_yaml(
            "applications:\n  - name: 12345678901234567890123\n    import_path: x:y\n    \
             args: {n: 01777777777777777777777}\n",
        )
        .unwrap();
        assert_eq!(c.applications[0].name.as_str(), "12345678901234567890123");
        let n: std::collections::BTreeMap<String, u64> = c.applications[0].args.decode().unwrap();
        assert_eq!(n["n"], u64::MAX);
    }
}
