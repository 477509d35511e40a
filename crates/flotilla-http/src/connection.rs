//! One accepted connection's life on either listener: served until it ends,
//! closed once it has been idle for `keep_alive_timeout`, and shut down
//! gracefully when its server stops, each close bounded in time.
//!
//! Idle means no request in flight, where a request is in flight from the
//! moment hyper hands it to the service until its response body is dropped
//! (sent whole, cut, or abandoned by a client that left). hyper bounds
//! HTTP/1's wait for a request head (`header_read_timeout`) but not
//! hyper-util's wait for the HTTP/2 preface, nor an HTTP/2 connection with no
//! stream open; this one bound covers them all alike, so a connection that
//! sends nothing, or nothing more, holds its task and descriptor for at most
//! `keep_alive_timeout` (uvicorn's `timeout_keep_alive`, which Ray's proxy
//! runs under). A request whose body stops arriving (or trickles in) is in
//! flight, so this check leaves it be: the body read cuts it after the same
//! bound (`request_body`, with its minimum rate), with a 408.
//!
//! The same check ends a connection whose client stopped taking a response:
//! hyper polls a response body only as its client takes what it was handed
//! (an HTTP/1 socket's buffer, an HTTP/2 window), so a body handed a frame,
//! or its head, and not polled again for `keep_alive_timeout` waits on a
//! client that reads nothing. Such a connection is dropped at once (a client
//! that reads nothing would not take a goodbye either), with everything in
//! flight on it: streams end (their handlers cancelled, their replica slots
//! freed) and each request is recorded as its client gone (499). Without
//! this, a client that stopped reading held its connection, and its place
//! under `max_connections`, for as long as it kept the socket open. Whole
//! responses are handed to hyper in small frames too
//! ([`Whole`](crate::body::Whole)): one frame of it all would end its request
//! at once, its bytes still to write, and the connection, counted as idle,
//! would be closed under a client still reading. What "taken" means is the
//! kernel's: hyper is handed room again only when the socket's send buffer
//! is about a third free, so a client whose reading frees less than that
//! within `keep_alive_timeout` counts as one that takes nothing.

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http_body::{Body, Frame, SizeHint};
use hyper_util::server::graceful::GracefulConnection;
use tokio::{sync::watch, time::Instant};

/// One connection's requests, as its idle check reads them: atomics the
/// requests update and the check reads only when its timer fires, so that a
/// request costs no wake-up of the connection's task.
struct Load {
    in_flight: AtomicUsize,
    started: AtomicBool,
    /// When the last request ended, in nanoseconds since `epoch`.
    last_end: AtomicU64,
    /// Each response body's progress: when it was last handed to hyper (in
    /// nanoseconds since `epoch`), or [`WAITING`]. Read only by the check.
    bodies: Mutex<Vec<Weak<AtomicU64>>>,
    /// Closes the connection, if it is idle then: its listener, at its
    /// limit with a newcomer waiting, makes room (see
    /// [`crate::connection_limit`]).
    evict: tokio::sync::Notify,
    /// It is closing (told to, or saying goodbye): no longer a connection
    /// to close to make room.
    closing: AtomicBool,
    /// When the connection was accepted.
    epoch: Instant,
}

/// The fewest entries a connection's list of response bodies is pruned at.
const BODIES_PRUNED_AT: usize = 64;

/// A body's progress while it is not waiting on its client: it waits on its
/// own source (a handler's next item), or it is over.
const WAITING: u64 = u64::MAX;

/// What the check finds.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// Nothing in flight for the idle limit: close.
    Idle,
    /// A response handed to hyper that its client has not taken for this
    /// long: drop the connection.
    Stalled(Duration),
    /// Look again then.
    Later(Instant),
}

