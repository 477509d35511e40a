//! Streamed responses whose clients stopped taking them.
//!
//! hyper polls a response body only as its client takes the frames (an
//! HTTP/2 window at 0, a full socket: no poll), and a streamed response's
//! handler runs only as its body polls its stream: a client that reads
//! nothing held the handler, and its replica's `max_ongoing_requests` slot,
//! for as long as it kept the stream open, its request's deadline included
//! (checked in the body's poll). The reaper, one task per server, cuts such a
//! stream: one past its request's deadline, or whose client has taken
//! nothing for the stall bound (`keep_alive_timeout`, as for a request body
//! that stalls). Cutting drops the stream, which cancels the handler and
//! frees its slot. A body that is polled keeps polling its stream itself
//! (no task per response, no hand-off per chunk).

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::CallStream;
use tokio::{sync::watch, time::Instant};

use crate::HttpResponse;

/// Why a streamed body was cut after its head was sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamCut {
    /// The ingress's stream failed.
    #[error("the ingress stream failed after the response started: {0}")]
    Failed(#[source] flotilla::CallError),
    /// The request's deadline passed.
    #[error("request timed out while its response streamed")]
    TimedOut,
    /// The client took nothing for this long.
    #[error("the client took nothing of the streamed response for {0:?}")]
    Stalled(Duration),
}

impl StreamCut {
    /// The status recorded for the request.
    pub(crate) fn status(&self) -> u16 {
        match self {
            StreamCut::Failed(_) => 500,
            StreamCut::TimedOut => crate::proxy::TIMEOUT_STATUS,
            StreamCut::Stalled(_) => crate::body::CLIENT_CLOSED,
        }
    }
}

/// `ready_at` while the body waits for its handler's next item (the client
/// is not what holds it up).
const WAITING: u64 = u64::MAX;

/// One streamed response, shared by its body and the reaper.
pub(crate) struct Watched {
    /// The ingress's stream; `None` once cut (or ended).
    stream: Mutex<Option<CallStream<HttpResponse>>>,
    /// Why the reaper cut it.
    cut: Mutex<Option<StreamCut>>,
    /// When (ms from the reaper's epoch) the body last handed a chunk to
    /// hyper, or [`WAITING`].
    ready_at: AtomicU64,
    deadline: Option<Instant>,
    epoch: Instant,
}

impl Watched {
    /// The stream, to poll (`None` once cut or ended).
    pub(crate) fn stream(&self) -> MutexGuard<'_, Option<CallStream<HttpResponse>>> {
        self.stream.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the reaper cut it, once.
    pub(crate) fn take_cut(&self) -> Option<StreamCut> {
        self.cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The body handed hyper a chunk now: the client has to take it.
    pub(crate) fn handed(&self) {
        self.ready_at.store(ms_since(self.epoch), Ordering::Release);
    }

    /// The body waits for the handler's next item.
    pub(crate) fn waiting(&self) {
        self.ready_at.store(WAITING, Ordering::Release);
    }

    /// Why to cut it at `now_ms`, if it is to be cut.
    fn overdue(&self, now: Instant, now_ms: u64, stall: Duration) -> Option<StreamCut> {
        if self.deadline.is_some_and(|d| d <= now) {
            return Some(StreamCut::TimedOut);
        }
        let ready_at = self.ready_at.load(Ordering::Acquire);
        let stalled = ready_at != WAITING
            && now_ms.saturating_sub(ready_at)
                >= u64::try_from(stall.as_millis()).unwrap_or(u64::MAX);
        stalled.then_some(StreamCut::Stalled(stall))
    }

    /// Cut it: drop the stream (the handler is cancelled, its slot freed).
    fn cut(&self, why: StreamCut) {
        let Some(stream) = self.stream().take() else {
            return;
        };
        drop(stream);
        tracing::warn!(why = %why, "streamed response cut");
        *self.cut.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
    }
}

fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
}

/// The streamed responses of one server, and the bound on a client that
/// takes nothing.
pub(crate) struct Reaper {
    streams: Mutex<Vec<Weak<Watched>>>,
    stall: Duration,
    epoch: Instant,
}

impl Reaper {
    /// A reaper for clients that take nothing for `stall`.
    pub(crate) fn new(stall: Duration) -> Arc<Self> {
        Arc::new(Reaper {
            streams: Mutex::new(Vec::new()),
            stall,
            epoch: Instant::now(),
        })
    }

    /// Watch `stream`, whose request ends at `deadline`; its body has not
    /// been polled yet (the head was just sent).
    pub(crate) fn watch(
        &self,
        stream: CallStream<HttpResponse>,
        deadline: Option<Instant>,
    ) -> Arc<Watched> {
        let watched = Arc::new(Watched {
            stream: Mutex::new(Some(stream)),
            cut: Mutex::new(None),
            ready_at: AtomicU64::new(ms_since(self.epoch)),
            deadline,
            epoch: self.epoch,
        });
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&watched));
        watched
    }

    /// Look at every stream every quarter of the stall bound (at most every
    /// second) until the server stops.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let tick = (self.stall / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(tick) => self.sweep(),
            }
        }
    }

    /// Cut the streams overdue now; forget those whose bodies are gone.
    fn sweep(&self) {
        let (now, now_ms) = (Instant::now(), ms_since(self.epoch));
        let mut overdue = Vec::new();
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|w| match w.upgrade() {
                None => false,
                Some(s) => match s.overdue(now, now_ms, self.stall) {
                    Some(why) => {
                        overdue.push((s, why));
                        false
                    }
                    None => true,
                },
            });
        // Cut outside the list's lock: dropping a stream runs its handler's
        // drop code.
        for (s, why) in overdue {
            s.cut(why);
        }
    }
}
