//! Reading a request's body whole, bounded in size and in how long it may stall.
//!
//! hyper bounds the wait for a request head (`header_read_timeout`), and the
//! connection's idle check does not run while a request is in flight, so a
//! client that sends a head and then stops mid-body would hold its connection
//! for ever. Every body read here must make progress at least once per
//! `keep_alive_timeout`: a client that stops sending holds its connection no
//! longer than one that sends nothing.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why a body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyReadError {
    /// More than the limit arrived (or was declared).
    #[error("the request body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Nothing arrived for `stall` while the body was unfinished.
    #[error("nothing arrived for {}s", .stall.as_secs_f64())]
    Stalled {
        /// How long the body made no progress.
        stall: Duration,
    },
    /// The client went away before its body was whole (its connection
    /// ended first).
    #[error("the client went away before its request body was whole")]
    ClientGone(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The body could not be read (malformed framing, a failed connection).
    #[error("the request body could not be read")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Whether `e` says the client went away mid-body (its connection ended
/// before the body did), not that it sent something wrong.
fn client_gone(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_incomplete_message() || h.is_canceled())
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
                )
            })
    })
}

/// Read `body` whole: at most `limit` bytes, each frame within `stall` of the
/// one before (or of the start).
pub(crate) async fn read_whole<B>(
    body: B,
    limit: usize,
    stall: Duration,
) -> Result<Bytes, BodyReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = Limited::new(body, limit);
    let mut out = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(stall, body.frame()).await {
            Err(_) => return Err(BodyReadError::Stalled { stall }),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) if e.is::<LengthLimitError>() => {
                return Err(BodyReadError::TooLarge { limit });
            }
            Ok(Some(Err(e))) if client_gone(&*e) => return Err(BodyReadError::ClientGone(e)),
            Ok(Some(Err(e))) => return Err(BodyReadError::Failed(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::{
        pin::Pin,
        task::{Context, Poll},
    };

    use http_body::Frame;

    use super::*;

    /// Yields `parts`, then stalls for ever if `stall_after`, else ends.
    struct Parts {
        parts: Vec<&'static [u8]>,
        stall_after: bool,
    }

    impl Body for Parts {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.parts.is_empty() {
                return if self.stall_after {
                    Poll::Pending
                } else {
                    Poll::Ready(None)
                };
            }
            let part = self.parts.remove(0);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(part)))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_read_whole_within_its_limit_and_cut_when_it_stalls_or_overflows() {
        let second = Duration::from_secs(1);
        let body = |parts, stall_after| Parts { parts, stall_after };
        let whole = read_whole(body(vec![b"he", b"llo"], false), 5, second).await;
        assert_eq!(whole.unwrap(), Bytes::from_static(b"hello"));
        let stalled = read_whole(body(vec![b"he"], true), 5, second).await;
        assert!(
            matches!(stalled, Err(BodyReadError::Stalled { stall }) if stall == second),
            "{stalled:?}"
        );
        let large = read_whole(body(vec![b"hello", b"!"], false), 5, second).await;
        assert!(
            matches!(large, Err(BodyReadError::TooLarge { limit: 5 })),
            "{large:?}"
        );
    }
}
