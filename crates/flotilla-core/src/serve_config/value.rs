//! Free-form config values (`args`, `user_config`) and their canonical MessagePack.
//!
//! A config file may hold any YAML value in `args` and `user_config`. It is read into
//! [`Value`], put in canonical form and stored as [`Args`] (MessagePack), so the
//! code that receives it decodes it into its own type.
//!
//! **Map order.** Canonical form sorts every map by key (see [`Value::total_cmp`]),
//! recursively. So the same text always yields the same bytes, and so do two texts
//! that differ only in the order of map keys, or in spelling (`0x10` and `16`, flow
//! and block style): reformatting a config never changes a code or config version.
//! The receiver sees the keys sorted, which no struct or map type can tell apart.

use std::{cmp::Ordering, fmt};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, MapAccess, SeqAccess, Visitor},
    ser::{SerializeMap, SerializeSeq},
};

use crate::{Args, error::Error};

/// Any value a YAML (or MessagePack) document can hold.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `null`, `~`, or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A negative integer (non-negative ones are always [`Value::UInt`], so each
    /// number has one representation).
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    /// A floating-point number.
    Float(f64),
    /// Text.
    Str(String),
    /// Raw bytes (MessagePack `bin`).
    Bytes(Vec<u8>),
    /// A sequence.
    Seq(Vec<Value>),
    /// A map, as key-value pairs.
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::UInt(_) => 2,
            Value::Float(_) => 3,
            Value::Str(_) => 4,
            Value::Bytes(_) => 5,
            Value::Seq(_) => 6,
            Value::Map(_) => 7,
        }
    }

    /// A total order: by kind (null < bool < integer < float < text < bytes <
    /// sequence < map), then integers numerically, floats by IEEE total order, text
    /// and bytes lexicographically by byte, sequences and maps element by element.
    pub(crate) fn total_cmp(&self, other: &Value) -> Ordering {
        fn int(v: &Value) -> i128 {
            match v {
                Value::Int(i) => i128::from(*i),
                Value::UInt(u) => i128::from(*u),
                _ => 0,
            }
        }
        match (self, other) {
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Int(_) | Value::UInt(_), Value::Int(_) | Value::UInt(_)) => {
                int(self).cmp(&int(other))
            }
            (Value::Float(a), Value::Float(b)) => a.total_cmp(b),
            (Value::Str(a), Value::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Value::Bytes(a), Value::Bytes(b)) => a.cmp(b),
            (Value::Seq(a), Value::Seq(b)) => a
                .iter()
                .zip(b)
                .map(|(x, y)| x.total_cmp(y))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| a.len().cmp(&b.len())),
            (Value::Map(a), Value::Map(b)) => a
                .iter()
                .zip(b)
                .map(|((k1, v1), (k2, v2))| k1.total_cmp(k2).then_with(|| v1.total_cmp(v2)))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| a.len().cmp(&b.len())),
            _ => self.rank().cmp(&other.rank()),
        }
    }

    /// Sort every map by key, recursively (maps' keys first, so they compare in
    /// canonical form).
    pub(crate) fn canonicalise(&mut self) {
        match self {
            Value::Seq(items) => items.iter_mut().for_each(Value::canonicalise),
            Value::Map(entries) => {
                for (k, v) in entries.iter_mut() {
                    k.canonicalise();
                    v.canonicalise();
                }
                entries.sort_by(|(a, _), (b, _)| a.total_cmp(b));
            }
            _ => {}
        }
    }

    /// Whether every number in the value, keys included, is finite.
    fn all_finite(&self) -> bool {
        match self {
            Value::Float(f) => f.is_finite(),
            Value::Seq(items) => items.iter().all(Value::all_finite),
            Value::Map(entries) => entries
                .iter()
                .all(|(k, v)| k.all_finite() && v.all_finite()),
            _ => true,
        }
    }
}

/// `value` read from a config, if it holds no `.inf` or `.nan`: the config a
/// status or `GET` shows back is JSON, which has no spelling for them (Ray's
/// `user_config` must be JSON too), so they would come back as `null`.
fn from_config<E: de::Error>(value: Value) -> Result<Value, E> {
    if value.unhashable_key().is_some() {
        return Err(E::custom(
            "a free-form value (such as args or user_config) cannot have a list or a map \
             as a map key (Ray's YAML loader refuses it too: the key is unhashable); use \
             text, a number, a bool or null",
        ));
    }
    if value.all_finite() {
        Ok(value)
    } else {
        Err(E::custom(
            "a free-form value (such as args or user_config) cannot hold .inf, .nan or a \
             number too large for a float: JSON, which the REST API and status answer \
             in, has no spelling for them",
        ))
    }
}

/// Encode `value` in canonical form.
pub(crate) fn to_args(mut value: Value) -> Result<Args, Error> {
    value.canonicalise();
    Args::encode(&value)
}

