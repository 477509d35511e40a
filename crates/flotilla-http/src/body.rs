//! The proxy's response body: whole, or streamed from an ingress's
//! [`CallStream`](flotilla::CallStream); and the guard that records each
//! request's metrics and access log once it is over.

use std::{
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use flotilla::CallStream;
use futures::StreamExt;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::{
    HttpResponse,
    metrics::{HttpStats, ProxyMetrics},
};

/// The status recorded for a request whose client went away first (Ray's 499:
/// metrics and logs only, nothing is sent).
pub(crate) const CLIENT_CLOSED: u16 = 499;

/// Records one request when dropped: its status (499 unless set: the client
/// went away), its latency from the moment the request came, in its route's
/// counters, and one access-log event (Ray's `{method} {route} {status} {ms}ms`).
pub(crate) struct Done {
    stats: Arc<HttpStats>,
    method: u8,
    pub(crate) status: u16,
    started: Instant,
    /// Counted in the ongoing gauge (matched requests only, as Ray).
    ongoing: Option<Arc<ProxyMetrics>>,
}

impl Done {
    pub(crate) fn new(
        stats: Arc<HttpStats>,
        method: u8,
        started: Instant,
        ongoing: Option<Arc<ProxyMetrics>>,
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
        tracing::info!(target: crate::ACCESS_LOG_TARGET, app = %self.stats.app,
            route = %self.stats.route, status = self.status,
            latency_ms = latency.as_secs_f64() * 1_000.0, "http request");
        self.stats.record(self.method, self.status, latency);
        if let Some(m) = &self.ongoing {
            m.ongoing.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Kind {
    Full(Option<Bytes>),
    Stream {
        /// Chunks already taken from the stream, sent first.
        pending: Vec<Bytes>,
        /// The chunks the stream's driver ([`drive`]) takes from the ingress.
        chunks: mpsc::Receiver<Bytes>,
        /// Why the driver cut the stream, once it did (set before it closes
        /// `chunks`); nothing when the stream ended.
        cut: Arc<Mutex<Option<StreamCut>>>,
    },
}

/// Chunks the driver may take from the ingress ahead of the client (the
/// call's own stream buffers ahead of the handler too).
const CHUNKS_AHEAD: usize = 4;

/// A response body.
pub(crate) struct ProxyBody {
    kind: Kind,
    /// The status sent, recorded once the body ends (a stream dropped before
    /// its end is recorded as 499: the client went away).
    status: u16,
    /// Records the request once the body is done (or dropped: disconnected).
    done: Option<Done>,
}

impl ProxyBody {
    /// A whole body, sent with `status`.
    pub(crate) fn full(status: u16, bytes: impl Into<Bytes>, mut done: Option<Done>) -> Self {
        let bytes = bytes.into();
        if let Some(d) = &mut done {
            d.status = status;
        }
        ProxyBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
            status,
            done,
        }
    }

    /// A streamed body: `pending` first, then every later item's body. A
    /// `bodyless` response's body is never read (hyper drops it): its status
    /// is recorded as sent, not as a client that went away.
    ///
    /// A task of its own drives the ingress's stream ([`drive`]), not the
    /// body's polls: hyper stops polling a body whose client reads nothing
    /// (an HTTP/2 window at 0, a full socket), and the handler, which runs
    /// only as its stream is polled, would hold its replica's slot for as
    /// long, deadline or not. The driver cuts the stream at the request's
    /// `deadline` (Ray's timeout once the response started), when the client
    /// has taken nothing for `stall` (as a request body that stalls), or as
    /// soon as the client goes.
    pub(crate) fn stream(
        status: u16,
        pending: Vec<Bytes>,
        stream: CallStream<HttpResponse>,
        limits: (Option<tokio::time::Instant>, Duration),
        mut done: Done,
        bodyless: bool,
    ) -> Self {
        if bodyless {
            done.status = status;
        }
        let (tx, chunks) = mpsc::channel(CHUNKS_AHEAD);
        let cut = Arc::new(Mutex::new(None));
        tokio::spawn(drive(stream, tx, limits, cut.clone()).instrument(tracing::Span::current()));
        ProxyBody {
            kind: Kind::Stream {
                pending,
                chunks,
                cut,
            },
            status,
            done: Some(done),
        }
    }

    /// The body is over: record the status it was sent with, or `cut` if it
    /// was cut short.
    fn finish(&mut self, cut: Option<u16>) {
        if let Some(mut d) = self.done.take() {
            d.status = cut.unwrap_or(self.status);
        }
    }
}

/// Why a streamed body was cut after its head was sent.
#[derive(Debug, thiserror::Error)]
enum StreamCut {
    #[error("the ingress stream failed after the response started: {0}")]
    Failed(#[source] flotilla::CallError),
    #[error("request timed out while its response streamed")]
    TimedOut,
    #[error("the client took nothing of the streamed response for {0:?}")]
    Stalled(Duration),
}

impl StreamCut {
    /// The status recorded for the request.
    fn status(&self) -> u16 {
        match self {
            StreamCut::Failed(_) => 500,
            StreamCut::TimedOut => crate::proxy::TIMEOUT_STATUS,
            StreamCut::Stalled(_) => CLIENT_CLOSED,
        }
    }
}

/// Take the ingress's chunks into `tx` until the stream ends; cut it (drop
/// it, which cancels the handler and frees its slot, and say why in `cut`)
/// at the deadline, when the client takes nothing for `stall`, or when it
/// failed; stop as soon as the body is gone (the client went away).
async fn drive(
    mut stream: CallStream<HttpResponse>,
    tx: mpsc::Sender<Bytes>,
    (deadline, stall): (Option<tokio::time::Instant>, Duration),
    cut: Arc<Mutex<Option<StreamCut>>>,
) {
    let expired = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let why = loop {
        let item = tokio::select! {
            biased;
            () = tx.closed() => return,
            () = &mut expired => break StreamCut::TimedOut,
            item = stream.next() => item,
        };
        let chunk = match item {
            None => return,
            Some(Err(e)) => break StreamCut::Failed(e),
            Some(Ok(item)) if item.body.is_empty() => continue,
            Some(Ok(item)) => item.body,
        };
        tokio::select! {
            biased;
            () = &mut expired => break StreamCut::TimedOut,
            sent = tx.send(chunk) => if sent.is_err() { return },
            () = tokio::time::sleep(stall) => break StreamCut::Stalled(stall),
        }
    };
    drop(stream);
    match &why {
        StreamCut::Failed(e) => {
            tracing::warn!(error = %e, "ingress stream failed after the response started: cut");
        }
        other => tracing::warn!(why = %other, "streamed response cut"),
    }
    *cut.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
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
            Kind::Full(bytes) => {
                let out = bytes.take();
                if out.is_none() {
                    this.finish(None);
                }
                Poll::Ready(out.map(|b| Ok(Frame::data(b))))
            }
            Kind::Stream {
                pending,
                chunks,
                cut,
            } => {
                if !pending.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(pending.remove(0)))));
                }
                match chunks.poll_recv(cx) {
                    Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                    Poll::Ready(None) => {
                        // The driver is done: ended, or cut (said before it
                        // closed the channel).
                        let why = cut
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .take();
                        match why {
                            None => {
                                this.finish(None);
                                Poll::Ready(None)
                            }
                            Some(why) => {
                                this.finish(Some(why.status()));
                                Poll::Ready(Some(Err(Box::new(why))))
                            }
                        }
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream { .. } => SizeHint::default(),
        }
    }
}