impl Load {
    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(WAITING - 1)
    }

    /// The connection's state at `now` (the check's own instant), by the
    /// idle limit `idle`, which is also how long a client may take nothing
    /// of a response handed to hyper.
    fn check(&self, now: Instant, idle: Duration) -> Check {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            let oldest = {
                let mut bodies = self.bodies.lock().unwrap_or_else(PoisonError::into_inner);
                bodies.retain(|b| b.strong_count() > 0);
                (bodies.iter())
                    .filter_map(Weak::upgrade)
                    .map(|b| b.load(Ordering::Acquire))
                    .filter(|&at| at != WAITING)
                    .min()
            };
            let Some(handed) = oldest else {
                return Check::Later(now + idle);
            };
            let handed = self.epoch + Duration::from_nanos(handed);
            let waited = now.saturating_duration_since(handed);
            if waited >= idle {
                return Check::Stalled(waited);
            }
            return Check::Later(handed + idle);
        }
        let at = self.epoch + Duration::from_nanos(self.last_end.load(Ordering::Acquire)) + idle;
        if at > now {
            Check::Later(at)
        } else {
            Check::Idle
        }
    }
}

/// Counts one connection's requests in flight (see the module doc).
#[derive(Clone)]
pub(crate) struct InFlight(Arc<Load>);

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight(Arc::new(Load {
            in_flight: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            last_end: AtomicU64::new(0),
            bodies: Mutex::new(Vec::new()),
            evict: tokio::sync::Notify::new(),
            closing: AtomicBool::new(false),
            epoch: Instant::now(),
        }))
    }

    /// A reference to it that does not keep it (its listener's list).
    pub(crate) fn downgrade(&self) -> WeakInFlight {
        WeakInFlight(Arc::downgrade(&self.0))
    }

    /// Since when the connection has had no request in flight (since it was
    /// accepted, if it never had one), or `None` while one is in flight or
    /// it is closing.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        if self.0.in_flight.load(Ordering::Acquire) > 0 || self.0.closing.load(Ordering::Acquire) {
            return None;
        }
        let last_end = self.0.last_end.load(Ordering::Acquire);
        Some(self.0.epoch + Duration::from_nanos(last_end))
    }

    /// Close the connection if it is idle when its task sees this (one that
    /// has started a request meanwhile is left be): at once if it never had
    /// a request, with a goodbye otherwise (what hyper still has to write of
    /// a response whose body it took whole is written first).
    pub(crate) fn evict(&self) {
        self.0.closing.store(true, Ordering::Release);
        self.0.evict.notify_one();
    }

    /// Wrap a service call: its request is in flight until the response's
    /// body is dropped (or the call itself, if it is dropped first).
    pub(crate) fn track<B, F>(
        &self,
        call: F,
    ) -> impl Future<Output = Result<http::Response<Tracked<B>>, Infallible>> + use<B, F>
    where
        F: Future<Output = Result<http::Response<B>, Infallible>>,
    {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        self.0.started.store(true, Ordering::Release);
        let counted = Counted(self.0.clone());
        async move {
            let response = call.await?;
            // Its head is handed to hyper now: the client is to take it.
            let progress = Arc::new(AtomicU64::new(counted.0.since_epoch()));
            let mut bodies = counted
                .0
                .bodies
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // The ended ones go before the list doubles (a kept-alive
            // connection serves many responses, few at once).
            if bodies.len() >= BODIES_PRUNED_AT.max(bodies.capacity()) {
                bodies.retain(|b| b.strong_count() > 0);
            }
            bodies.push(Arc::downgrade(&progress));
            drop(bodies);
            Ok(response.map(|body| Tracked {
                body,
                progress,
                counted,
            }))
        }
    }
}

/// A connection's [`InFlight`], as its listener's limit keeps it: gone with
/// the connection.
pub(crate) struct WeakInFlight(Weak<Load>);

impl std::fmt::Debug for WeakInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakInFlight")
            .field("open", &!self.is_gone())
            .finish()
    }
}

impl WeakInFlight {
    /// The connection, while it is open.
    pub(crate) fn upgrade(&self) -> Option<InFlight> {
        self.0.upgrade().map(InFlight)
    }

