//! A deployment override's field whose `null` means something: Ray sets the
//! field to `None` over the code's value (its `exclude_unset` keeps a `null`
//! written out), where a field left out keeps the code's.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{
        self, MapAccess, SeqAccess, Visitor,
        value::{MapAccessDeserializer, SeqAccessDeserializer},
    },
};

/// A field that is left out (the builder's value stands), `null` (no value,
/// whatever the builder's), or given.
///
/// In a config's text `null` is [`Nullable::Clear`], and [`Nullable::Keep`]
/// is left out of what is written by the struct that holds it
/// (`skip_serializing_if = "Nullable::is_keep"`; written on its own, `Keep`
/// is `null`, which reads back as `Clear`, and so is a `Set` of an `Args`
/// holding nil, which only code makes). In the checkpoint's binary encoding
/// `nil` is `Keep` (as every record written before `Clear` existed reads)
/// and `Clear` is `false`.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Nullable<T> {
    /// Left out: the builder's value stands.
    #[default]
    Keep,
    /// `null`: no value, whatever the builder's.
    Clear,
    /// This value replaces the builder's.
    Set(T),
}

impl<T> Nullable<T> {
    /// Whether the field was left out.
    pub fn is_keep(&self) -> bool {
        matches!(self, Nullable::Keep)
    }

    /// The value given, if one was.
    pub fn given(&self) -> Option<&T> {
        match self {
            Nullable::Set(v) => Some(v),
            Nullable::Keep | Nullable::Clear => None,
        }
    }
}

impl<T> From<Option<T>> for Nullable<T> {
    /// `None` is [`Nullable::Keep`].
    fn from(v: Option<T>) -> Self {
        v.map_or(Nullable::Keep, Nullable::Set)
    }
}

/// How `Clear` and `Keep` are written; `set` writes a given value.
fn write<S: Serializer, T>(
    n: &Nullable<T>,
    s: S,
    set: impl FnOnce(&T, S) -> Result<S::Ok, S::Error>,
) -> Result<S::Ok, S::Error> {
    match n {
        Nullable::Set(v) => set(v, s),
        Nullable::Clear if !s.is_human_readable() => s.serialize_bool(false),
        Nullable::Clear | Nullable::Keep => s.serialize_none(),
    }
}

/// A struct-valued field (a map in both encodings).
impl<T: Serialize> Serialize for Nullable<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        write(self, s, T::serialize)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Nullable<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            return Ok(Option::<T>::deserialize(d)?.map_or(Nullable::Clear, Nullable::Set));
        }
        d.deserialize_any(Binary(PhantomData))
    }
}

/// The binary encoding: `nil`, `false`, or the value (a map for a struct, or
/// a sequence when written without field names; `bin` for
/// [`Args`](crate::Args)).
struct Binary<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Binary<T> {
    type Value = Nullable<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nil, false or a value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Nullable::Keep)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Nullable::Keep)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        if v {
            return Err(E::custom(
                "a left-out field is nil, a null one false, never true",
            ));
        }
        Ok(Nullable::Clear)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Nullable::Set)
    }

    /// A struct written without its field names.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq)).map(Nullable::Set)
    }
}

/// Serde glue for a `Nullable<Args>` (`user_config`): given, it is written
/// as [`args_field`](super::value::args_field) writes an `Args`.
pub(crate) mod args {
    use super::*;
    use crate::{Args, serve_config::value::args_field};

    /// Serialise.
    pub(crate) fn serialize<S: Serializer>(n: &Nullable<Args>, s: S) -> Result<S::Ok, S::Error> {
        write(n, s, args_field::serialize)
    }

    /// Deserialise.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Nullable<Args>, D::Error> {
        if d.is_human_readable() {
            return Ok(args_field::option::deserialize(d)?.map_or(Nullable::Clear, Nullable::Set));
        }
        d.deserialize_any(BinaryArgs)
    }

    struct BinaryArgs;

    impl<'de> Visitor<'de> for BinaryArgs {
        type Value = Nullable<Args>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("nil, false or MessagePack bytes")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Nullable::Keep)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Nullable::Keep)
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Binary::<Args>(PhantomData).visit_bool(v)
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
            Ok(Nullable::Set(Args::from_msgpack(v.to_vec())))
        }

        fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
            Ok(Nullable::Set(Args::from_msgpack(v)))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{Args, AutoscalingOverride, DeploymentName, DeploymentOverride};

    fn entry(
        autoscaling: Nullable<AutoscalingOverride>,
        user_config: Nullable<Args>,
    ) -> DeploymentOverride {
        let mut d = DeploymentOverride::new(DeploymentName::new("d").unwrap());
        d.autoscaling_config = autoscaling;
        d.user_config = user_config;
        d
    }

    #[test]
    fn each_state_survives_the_checkpoints_encoding_and_json() {
        let auto = AutoscalingOverride {
            max_replicas: Some(3),
            ..AutoscalingOverride::default()
        };
        let user = Args::encode(&[1, 2]).unwrap();
        for (a, u) in [
            (Nullable::Keep, Nullable::Keep),
            (Nullable::Clear, Nullable::Clear),
            (Nullable::Set(auto), Nullable::Set(user)),
        ] {
            let d = entry(a, u);
            let stored = rmp_serde::to_vec_named(&d).unwrap();
            let back: DeploymentOverride = rmp_serde::from_slice(&stored).unwrap();
            assert_eq!(back, d, "checkpoint");
            let json = serde_json::to_string(&d).unwrap();
            let back: DeploymentOverride = serde_json::from_str(&json).unwrap();
            assert_eq!(back, d, "json: {json}");
        }
        // Left out of what is written; null when cleared.
        let json = serde_json::to_string(&entry(Nullable::Keep, Nullable::Clear)).unwrap();
        assert!(!json.contains("autoscaling_config"), "{json}");
        assert!(json.contains(r#""user_config":null"#), "{json}");
    }

    /// A record written before `Clear` existed holds `nil` for a field left
    /// out: it still reads as left out.
    #[test]
    fn an_older_records_nil_reads_as_left_out() {
        #[derive(Serialize)]
        struct Before {
            name: &'static str,
            autoscaling_config: Option<()>,
            user_config: Option<()>,
        }
        let before = rmp_serde::to_vec_named(&Before {
            name: "d",
            autoscaling_config: None,
            user_config: None,
        })
        .unwrap();
        let back: DeploymentOverride = rmp_serde::from_slice(&before).unwrap();
        assert_eq!(back, entry(Nullable::Keep, Nullable::Keep));
    }
}
