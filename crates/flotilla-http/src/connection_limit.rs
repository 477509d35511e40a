//! How many connections one listener holds open at once
//! ([`HttpOptions::max_connections`](crate::HttpOptions::max_connections)).
//!
//! At its limit a listener makes room for a newcomer by closing the
//! connection that has been idle longest (no request in flight: a kept-alive
//! one between requests, or one that never sent a whole request head, as a
//! flood of half-open connections does), and, when every connection has a
//! request in flight, accepts nothing more until one closes: newcomers wait
//! in the kernel's accept backlog (as HAProxy's `maxconn` and Envoy's
//! listener limit hold them), not in the process, but for the one it holds
//! while it waits. So a flood of connections takes at most that many file
//! descriptors (set below the process's open-file limit, the checkpoint,
//! node links and the other listener keep theirs), and the memory those
//! connections' requests hold, and cannot hold the listener's places for
//! its idle connections' timeout (`keep_alive_timeout`) against everyone
//! else. (Every idle connection is a candidate, the oldest first: a client
//! that keeps opening connections and sending nothing also has others'
//! kept-alive ones closed, which their clients open again.)

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use std::net::SocketAddr;

use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch},
    time::Instant,
};

use crate::connection::{InFlight, WeakInFlight};

/// How often a newcomer waiting at the limit looks again for an idle
/// connection to close.
const EVICT_AGAIN: Duration = Duration::from_millis(100);

/// What a listener's accept loop does next ([`ConnectionLimit::next`]).
pub(crate) enum Next {
    /// A place is free: accept the next connection into it.
    Place(OwnedSemaphorePermit),
    /// A newcomer came at the limit, and this place was made for it.
    Newcomer(OwnedSemaphorePermit, (TcpStream, SocketAddr)),
    /// An accept failed at the limit (out of descriptors): nobody was closed.
    Failed(std::io::Error),
    /// The server stops.
    Stop,
}

/// How often, at most, a listener held at its limit says so (WARN).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// One listener's connection limit and its figures.
#[derive(Debug)]
pub(crate) struct ConnectionLimit {
    /// The listener's name (`proxy`, `rest`): the `listener` label and field.
    pub(crate) listener: &'static str,
    max: usize,
    /// One permit per connection that may open; an open one holds its permit.
    places: Arc<Semaphore>,
    /// How many times the listener found itself at its limit.
    reached: AtomicU64,
    /// Connections open now: places turned into connections ([`Open`]). The
    /// accept loop holds one more place while it waits for a connection.
    open: AtomicUsize,
    /// When it last said so.
    warned: Mutex<Option<Instant>>,
    /// Its open connections, to close the idlest of at the limit.
    conns: Mutex<Vec<WeakInFlight>>,
}

