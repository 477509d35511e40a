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

use crate::{HttpResponse, body::Done};

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

/// A watched stream's state: one lock, so a cut and its reason are seen
/// together (a body never takes a cut stream for one that ended).
pub(crate) enum Slot {
    /// Being streamed; the request's record, settled by whichever of the
    /// body and the reaper ends it.
    Live(CallStream<HttpResponse>, Done),
    /// Cut by the reaper, for this reason (the body has not seen it yet).
    Cut(StreamCut),
    /// Over: ended, failed or cut, and the body has seen it.
    Over,
}

/// One streamed response, shared by its body and the reaper.
pub(crate) struct Watched {
    slot: Mutex<Slot>,
    /// When (ms from the reaper's epoch) the body last handed a chunk to
    /// hyper, or [`WAITING`].
    ready_at: AtomicU64,
    deadline: Option<Instant>,
    epoch: Instant,
}

impl Watched {
    /// The stream's state, to poll or to end.
    pub(crate) fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The body handed hyper a chunk now: the client has to take it.
    pub(crate) fn handed(&self) {
        self.ready_at.store(ms_since(self.epoch), Ordering::Release);
    }

    /// The body waits for the handler's next item (set before it polls the
    /// stream: a handler's long step is not the client's stall).
    pub(crate) fn waiting(&self) {
        self.ready_at.store(WAITING, Ordering::Release);
    }

    /// Why to cut it at `now_ms`, if it is to be cut: a client that took
    /// nothing for `stall`, or a deadline passed while the body waits on the
    /// client (while it waits on the handler, its own timer cuts it).
    fn overdue(&self, now: Instant, now_ms: u64, stall: Duration) -> Option<StreamCut> {
        let ready_at = self.ready_at.load(Ordering::Acquire);
        if ready_at == WAITING {
            return None;
        }
        if self.deadline.is_some_and(|d| d <= now) {
            return Some(StreamCut::TimedOut);
        }
        let stall_ms = u64::try_from(stall.as_millis()).unwrap_or(u64::MAX);
        (now_ms.saturating_sub(ready_at) >= stall_ms).then_some(StreamCut::Stalled(stall))
    }

    /// Cut it if it is overdue now: the stream is dropped (its handler
    /// cancelled, its slot freed) and the request recorded with the reason's
    /// status. A body that holds the stream now is polling it: left alone.
    fn cut_if_overdue(&self, now: Instant, now_ms: u64, stall: Duration) {
        let Ok(slot) = self.slot.try_lock() else {
            return;
        };
        if !matches!(*slot, Slot::Live(..)) {
            return;
        }
        let Some(why) = self.overdue(now, now_ms, stall) else {
            return;
        };
        let status = why.status();
        tracing::warn!(why = %why, "streamed response cut");
        // Recorded now: hyper may never poll the body again.
        end_live(slot, Slot::Cut(why), status);
    }
}

/// End a live stream: `slot` becomes `next` under its lock; then, outside
/// it, the stream goes (its handler, if still running, with it) and the
/// request is recorded with `status`. Nothing happens to a slot not live.
pub(crate) fn end_live(mut slot: MutexGuard<'_, Slot>, next: Slot, status: u16) {
    let live = std::mem::replace(&mut *slot, next);
    drop(slot);
    if let Slot::Live(stream, mut done) = live {
        drop(stream);
        done.status = status;
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

    /// Watch `stream`, whose request ends at `deadline` and is recorded by
    /// `done`; its body has not been polled yet (the head was just sent).
    pub(crate) fn watch(
        &self,
        stream: CallStream<HttpResponse>,
        deadline: Option<Instant>,
        done: Done,
    ) -> Arc<Watched> {
        let watched = Arc::new(Watched {
            slot: Mutex::new(Slot::Live(stream, done)),
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
        let live: Vec<Arc<Watched>> = {
            let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            streams.retain(|w| w.strong_count() > 0);
            streams.iter().filter_map(Weak::upgrade).collect()
        };
        // Outside the list's lock: cutting (or the last reference, dropped
        // here) runs the handler's drop code.
        for s in live {
            s.cut_if_overdue(now, now_ms, self.stall);
        }
    }
}