    /// Whether the connection is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// One request in flight; it ends when this is dropped.
struct Counted(Arc<Load>);

impl Drop for Counted {
    fn drop(&mut self) {
        // The end's instant first: a check that sees no request in flight
        // also sees when the last one ended.
        self.0
            .last_end
            .store(self.0.since_epoch(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is dropped,
/// and tells the connection's check when it last handed hyper a frame.
pub(crate) struct Tracked<B> {
    body: B,
    progress: Arc<AtomicU64>,
    counted: Counted,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        // A frame handed waits on the client; a pending body on its source.
        let at = match &polled {
            Poll::Ready(Some(Ok(_))) => self.counted.0.since_epoch(),
            _ => WAITING,
        };
        self.progress.store(at, Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Resolves once `load` has had nothing in flight for `idle`, or one of its
/// responses waited on its client for `idle`: the timer wakes at most once
/// per `idle` while requests come, and re-arms.
async fn idle_or_stalled(load: &Load, idle: Duration) -> Check {
    let mut deadline = load.epoch + idle;
    loop {
        tokio::time::sleep_until(deadline).await;
        match load.check(Instant::now(), idle) {
            Check::Later(later) => deadline = later,
            over => return over,
        }
    }
}

/// How one connection is bounded.
pub(crate) struct Bounds {
    /// The listener's name, for logs.
    pub(crate) listener: &'static str,
    /// The client, for logs.
    pub(crate) peer: SocketAddr,
    /// `keep_alive_timeout`: the idle limit, and how long a connection closing
    /// for idleness may take to say goodbye.
    pub(crate) idle: Duration,
    /// The server's shutdown grace period.
    pub(crate) grace: Duration,
}

/// Serve `conn` to its end: closed at once if it starts no request within
/// `idle` (there is nothing to say goodbye to), gracefully once idle after
/// requests (HTTP/2's GOAWAY) or when `stop` turns true (in-flight requests
/// finish), and dropped if that goodbye outlasts `idle` (or `grace` on stop).
/// `_open` is held until the end: the server's shutdown waits for every
/// connection's.
pub(crate) fn serve<C>(
    conn: C,
    load: InFlight,
    bounds: Bounds,
    stop: watch::Receiver<bool>,
    open: watch::Receiver<()>,
) -> impl Future<Output = ()> + Send
where
    C: GracefulConnection + Send,
    C::Error: std::fmt::Display + Send,
{
    // Named `Send` here, where `C` is generic: proved at the spawn, through
    // the concrete connection's closures, the compiler fails on lifetimes.
    serve_inner(conn, load, bounds, stop, open)
}

async fn serve_inner<C>(
    conn: C,
    load: InFlight,
    bounds: Bounds,
    mut stop: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
) where
    C: GracefulConnection + Send,
    C::Error: std::fmt::Display + Send,
{
    let Bounds {
        listener,
        peer,
        idle,
        grace,
    } = bounds;
    tokio::pin!(conn);
    let evicted = async {
        loop {
            load.0.evict.notified().await;
            if load.0.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            // A request started meanwhile: not closed after all.
            load.0.closing.store(false, Ordering::Release);
        }
    };
    let ended = tokio::select! {
        ended = conn.as_mut() => Some(ended),
        () = crate::stopped(&mut stop) => None,
        () = evicted => {
            if !load.0.started.load(Ordering::Acquire) {
                tracing::debug!(listener, %peer,
                    "no request yet, at max_connections with a newcomer waiting: closed");
                return;
            }
            tracing::debug!(listener, %peer,
                "idle, at max_connections with a newcomer waiting: closing");
            None
        }
        check = idle_or_stalled(&load.0, idle) => {
            if let Check::Stalled(waited) = check {
                tracing::warn!(listener, %peer, ?waited,
                    "the client took nothing of a response for keep_alive_timeout: connection dropped");
                return;
            }
            if !load.0.started.load(Ordering::Acquire) {
                tracing::debug!(listener, %peer, "no request within keep_alive_timeout: closed");
                return;
            }
            tracing::debug!(listener, %peer, "idle for keep_alive_timeout: closing");
            None
        }
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            load.0.closing.store(true, Ordering::Release);
            let mut stopping = *stop.borrow();
            let limit = if stopping { grace } else { idle };
            conn.as_mut().graceful_shutdown();
            let deadline = tokio::time::sleep(limit);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    ended = conn.as_mut() => break ended,
                    () = &mut deadline => {
                        tracing::warn!(listener, %peer, ?limit,
                            "connection still open after its closing period: dropped");
                        return;
                    }
                    // A shutdown during an idle goodbye cuts it to the grace.
                    () = crate::stopped(&mut stop), if !stopping => {
                        stopping = true;
                        let cut = tokio::time::Instant::now() + grace;
                        if cut < deadline.deadline() {
                            deadline.as_mut().reset(cut);
                        }
                    }
                }
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(listener, %peer, error = %e, "connection ended with an error");
    }
}
