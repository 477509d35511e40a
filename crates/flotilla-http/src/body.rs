//! The proxy's response body: whole, or streamed from an ingress's
//! [`CallStream`](flotilla::CallStream); the whole body both listeners send
//! ([`Whole`]); and the guard that records each request's metrics and access
//! log once it is over.

use std::{
    future::Future as _,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::Instant,
};

use bytes::Bytes;
use flotilla::CallStream;
use futures::Stream;
use http_body::{Body, Frame, SizeHint};

use crate::{
    HttpResponse,
    metrics::{HttpStats, ProxyMetrics, method_name},
    reaper::{Reaper, Slot, StreamCut, Watched, end_live},
};

/// The status recorded for a request whose client went away first (Ray's 499:
/// metrics and logs only, nothing is sent).
pub(crate) const CLIENT_CLOSED: u16 = 499;

/// Records one request when dropped: its status (499 unless set: the client
/// went away), its latency from the moment the request came, in its route's
/// counters, and one access-log event with Ray's fields (`method`, `route`,
/// `status_code`, `latency_ms`, and the request's `request_id` from its span;
/// Ray's line reads `{method} {route} {status} {ms}ms`).
pub(crate) struct Done {
    stats: Arc<HttpStats>,
    method: u8,
    pub(crate) status: u16,
    started: Instant,
    /// Counted in the ongoing gauge (matched requests only, as Ray).
    ongoing: Option<Arc<ProxyMetrics>>,
    /// The request's span (its `request_id`), entered for its access line,
    /// which hyper may write from its connection's task, outside it.
    span: tracing::Span,
}

impl Done {
    pub(crate) fn new(
        stats: Arc<HttpStats>,
        method: u8,
        started: Instant,
        ongoing: Option<Arc<ProxyMetrics>>,
        span: tracing::Span,
    ) -> Self {
        if let Some(m) = &ongoing {
            m.ongoing.fetch_add(1, Ordering::Relaxed);
        }
        Done {
            stats,
            method,
            status: CLIENT_CLOSED,
            started,
            ongoing,
            span,
        }
    }
}

impl Done {
    /// When the request came.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        let latency = self.started.elapsed();
        // Logged before it is counted: a request /metrics counts was logged.
        let _in = self.span.enter();
        tracing::info!(target: crate::ACCESS_LOG_TARGET, app = %self.stats.app,
            method = method_name(self.method), route = %self.stats.route,
            status_code = self.status, latency_ms = latency.as_secs_f64() * 1_000.0,
            "http request");
        self.stats.record(self.method, self.status, latency);
        if let Some(m) = &self.ongoing {
            m.ongoing.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Kind {
    Full {
        bytes: Whole,
        /// Records the request once the body is done (or dropped).
        done: Option<Done>,
        /// The status sent: what `done` records unless the body is dropped
        /// between its first frame and its last (the client went away).
        status: u16,
    },
    Stream {
        /// Chunks already taken from the stream, sent first.
        pending: Vec<Bytes>,
        /// The stream and the request's record, shared with the server's
        /// reaper (which cuts it at the deadline while the body is not
        /// polled).
        watched: Arc<Watched>,
        /// The request's deadline: passing it cuts the stream (Ray's timeout
        /// once the response started).
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
        /// The status sent, recorded once the stream ends (one dropped before
        /// its end is recorded as 499: the client went away).
        status: u16,
    },
}

/// A response body.
pub(crate) struct ProxyBody {
    kind: Kind,
}

impl ProxyBody {
    /// A whole body, sent with `status`. It is recorded with `status` unless
    /// it is dropped after hyper took its first frame and before its last:
    /// then its client went away (499). A body hyper never polls (a HEAD's)
    /// was sent as far as it goes.
    pub(crate) fn full(status: u16, bytes: impl Into<Bytes>, mut done: Option<Done>) -> Self {
        if let Some(d) = &mut done {
            d.status = status;
        }
        ProxyBody {
            kind: Kind::Full {
                bytes: Whole::new(bytes),
                done,
                status,
            },
        }
    }

    /// A streamed body: `pending` first, then every later item's body, the
    /// stream watched by `reaper` (see [`crate::reaper`]). A `bodyless`
    /// response's body is never read (hyper drops it): its status is recorded
    /// as sent, not as a client that went away.
    pub(crate) fn stream(
        status: u16,
        pending: Vec<Bytes>,
        (stream, reaper): (CallStream<HttpResponse>, &Reaper),
        deadline: Option<tokio::time::Instant>,
        mut done: Done,
        bodyless: bool,
    ) -> Self {
        if bodyless {
            done.status = status;
        }
        ProxyBody {
            kind: Kind::Stream {
                pending,
                watched: reaper.watch(stream, deadline, done),
                deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
                status,
            },
        }
    }
}

/// The most of a chunk handed to hyper at once: hyper asks for the next
/// frame only once it has room for it (its write buffer, the HTTP/2 window),
/// so a frame this small is handed within the stall bound by a client that
/// keeps reading, however large the ingress's chunks or the whole body.
const MAX_FRAME: usize = 16 * 1024;

/// A whole body, sent with its `content-length` and handed to hyper
/// [`MAX_FRAME`] at a time (the REST API's responses, and the proxy's whole
/// ones). One frame of it all would end its request at once, however much
/// hyper still had to write: the connection would count as idle while a
/// slow client still read, and be closed under it at `keep_alive_timeout`.
/// In frames, its request stays in flight until its last frame is handed,
/// and only a client that stops taking it is cut (see
/// [`crate::connection`]).
#[derive(Debug, Default)]
pub(crate) struct Whole(Bytes);

impl Whole {
    /// The body `bytes`.
    pub(crate) fn new(bytes: impl Into<Bytes>) -> Self {
        Whole(bytes.into())
    }

    /// The next frame's bytes, `None` once all were handed.
    fn next_frame(&mut self) -> Option<Bytes> {
        if self.0.is_empty() {
            return None;
        }
        let n = self.0.len().min(MAX_FRAME);
        Some(self.0.split_to(n))
    }
}

impl Body for Whole {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().next_frame().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.len() as u64)
    }
}

