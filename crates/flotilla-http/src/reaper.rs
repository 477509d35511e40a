//! Streamed responses past their request's deadline while their clients
//! take nothing.
//!
//! hyper polls a response body only as its client takes the frames (an
//! HTTP/2 window at 0, a full socket: no poll), and a streamed response's
//! deadline is checked in its body's poll: a stream whose client reads
//! nothing would outlive its deadline, its handler holding its replica's
//! `max_ongoing_requests` slot, until the connection's own check drops the
//! connection (`keep_alive_timeout` without the client taking anything, see
//! [`crate::connection`]). The reaper, one task per server, cuts such a
//! stream at its deadline, recorded as a timeout: cutting drops the stream,
//! which cancels the handler and frees its slot. A body that is polled keeps
//! polling its stream itself (no task per response, no hand-off per chunk).

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError, Weak},
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
}

impl StreamCut {
    /// The status recorded for the request.
    pub(crate) fn status(&self) -> u16 {
        match self {
            StreamCut::Failed(_) => 500,
            StreamCut::TimedOut => crate::proxy::TIMEOUT_STATUS,
        }
    }
}

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
    deadline: Option<Instant>,
}

impl Watched {
    /// The stream's state, to poll or to end.
    pub(crate) fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cut it if its deadline passed by `now`: the stream is dropped (its
    /// handler cancelled, its slot freed) and the request recorded as timed
    /// out. A body that holds the stream now is polling it: left alone (its
    /// own timer cuts it). One waiting on its handler may be cut by either,
    /// alike.
    fn cut_if_overdue(&self, now: Instant) {
        let Ok(slot) = self.slot.try_lock() else {
            return;
        };
        if !matches!(*slot, Slot::Live(..)) || self.deadline.is_none_or(|d| d > now) {
            return;
        }
        let why = StreamCut::TimedOut;
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

/// How often the reaper looks at the streams (how late past its deadline a
/// stream whose client reads nothing is cut, at most).
const SWEEP: Duration = Duration::from_millis(100);

/// The streamed responses of one server.
pub(crate) struct Reaper {
    streams: Mutex<Vec<Weak<Watched>>>,
}

impl Reaper {
    /// A reaper with no stream yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Reaper {
            streams: Mutex::new(Vec::new()),
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
            deadline,
        });
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&watched));
        watched
    }

    /// Look at every stream every [`SWEEP`] until the server stops.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                () = tokio::time::sleep(SWEEP) => self.sweep(),
            }
        }
    }

    /// Cut the streams overdue now; forget those whose bodies are gone.
    fn sweep(&self) {
        let now = Instant::now();
        let live: Vec<Arc<Watched>> = {
            let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            streams.retain(|w| w.strong_count() > 0);
            streams.iter().filter_map(Weak::upgrade).collect()
        };
        // Outside the list's lock: cutting (or the last reference, dropped
        // here) runs the handler's drop code.
        for s in live {
            s.cut_if_overdue(now);
        }
    }
}
