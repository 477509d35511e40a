//! Reading a request's body whole, bounded in size, in how long it may stall
//! and in how slowly it may come.
//!
//! hyper bounds the wait for a request head (`header_read_timeout`), and the
//! connection's idle check does not run while a request is in flight, so a
//! client that sends a head and then stops mid-body would hold its connection
//! for ever. Every body read here must make progress at least once per
//! `keep_alive_timeout` (the `stall`): a client that stops sending holds its
//! connection no longer than one that sends nothing.
//!
//! Progress alone is not enough: a byte a minute is progress, and a body
//! trickled so would hold its connection (and its place under
//! `max_connections`) for ever. So a body has a time budget: `stall` at the
//! start, one second more per [`MIN_BODY_RATE`] bytes received (Apache's
//! `mod_reqtimeout` rule, `body=20,MinRate=500`), but never more than
//! `stall` ahead: it is cut when the budget runs out. An upload at any
//! useful speed is never cut by it, a trickle is within about `stall`, and,
//! unlike Apache's rule (whose credit has no bound), so is a trickle after a
//! fast start: 10 MiB sent at once earned 5.8 hours there, in which a byte
//! every few seconds held the connection and the 10 MiB buffered.

use std::time::Duration;

use tokio::time::Instant;

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
    /// The body came slower than [`MIN_BODY_RATE`] allows.
    #[error(
        "only {received} bytes arrived in {}s: a body must come at {MIN_BODY_RATE} bytes a \
         second or more (at most {}s behind that)",
        .elapsed.as_secs_f64(),
        .stall.as_secs_f64()
    )]
    TooSlow {
        /// The bytes received when it was cut.
        received: usize,
        /// How long it had been read for.
        elapsed: Duration,
        /// The stall bound: the most time a body may bank ahead of the rate.
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

/// The slowest a request body may come, in bytes a second (Apache's
/// `MinRate` default): each such many bytes earn it one second more.
pub(crate) const MIN_BODY_RATE: u64 = 500;

/// The time `bytes` received earn.
fn earned(bytes: usize) -> Duration {
    Duration::from_millis((bytes as u64).saturating_mul(1000) / MIN_BODY_RATE)
}

/// Read `body` whole: at most `limit` bytes, within its time budget (see the
/// module doc): `stall` at the start, a second more per [`MIN_BODY_RATE`]
/// bytes received, never more than `stall` ahead.
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
    let start = Instant::now();
    let mut last = start;
    // `None`: beyond the clock's range, no bound.
    let mut budget = start.checked_add(stall);
    loop {
        let next = async {
            match budget {
                Some(at) => tokio::time::timeout_at(at, body.frame()).await,
                None => Ok(body.frame().await),
            }
        };
        let frame = match next.await {
            Err(_) if last.elapsed() >= stall => return Err(BodyReadError::Stalled { stall }),
            Err(_) => {
                return Err(BodyReadError::TooSlow {
                    received: out.len(),
                    elapsed: start.elapsed(),
                    stall,
                });
            }
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) if e.is::<LengthLimitError>() => {
                return Err(BodyReadError::TooLarge { limit });
            }
            Ok(Some(Err(e))) if client_gone(&*e) => return Err(BodyReadError::ClientGone(e)),
            Ok(Some(Err(e))) => return Err(BodyReadError::Failed(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        last = Instant::now();
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
            let ahead = last.checked_add(stall);
            budget = match (
                budget.and_then(|b| b.checked_add(earned(data.len()))),
                ahead,
            ) {
                (Some(b), Some(a)) => Some(b.min(a)),
                (b, None) => b,
                (None, a) => a,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

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

    /// Sends `chunks` parts of `size` bytes, one every `every`, then ends.
    fn trickle(
        chunks: usize,
        size: usize,
        every: Duration,
    ) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let parts = futures::stream::unfold(0, move |i| async move {
            if i == chunks {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((Ok(Frame::data(Bytes::from(vec![b'x'; size]))), i + 1))
        });
        http_body_util::StreamBody::new(Box::pin(parts))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_trickled_below_the_minimum_rate_is_cut_and_a_slow_upload_is_not() {
        let stall = Duration::from_secs(10);
        // A byte every 9 s never stalls, and would take 1,000 of them.
        let start = Instant::now();
        let trickled = read_whole(trickle(1000, 1, Duration::from_secs(9)), 1 << 20, stall).await;
        assert!(
            matches!(trickled, Err(BodyReadError::TooSlow { received: 1, .. })),
            "{trickled:?}"
        );
        // Cut at the allowance of its one byte: the stall plus 2 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(10_002));
        // 1,000 bytes a second (twice the minimum) for a minute: whole.
        let upload = read_whole(trickle(60, 1000, Duration::from_secs(1)), 1 << 20, stall).await;
        assert_eq!(upload.unwrap().len(), 60_000);
        // 400 bytes a second: after t seconds it has 10 + 0.8 t, so the
        // stall's head start is spent at t = 46.8 (18,400 bytes in).
        let slow = read_whole(trickle(1000, 400, Duration::from_secs(1)), 1 << 20, stall).await;
        assert!(
            matches!(slow, Err(BodyReadError::TooSlow { received: 18_400, elapsed, .. })
                if elapsed == Duration::from_millis(46_800)),
            "{slow:?}"
        );
    }

    /// A fast start banks no more than `stall`: 1 MB sent at once, then a
    /// byte every 8 s (never a stall), is cut about `stall` later, not after
    /// the 2,000 s the megabyte earned.
    #[tokio::test(start_paused = true)]
    async fn a_trickle_after_a_fast_start_is_cut_as_any_trickle() {
        let stall = Duration::from_secs(10);
        let parts = futures::stream::unfold(0usize, |i| async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(8)).await;
            }
            let size = if i == 0 { 1_000_000 } else { 1 };
            Some((
                Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'x'; size]))),
                i + 1,
            ))
        });
        let start = Instant::now();
        let body = http_body_util::StreamBody::new(Box::pin(parts));
        let trickled = read_whole(body, 10 << 20, stall).await;
        assert!(
            matches!(
                trickled,
                Err(BodyReadError::TooSlow {
                    received: 1_000_001,
                    ..
                })
            ),
            "{trickled:?}"
        );
        // The budget: 10 s ahead at the megabyte, 2 ms more for the byte at 8 s.
        assert_eq!(start.elapsed(), Duration::from_millis(10_002));
    }
}