/// The next frame: `chunk` (or the first of `pending`), at most
/// [`MAX_FRAME`] of it, the rest put first in `pending`.
fn frame_of(pending: &mut Vec<Bytes>, chunk: Option<Bytes>) -> Bytes {
    let mut chunk = match chunk {
        Some(c) => c,
        None => pending.remove(0),
    };
    if chunk.len() > MAX_FRAME {
        let first = chunk.split_to(MAX_FRAME);
        pending.insert(0, chunk);
        return first;
    }
    chunk
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Full {
                bytes,
                done,
                status,
            } => {
                let Some(frame) = bytes.next_frame() else {
                    // Ended: recorded now.
                    drop(done.take());
                    return Poll::Ready(None);
                };
                if let Some(d) = done {
                    d.status = if bytes.is_end_stream() {
                        *status
                    } else {
                        CLIENT_CLOSED
                    };
                }
                Poll::Ready(Some(Ok(Frame::data(frame))))
            }
            Kind::Stream {
                pending,
                watched,
                deadline,
                status,
            } => {
                let status = *status;
                if !pending.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(frame_of(pending, None)))));
                }
                let mut slot = watched.slot();
                let stream = match &mut *slot {
                    Slot::Live(stream, _) => stream,
                    Slot::Over => return Poll::Ready(None),
                    // Cut by the reaper, which recorded the request.
                    Slot::Cut(_) => {
                        let Slot::Cut(why) = std::mem::replace(&mut *slot, Slot::Over) else {
                            return Poll::Ready(None);
                        };
                        return Poll::Ready(Some(Err(Box::new(why))));
                    }
                };
                let cut = loop {
                    if let Some(d) = deadline
                        && d.as_mut().poll(cx).is_ready()
                    {
                        tracing::warn!(status, "request timed out while streaming: cut");
                        break Some(StreamCut::TimedOut);
                    }
                    match Pin::new(&mut *stream).poll_next(cx) {
                        Poll::Ready(Some(Ok(item))) => {
                            if item.body.is_empty() {
                                continue;
                            }
                            return Poll::Ready(Some(Ok(Frame::data(frame_of(
                                pending,
                                Some(item.body),
                            )))));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            tracing::warn!(error = %e, "ingress stream failed after the response started: cut");
                            break Some(StreamCut::Failed(e));
                        }
                        Poll::Ready(None) => break None,
                        Poll::Pending => return Poll::Pending,
                    }
                };
                // Over: the stream goes now (its handler, if cut, with it),
                // and the request is recorded, outside the lock.
                end_live(
                    slot,
                    Slot::Over,
                    cut.as_ref().map_or(status, StreamCut::status),
                );
                Poll::Ready(cut.map(|c| Err(Box::new(c) as BoxError)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { bytes, .. } => bytes.is_end_stream(),
            Kind::Stream { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { bytes, .. } => bytes.size_hint(),
            Kind::Stream { .. } => SizeHint::default(),
        }
    }
}
