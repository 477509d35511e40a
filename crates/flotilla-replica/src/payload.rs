//! What a request or a response is on its way between a caller and a
//! replica: MessagePack bytes, or, inside one process, the value itself.
//!
//! Between processes every request and response is encoded. Inside one, a
//! caller that hands its request over by value
//! ([`DeploymentHandle::call_owned`](crate::DeploymentHandle::call_owned),
//! [`call_stream_owned`](crate::DeploymentHandle::call_stream_owned)) and a
//! replica's responses travel as values: a value of the receiver's own type is
//! moved, and only a value of another type is encoded and decoded, as between
//! processes. So the caller's and the deployment's types may differ as they
//! always could, and the common case (the same type on both sides) costs no
//! encoding.

use std::{any::Any, panic::AssertUnwindSafe};

use serde::{Serialize, de::DeserializeOwned};

use crate::{CallError, user::panic_message};

/// A request or a response in flight.
pub(crate) enum Payload {
    /// MessagePack (`rmp_serde::to_vec_named`).
    Encoded(Vec<u8>),
    /// The value, not encoded.
    Value(Box<dyn AnyValue>),
}

/// A value that can still be encoded if its receiver wants another type.
pub(crate) trait AnyValue: Send {
    fn encode(&self) -> Result<Vec<u8>, PayloadError>;
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Serialize + Send + 'static> AnyValue for T {
    fn encode(&self) -> Result<Vec<u8>, PayloadError> {
        to_bytes(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// Why a payload could not be had as its receiver's type, or as bytes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PayloadError {
    /// A value did not encode.
    #[error("{0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// Bytes did not decode as the receiver's type.
    #[error("{0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// A value lost its type between the check and the downcast (never).
    #[error("the value is not of the type it had")]
    Lost,
    /// The type's own `Serialize` or `Deserialize` (user code) panicked.
    #[error("panicked: {0}")]
    Panicked(String),
}

/// Encode `value` (MessagePack, named fields). A `Serialize` that panics is
/// user code panicking: it comes back as [`PayloadError::Panicked`], so it
/// fails its own request and never the task carrying it (a remote caller's
/// reply, a replica's serving loop).
pub(crate) fn to_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, PayloadError> {
    unwinding(|| Ok(rmp_serde::to_vec_named(value)?))
}

/// Decode bytes as a `T`; a `Deserialize` that panics is caught as in
/// [`to_bytes`].
pub(crate) fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PayloadError> {
    unwinding(|| Ok(rmp_serde::from_slice(bytes)?))
}

fn unwinding<T>(f: impl FnOnce() -> Result<T, PayloadError>) -> Result<T, PayloadError> {
    std::panic::catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(PayloadError::Panicked(panic_message(p))))
}

impl PayloadError {
    /// As the error of a request that could not be had: a bad request, even
    /// when its type's serde code panicked (the caller's `Serialize` of a
    /// value handed over, or the deployment's `Deserialize` of what came).
    /// The handler never ran, so the replica is not condemned for it: a
    /// caller must not be able to take replicas down by what it sends.
    pub(crate) fn bad_request(self) -> CallError {
        CallError::BadRequest(self.to_string())
    }

    /// As the error of a response that could not be had: a panic in the
    /// response type's serde code (the deployment's own) is reported as the
    /// panic it is.
    pub(crate) fn bad_response(self) -> CallError {
        match self {
            PayloadError::Panicked(m) => CallError::Panicked(m),
            e => CallError::BadResponse(e.to_string()),
        }
    }
}

impl Payload {
    /// `value`, not encoded.
    pub(crate) fn of<T: Serialize + Send + 'static>(value: T) -> Self {
        Payload::Value(Box::new(value))
    }

    /// `value`, encoded.
    pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, PayloadError> {
        Ok(Payload::Encoded(to_bytes(value)?))
    }

    /// The payload as a `T`: a value of that type is moved; bytes, or a value
    /// of another type (encoded first), are decoded.
    pub(crate) fn take<T: DeserializeOwned + 'static>(self) -> Result<T, PayloadError> {
        let bytes = match self {
            Payload::Encoded(bytes) => bytes,
            Payload::Value(value) if value.as_any().is::<T>() => {
                return value
                    .into_any()
                    .downcast::<T>()
                    .map(|v| *v)
                    .map_err(|_| PayloadError::Lost);
            }
            Payload::Value(value) => value.encode()?,
        };
        from_bytes(&bytes)
    }

    /// The payload as bytes, for a transport or a batch.
    pub(crate) fn into_bytes(self) -> Result<Vec<u8>, PayloadError> {
        match self {
            Payload::Encoded(bytes) => Ok(bytes),
            Payload::Value(value) => value.encode(),
        }
    }
}