/// `args`' canonical bytes: decoded and re-encoded in canonical form, so that
/// [`Args`] built by hand (say from a `HashMap`) hash the same as parsed ones. Bytes
/// that do not decode are returned as they are.
pub(crate) fn canonical_bytes(args: &Args) -> Vec<u8> {
    args.decode_plain::<Value>()
        .and_then(to_args)
        .map_or_else(|_| args.as_bytes().to_vec(), |a| a.as_bytes().to_vec())
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::UInt(u) => s.serialize_u64(*u),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(t) => s.serialize_str(t),
            Value::Bytes(b) => s.serialize_bytes(b),
            Value::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                // JSON (the REST API's, and so the CLI's) has text keys only:
                // a readable form writes the others as Python's json.dumps
                // writes the keys of Ray's dicts. MessagePack keeps them.
                let readable = s.is_human_readable();
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    match k.key_text().filter(|_| readable) {
                        Some(text) => map.serialize_entry(&text, v)?,
                        None => map.serialize_entry(k, v)?,
                    }
                }
                map.end()
            }
        }
    }
}

impl Value {
    /// A scalar map key that is not text, as text (`null`, `true`, `3`,
    /// `1.5`); `None` for text (written as it is) and for the rest.
    fn key_text(&self) -> Option<String> {
        match self {
            Value::Null => Some("null".to_owned()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::UInt(u) => Some(u.to_string()),
            Value::Float(f) => Some(format!("{f:?}")),
            _ => None,
        }
    }

    /// The first map key in the value (at any depth) that is a sequence, a
    /// map or bytes.
    fn unhashable_key(&self) -> Option<&Value> {
        match self {
            Value::Seq(items) => items.iter().find_map(Value::unhashable_key),
            Value::Map(entries) => entries.iter().find_map(|(k, v)| match k {
                Value::Seq(_) | Value::Map(_) | Value::Bytes(_) => Some(k),
                _ => v.unhashable_key(),
            }),
            _ => None,
        }
    }
}

/// `args` in readable form (for JSON): its value, with map keys that are not
/// text written as text, as Ray's REST API writes a dict's; an error if the
/// bytes are not MessagePack.
pub(crate) fn readable(args: &Args) -> Result<impl Serialize + use<>, Error> {
    args.decode_plain::<Value>()
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(u64::try_from(v).map_or(Value::Int(v), Value::UInt))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::UInt(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        if let Ok(u) = u64::try_from(v) {
            Ok(Value::UInt(u))
        } else if let Ok(i) = i64::try_from(v) {
            Ok(Value::Int(i))
        } else {
            Err(E::custom(format!("integer {v} does not fit in 64 bits")))
        }
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        u64::try_from(v)
            .map(Value::UInt)
            .map_err(|_| E::custom(format!("integer {v} does not fit in 64 bits")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        super::wide_ints::note_float(v);
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = a.next_element()? {
            items.push(item);
        }
        Ok(Value::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut entries = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(entry) = a.next_entry()? {
            entries.push(entry);
        }
        Ok(Value::Map(entries))
    }
}

/// Serde glue for [`Args`] fields that hold free-form config values.
///
/// In a human-readable format (YAML, JSON) the field is the value itself, in
/// canonical form; in a binary one (MessagePack checkpoints) it is the `Args` bytes
/// as they are.
pub(crate) mod args_field {
    use super::*;

    /// Serialise one `Args`.
    pub(crate) fn serialize<S: Serializer>(args: &Args, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            args.decode_plain::<Value>()
                .map_err(serde::ser::Error::custom)?
                .serialize(s)
        } else {
            args.serialize(s)
        }
    }

    /// Deserialise one `Args`.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Args, D::Error> {
        if d.is_human_readable() {
            to_args(from_config(Value::deserialize(d)?)?).map_err(de::Error::custom)
        } else {
            Args::deserialize(d)
        }
    }

    /// Serde glue for `Option<Args>`.
    pub(crate) mod option {
        use super::*;

        struct Wrap<'a>(&'a Args);

        impl Serialize for Wrap<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                super::serialize(self.0, s)
            }
        }

        struct Unwrap(Args);

        impl<'de> Deserialize<'de> for Unwrap {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Unwrap)
            }
        }

        /// Serialise an optional `Args`.
        pub(crate) fn serialize<S: Serializer>(
            args: &Option<Args>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            args.as_ref().map(Wrap).serialize(s)
        }

        /// Deserialise an optional `Args`; `null` is `None`.
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Args>, D::Error> {
            Ok(Option::<Unwrap>::deserialize(d)?.map(|u| u.0))
        }
    }
}

/// Serde glue for an application's `args`: as [`args_field`], except that
/// `null` (or an `args:` key with nothing under it) is the empty map, exactly
/// as leaving `args` out is: the format's rule that `null` for a field is the
/// same as leaving it out. So a builder that decodes its args as a map gets
/// one, and the code version is the omitted one. A checkpoint's nil is read
/// the same way.
pub(crate) mod app_args {
    use super::*;