impl ConnectionLimit {
    /// A limit of `max` connections (at least 1 and at most
    /// [`Semaphore::MAX_PERMITS`]: [`HttpOptions::validate`](crate::HttpOptions::validate)
    /// holds it to that).
    pub(crate) fn new(listener: &'static str, max: usize) -> Arc<Self> {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(ConnectionLimit {
            listener,
            max,
            places: Arc::new(Semaphore::new(max)),
            reached: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            warned: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
        })
    }

    /// What `listener`'s accept loop does next, until `stop`: below the limit,
    /// take a free place; at it, whichever comes first of a place coming
    /// free and a newcomer, for whom room is made by closing the connection
    /// idle longest (looked for again every [`EVICT_AGAIN`] while none is:
    /// all busy, or the one told to close took a request). Newcomers beyond
    /// that one wait in the backlog.
    pub(crate) async fn next(
        &self,
        listener: &TcpListener,
        stop: &mut watch::Receiver<bool>,
    ) -> Next {
        if let Some(place) = self.try_admit() {
            return Next::Place(place);
        }
        let newcomer = tokio::select! {
            place = self.admit() => return place.map_or(Next::Stop, Next::Place),
            accepted = listener.accept() => match accepted {
                Ok(newcomer) => newcomer,
                Err(e) => return Next::Failed(e),
            },
            () = crate::stopped(stop) => return Next::Stop,
        };
        loop {
            self.evict_idlest();
            tokio::select! {
                place = self.next_place() => {
                    return match place {
                        Some(place) => Next::Newcomer(place, newcomer),
                        None => Next::Stop,
                    };
                }
                () = tokio::time::sleep(EVICT_AGAIN) => {}
                () = crate::stopped(stop) => return Next::Stop,
            }
        }
    }

    /// A place for one more connection now, if one is free.
    pub(crate) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.places.clone().try_acquire_owned().ok()
    }

    /// A newcomer waits at the limit: close the open connection that has
    /// been idle longest, if any is idle (its place comes to
    /// [`admit`](Self::admit) as it closes). Returns whether one was.
    pub(crate) fn evict_idlest(&self) -> bool {
        let idlest = {
            let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            conns.retain(|c| !c.is_gone());
            (conns.iter())
                .filter_map(WeakInFlight::upgrade)
                .filter_map(|c| c.idle_since().map(|since| (since, c)))
                .min_by_key(|(since, _)| *since)
                .map(|(_, c)| c)
        };
        idlest.map(|c| c.evict()).is_some()
    }

    /// A place for one more connection, held until the connection ends: at
    /// once below the limit, and at the limit once a connection closes.
    /// `None` never comes (the limit closes nothing), but would mean that no
    /// place ever will.
    pub(crate) async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        match self.places.clone().try_acquire_owned() {
            Ok(place) => return Some(place),
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {}
        }
        self.reached.fetch_add(1, Ordering::Relaxed);
        self.warn();
        self.places.clone().acquire_owned().await.ok()
    }

    /// The next place to come free, for a newcomer already counted at the
    /// limit by [`admit`](Self::admit) (`None`: as there).
    pub(crate) async fn next_place(&self) -> Option<OwnedSemaphorePermit> {
        self.places.clone().acquire_owned().await.ok()
    }

    /// Say that the listener is at its limit, at most once per [`WARN_EVERY`]
    /// (a flood would otherwise log once per connection).
    fn warn(&self) {
        let now = Instant::now();
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return;
        }
        *warned = Some(now);
        tracing::warn!(
            listener = self.listener,
            max_connections = self.max,
            "at max_connections: a newcomer closes the connection idle longest, or waits until one closes"
        );
    }

    /// `place` now holds an accepted connection, whose requests `load`
    /// counts, until the [`Open`] is dropped (with the connection's task).
    pub(crate) fn opened(self: &Arc<Self>, place: OwnedSemaphorePermit, load: &InFlight) -> Open {
        self.open.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        // At most `max` are open: the closed ones go before the list doubles.
        if conns.len() >= self.max.saturating_mul(2).max(64) {
            conns.retain(|c| !c.is_gone());
        }
        conns.push(load.downgrade());
        drop(conns);
        Open {
            limit: self.clone(),
            _place: place,
        }
    }

    /// How many of its connections are open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Its limit.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// How many times it found itself at its limit.
    pub(crate) fn reached(&self) -> u64 {
        self.reached.load(Ordering::Relaxed)
    }
}

/// One open connection's place, given back when this is dropped.
#[derive(Debug)]
pub(crate) struct Open {
    limit: Arc<ConnectionLimit>,
    _place: OwnedSemaphorePermit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.limit.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Room is made by closing the connection idle longest: never a busy
    /// one (however old), nor one already told to close.
    #[tokio::test(start_paused = true)]
    async fn the_idlest_connection_is_closed_to_make_room_never_a_busy_one() {
        let limit = ConnectionLimit::new("proxy", 3);
        let open = |load: &InFlight| {
            let place = limit.try_admit().unwrap();
            limit.opened(place, load)
        };
        let busy = InFlight::new();
        let _busy = open(&busy);
        // In flight until this (never polled) call is dropped.
        let request = busy.track(futures::future::pending::<
            Result<http::Response<http_body_util::Empty<bytes::Bytes>>, std::convert::Infallible>,
        >());
        tokio::time::advance(Duration::from_secs(1)).await;
        let older = InFlight::new();
        let _older = open(&older);
        tokio::time::advance(Duration::from_secs(1)).await;
        let newer = InFlight::new();
        let _newer = open(&newer);
        assert!(busy.idle_since().is_none());
        assert!(older.idle_since() < newer.idle_since());
        assert!(limit.evict_idlest());
        assert!(older.idle_since().is_none(), "the idlest is told to close");
        assert!(newer.idle_since().is_some());
        assert!(limit.evict_idlest());
        assert!(newer.idle_since().is_none());
        assert!(!limit.evict_idlest(), "only the busy one is left");
        drop(request);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_past_the_limit_waits_for_one_to_close() {
        let limit = ConnectionLimit::new("proxy", 2);
        let first = limit.admit().await.unwrap();
        // A place the accept loop holds while it waits is no connection.
        assert_eq!(limit.open(), 0);
        let (one, two) = (InFlight::new(), InFlight::new());
        let first = limit.opened(first, &one);
        let _second = limit.opened(limit.admit().await.unwrap(), &two);
        assert_eq!((limit.open(), limit.reached()), (2, 0));
        let third = tokio::spawn({
            let limit = limit.clone();
            async move { limit.admit().await }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "admitted past the limit");
        assert_eq!(limit.reached(), 1);
        drop(first);
        assert_eq!(limit.open(), 1);
        let _third = limit.opened(third.await.unwrap().unwrap(), &InFlight::new());
        assert_eq!((limit.open(), limit.max()), (2, 2));
    }
}
