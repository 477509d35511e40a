//! Opaque, serialisable values: a deployment's init args and user config.

use std::fmt;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::error::{Error, Location};

/// A value held as MessagePack bytes, so it can be checkpointed, hashed stably and
/// sent to a replica without knowing its Rust type. The code that receives it
/// decodes it into its own type.
///
/// ```
/// use flotilla_core::Args;
/// let a = Args::encode(&("hello", 3u32)).unwrap();
/// let (s, n): (String, u32) = a.decode().unwrap();
/// assert_eq!((s.as_str(), n), ("hello", 3));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Args(#[serde(with = "serde_bytes_compat")] Vec<u8>);

impl Args {
    /// Encode any serde value.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        rmp_serde::to_vec_named(value)
            .map(Args)
            .map_err(|e| codec("encode", "a value".to_owned(), e.to_string()))
    }

    /// Decode into the receiver's type. An error names that type and says
    /// what did not fit in serde's words (`invalid type: string "loud",
    /// expected a boolean`), not in MessagePack's.
    ///
    /// ```
    /// let a = flotilla_core::Args::encode(&"loud").unwrap();
    /// let e = a.decode::<bool>().unwrap_err().to_string();
    /// assert_eq!(e, r#"cannot decode the value into `bool`: invalid type: string "loud", expected a boolean"#);
    /// ```
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        rmp_serde::from_slice(&self.0).map_err(|e| {
            let reason = self.why_not::<T>().unwrap_or(e.to_string());
            codec("decode", decoded_into::<T>(), reason)
        })
    }

    /// Decode into `T`, an error worded by the MessagePack reader: what the
    /// readable form is made with, so that explaining a failed decode
    /// ([`why_not`](Self::why_not)) never decodes the same way again.
    pub(crate) fn decode_plain<T: DeserializeOwned>(&self) -> Result<T, Error> {
        rmp_serde::from_slice(&self.0)
            .map_err(|e| codec("decode", decoded_into::<T>(), e.to_string()))
    }

    /// Why the value does not decode into `T`, in serde's words: the same
    /// decode from its readable form (`None` if that succeeds, or if the
    /// bytes are not MessagePack at all).
    fn why_not<T: DeserializeOwned>(&self) -> Option<String> {
        let value = serde_json::to_value(self.readable().ok()?).ok()?;
        serde_json::from_value::<T>(value)
            .err()
            .map(|e| e.to_string())
    }

    /// The empty value (MessagePack `nil`), which decodes as `()` or `None`.
    pub fn unit() -> Self {
        Args(vec![0xc0])
    }

    /// The empty map (MessagePack `{}`): Ray's default for `args`, `runtime_env`
    /// and every kwargs field.
    pub fn empty_map() -> Self {
        Args(vec![0x80])
    }

    /// Wrap bytes that already are MessagePack.
    pub fn from_msgpack(bytes: Vec<u8>) -> Self {
        Args(bytes)
    }

    /// The MessagePack bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value in readable form, for JSON: map keys that are not text
    /// are written as text (`{0: a}` as `{"0": "a"}`, a `null` key as
    /// `"null"`), as Ray's REST API writes a Python dict's keys. An error if
    /// the bytes are not MessagePack.
    ///
    /// ```
    /// let args = flotilla_core::Args::encode(&std::collections::BTreeMap::from([(0u8, "a")])).unwrap();
    /// let text = serde_json::to_string(&args.readable().unwrap()).unwrap();
    /// assert_eq!(text, r#"{"0":"a"}"#);
    /// ```
    pub fn readable(&self) -> Result<impl Serialize + use<>, Error> {
        crate::serve_config::value::readable(self)
    }
}

impl Default for Args {
    fn default() -> Self {
        Args::unit()
    }
}

impl fmt::Debug for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Args({} bytes)", self.0.len())
    }
}

/// What a decode into `T` is called in its error.
fn decoded_into<T>() -> String {
    format!("the value into `{}`", std::any::type_name::<T>())
}

fn codec(action: &'static str, what: String, reason: String) -> Error {
    Error::Codec {
        at: Location::default(),
        action,
        what,
        reason,
    }
}

/// Serialise the bytes as one MessagePack `bin`, not as an array of integers.
mod serde_bytes_compat {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = a.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_messagepack_fail_to_decode_with_the_readers_words() {
        // 0xc1 is never used; 0xd4 opens an ext type, which no value has.
        for bytes in [vec![0xc1], vec![0xd4, 0x01, 0x00]] {
            let a = Args::from_msgpack(bytes);
            let e = a.decode::<u8>().unwrap_err().to_string();
            assert!(e.starts_with("cannot decode the value into `u8`: "), "{e}");
            assert!(a.readable().is_err());
        }
    }

    #[test]
    fn round_trip_and_stable_bytes() {
        let a = Args::encode(&vec![1u8, 2, 3]).unwrap();
        let b = Args::encode(&vec![1u8, 2, 3]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.decode::<Vec<u8>>().unwrap(), vec![1, 2, 3]);
        let packed = rmp_serde::to_vec(&a).unwrap();
        assert_eq!(rmp_serde::from_slice::<Args>(&packed).unwrap(), a);
    }

    #[test]
    fn decode_into_wrong_type_is_an_error() {
        let a = Args::encode("text").unwrap();
        assert!(matches!(a.decode::<u64>(), Err(Error::Codec { .. })));
    }

    #[test]
    fn unit_decodes_as_unit_and_none() {
        Args::unit().decode::<()>().unwrap();
        assert_eq!(Args::unit().decode::<Option<u8>>().unwrap(), None);
    }
}