    pub(crate) use super::args_field::serialize;

    /// Deserialise an application's `args`; `null` is the empty map.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Args, D::Error> {
        let args = super::args_field::deserialize(d)?;
        Ok(if args == Args::unit() {
            Args::empty_map()
        } else {
            args
        })
    }
}

/// The keys of `args` if it holds a map, as text (non-text keys shown as
/// MessagePack debug), in canonical order; empty for anything else.
pub(crate) fn map_keys(args: &Args) -> Vec<String> {
    match args.decode_plain::<Value>() {
        Ok(Value::Map(entries)) => {
            let mut keys: Vec<String> = entries
                .into_iter()
                .map(|(k, _)| match k {
                    Value::Str(s) => s,
                    other => format!("{other:?}"),
                })
                .collect();
            keys.sort();
            keys
        }
        _ => Vec::new(),
    }
}

/// Whether `args` is empty: nil, the empty map or the empty sequence.
pub(crate) fn is_empty(args: &Args) -> bool {
    match args.decode_plain::<Value>() {
        Ok(Value::Null) => true,
        Ok(Value::Map(m)) => m.is_empty(),
        Ok(Value::Seq(s)) => s.is_empty(),
        _ => false,
    }
}

/// Serde glue for [`Args`] fields that must hold a mapping, as Ray's `Dict`
/// fields (`runtime_env`, `policy_kwargs`, `request_router_kwargs`): in a
/// human-readable format the value must be a map (`null` is the empty map);
/// in a binary one it is the `Args` bytes as they are.
pub(crate) mod map_field {
    use super::*;

    pub(crate) use super::args_field::serialize;

    fn checked<E: de::Error>(v: Value) -> Result<Args, E> {
        match v {
            Value::Null => Ok(Args::empty_map()),
            m @ Value::Map(_) => to_args(m).map_err(E::custom),
            other => Err(E::custom(format!(
                "expected a mapping (Ray's schema has a dictionary here), got {}",
                kind(&other)
            ))),
        }
    }

    fn kind(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
            Value::Str(_) => "text",
            Value::Bytes(_) => "bytes",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// Deserialise one mapping `Args`.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Args, D::Error> {
        if d.is_human_readable() {
            checked(from_config(Value::deserialize(d)?)?)
        } else {
            Args::deserialize(d)
        }
    }

    /// Serde glue for `Option<Args>` holding a mapping; `null` is `None`.
    pub(crate) mod option {
        use super::*;

        pub(crate) use super::super::args_field::option::serialize;

        struct Unwrap(Args);

        impl<'de> Deserialize<'de> for Unwrap {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Unwrap)
            }
        }

        /// Deserialise an optional mapping `Args`.
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Args>, D::Error> {
            Ok(Option::<Unwrap>::deserialize(d)?.map(|u| u.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> Value {
        Value::Str(t.into())
    }

    #[test]
    fn canonical_form_sorts_maps_recursively() {
        let a = Value::Map(vec![
            (s("b"), Value::UInt(1)),
            (
                s("a"),
                Value::Map(vec![(s("y"), Value::Null), (s("x"), Value::Bool(true))]),
            ),
        ]);
        let b = Value::Map(vec![
            (
                s("a"),
                Value::Map(vec![(s("x"), Value::Bool(true)), (s("y"), Value::Null)]),
            ),
            (s("b"), Value::UInt(1)),
        ]);
        assert_ne!(Args::encode(&a).unwrap(), Args::encode(&b).unwrap());
        assert_eq!(to_args(a).unwrap(), to_args(b).unwrap());
    }

    #[test]
    fn order_is_total_and_by_kind_then_value() {
        let mut v = vec![
            s("b"),
            Value::Float(0.5),
            Value::UInt(3),
            Value::Int(-4),
            s("a"),
            Value::Null,
            Value::Bool(false),
        ];
        v.sort_by(Value::total_cmp);
        assert_eq!(
            v,
            vec![
                Value::Null,
                Value::Bool(false),
                Value::Int(-4),
                Value::UInt(3),
                Value::Float(0.5),
                s("a"),
                s("b"),
            ]
        );
    }

    #[test]
    fn msgpack_round_trip_and_canonical_bytes_of_hand_built_args() {
        let mut m = std::collections::HashMap::new();
        for i in 0..20u32 {
            m.insert(format!("k{i}"), i);
        }
        let by_hand = Args::encode(&m).unwrap();
        let sorted: std::collections::BTreeMap<_, _> = m.into_iter().collect();
        let canonical = Args::encode(&sorted).unwrap();
        assert_eq!(canonical_bytes(&by_hand), canonical.as_bytes());
        let v: Value = canonical.decode().unwrap();
        assert_eq!(Args::encode(&v).unwrap(), canonical);
    }
}