/// Where a streaming call's items go: to its caller in this process (values
/// are moved), or to a transport that sends them to another process (each is
/// encoded first).
#[derive(Clone)]
pub struct ItemSender(Items);

#[derive(Clone)]
enum Items {
    Local(tokio::sync::mpsc::Sender<Payload>),
    Encoded(tokio::sync::mpsc::Sender<Vec<u8>>),
}

impl std::fmt::Debug for ItemSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            Items::Local(_) => "local",
            Items::Encoded(_) => "encoded",
        };
        f.debug_tuple("ItemSender").field(&kind).finish()
    }
}

/// Why an item was not sent.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The receiver went away (the caller dropped its stream).
    Closed,
    /// The item could not be encoded for its transport.
    Encode(PayloadError),
}

/// The receiver of a streaming call's items went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemsClosed;

impl ItemSender {
    /// Items for a caller in this process.
    pub(crate) fn local(tx: tokio::sync::mpsc::Sender<Payload>) -> Self {
        ItemSender(Items::Local(tx))
    }

    /// Items for a transport to another process: each is encoded.
    pub fn encoded(tx: tokio::sync::mpsc::Sender<Vec<u8>>) -> Self {
        ItemSender(Items::Encoded(tx))
    }

    /// Send an item (waiting while the receiver is full).
    pub(crate) async fn send<T: Serialize + Send + 'static>(
        &self,
        item: T,
    ) -> Result<(), SendError> {
        match &self.0 {
            Items::Local(tx) => tx
                .send(Payload::of(item))
                .await
                .map_err(|_| SendError::Closed),
            Items::Encoded(tx) => {
                let bytes = AnyValue::encode(&item).map_err(SendError::Encode)?;
                tx.send(bytes).await.map_err(|_| SendError::Closed)
            }
        }
    }

    /// Send an item that is encoded already (from another process, or a
    /// batch's response).
    pub async fn send_encoded(&self, bytes: Vec<u8>) -> Result<(), ItemsClosed> {
        match &self.0 {
            Items::Local(tx) => tx
                .send(Payload::Encoded(bytes))
                .await
                .map_err(|_| ItemsClosed),
            Items::Encoded(tx) => tx.send(bytes).await.map_err(|_| ItemsClosed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails to encode: taking it as its own type proves it was moved.
    struct Unencodable(u32);

    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("not encodable"))
        }
    }

    impl<'de> serde::Deserialize<'de> for Unencodable {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            u32::deserialize(d).map(Unencodable)
        }
    }

    #[test]
    fn a_value_taken_as_its_own_type_is_moved() {
        let v: Unencodable = Payload::of(Unencodable(3)).take().unwrap();
        assert_eq!(v.0, 3);
        let e = Payload::of(Unencodable(3)).into_bytes().unwrap_err();
        assert!(e.to_string().contains("not encodable"), "{e}");
    }

    #[test]
    fn a_value_of_another_type_is_encoded_and_decoded() {
        // u8 -> u64: the same MessagePack integer.
        assert_eq!(Payload::of(7u8).take::<u64>().unwrap(), 7);
        assert_eq!(
            Payload::of(String::from("x")).into_bytes().unwrap(),
            rmp_serde::to_vec_named("x").unwrap()
        );
        let e = Payload::of(String::from("x")).take::<u64>().unwrap_err();
        assert!(matches!(e, PayloadError::Decode(_)), "{e}");
        let e = Payload::of(Unencodable(1)).take::<u32>().unwrap_err();
        assert!(e.to_string().contains("not encodable"), "{e}");
    }

    #[test]
    fn bytes_are_decoded() {
        let p = Payload::encode("hi").unwrap();
        assert_eq!(p.take::<String>().unwrap(), "hi");
    }

    #[tokio::test]
    async fn items_for_a_transport_are_encoded_and_local_ones_moved() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let encoded = ItemSender::encoded(tx);
        encoded.send(5u32).await.unwrap();
        assert_eq!(
            rx.recv().await.unwrap(),
            rmp_serde::to_vec_named(&5u32).unwrap()
        );
        assert!(matches!(
            encoded.send(Unencodable(1)).await,
            Err(SendError::Encode(_))
        ));
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let local = ItemSender::local(tx);
        local.send(Unencodable(9)).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().take::<Unencodable>().unwrap().0, 9);
        drop(rx);
        assert!(matches!(local.send(1u8).await, Err(SendError::Closed)));
        assert_eq!(local.send_encoded(Vec::new()).await, Err(ItemsClosed));
    }
}
