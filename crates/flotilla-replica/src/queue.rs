//! A deployment's request queue in one process: callers waiting for a replica
//! slot take their turn oldest first, as Ray's router serves its pending
//! requests.
//!
//! A caller joins only when it found no slot, or found others already waiting
//! (so a newcomer never overtakes them). The oldest waiter holds the turn: a
//! freed slot, a new replica or a raised limit wakes it alone; leaving, it
//! wakes the next if a slot is still free or a turn was given to it that it
//! will not use. A waiter its router declines while replicas have room (a custom
//! router's `None`) passes the turn to the one behind it, so one request the
//! router holds back does not hold back the others; the last one keeps the
//! turn spare for the next to join.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering, fence},
    },
};

use tokio::sync::Notify;

/// The waiters of one deployment's route, oldest first.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    /// `waiters.len()`, readable without the lock: a freed slot takes the lock
    /// only while someone waits.
    len: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_ticket: u64,
    waiters: VecDeque<Waiter>,
    /// The last waiter passed the turn with nobody behind it: the next to join
    /// takes it.
    spare_turn: bool,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    /// Set when the waiter is given the turn, cleared when it takes it.
    turn: bool,
    wake: Arc<Notify>,
}

impl Waiter {
    fn give_turn(&mut self) {
        self.turn = true;
        self.wake.notify_one();
    }
}

/// Why [`WaitQueue::join`] refused a caller.
#[derive(Debug)]
pub(crate) struct QueueFull {
    /// How many were waiting.
    pub(crate) waiting: usize,
}

impl WaitQueue {
    /// Callers waiting now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Join at the back, unless `max` are waiting already. The first to join an
    /// empty queue holds the turn, so it looks for a slot again at once.
    pub(crate) fn join(self: &Arc<Self>, max: usize) -> Result<Place, QueueFull> {
        let mut inner = self.lock();
        let waiting = inner.waiters.len();
        if waiting >= max {
            return Err(QueueFull { waiting });
        }
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        let turn = inner.waiters.is_empty() || std::mem::take(&mut inner.spare_turn);
        let wake = Arc::new(Notify::new());
        inner.waiters.push_back(Waiter {
            ticket,
            turn,
            wake: wake.clone(),
        });
        self.len.store(inner.waiters.len(), Ordering::SeqCst);
        drop(inner);
        // Pairs with the fence in `slot_freed`: either that caller sees this
        // waiter, or this waiter's next look sees the slot it freed.
        fence(Ordering::SeqCst);
        Ok(Place {
            queue: self.clone(),
            ticket,
            wake,
            left: false,
        })
    }

    /// A slot may have freed (a request ended, a replica joined, a limit rose):
    /// give the oldest waiter the turn.
    pub(crate) fn slot_freed(&self) {
        fence(Ordering::SeqCst);
        if self.len.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(first) = self.lock().waiters.front_mut() {
            first.give_turn();
        }
    }
}

/// A caller's place in a [`WaitQueue`]; dropping it leaves the queue (and hands
/// on a turn it was given and did not use).
#[derive(Debug)]
pub(crate) struct Place {
    queue: Arc<WaitQueue>,
    ticket: u64,
    wake: Arc<Notify>,
    left: bool,
}

impl Place {
    /// Notified when this waiter is given the turn (call before
    /// [`take_turn`](Self::take_turn), so a turn given after it is not missed).
    pub(crate) fn woken(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Whether this waiter holds the turn now (and take it: it looks for a
    /// slot once).
    pub(crate) fn take_turn(&self) -> bool {
        let mut inner = self.queue.lock();
        match inner.waiters.iter_mut().find(|w| w.ticket == self.ticket) {
            Some(w) => std::mem::take(&mut w.turn),
            None => false,
        }
    }

    /// The router declined this waiter while replicas had room: the one behind
    /// it takes the turn (or the next to join, if none is).
    pub(crate) fn pass_turn(&self) {
        let mut inner = self.queue.lock();
        let behind = inner
            .waiters
            .iter()
            .position(|w| w.ticket == self.ticket)
            .map(|i| i + 1);
        match behind.and_then(|i| inner.waiters.get_mut(i)) {
            Some(next) => next.give_turn(),
            None => inner.spare_turn = true,
        }
    }
}

impl Place {
    /// Leave with a slot. Another may be free too (`room`: replicas had room
    /// after this one took its slot): the oldest waiter looks next.
    pub(crate) fn leave_with_slot(mut self, room: bool) {
        self.leave(room);
    }

    fn leave(&mut self, room: bool) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        let mut inner = self.queue.lock();
        let mut unused_turn = false;
        if let Some(i) = inner.waiters.iter().position(|w| w.ticket == self.ticket)
            && let Some(w) = inner.waiters.remove(i)
        {
            unused_turn = w.turn;
        }
        if inner.waiters.is_empty() {
            inner.spare_turn = false;
        }
        self.queue.len.store(inner.waiters.len(), Ordering::SeqCst);
        // A turn given to this waiter that it will not use (a slot freed while
        // it looked, or passed to it) goes to the oldest waiter left.
        if (unused_turn || room)
            && let Some(first) = inner.waiters.front_mut()
        {
            first.give_turn();
        }
    }
}

impl Drop for Place {
    /// Leave without a slot (given up, or the route closed).
    fn drop(&mut self) {
        self.leave(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_join_holds_the_turn_and_hands_it_on_when_it_leaves() {
        let q = Arc::new(WaitQueue::default());
        let a = q.join(10).unwrap();
        let b = q.join(10).unwrap();
        assert_eq!(q.len(), 2);
        assert!(a.take_turn());
        assert!(!a.take_turn(), "a turn is taken once");
        assert!(!b.take_turn(), "the newer waiter waits");
        q.slot_freed();
        assert!(!b.take_turn(), "a freed slot goes to the oldest");
        assert!(a.take_turn());
        a.leave_with_slot(false);
        assert_eq!(q.len(), 1);
        assert!(!b.take_turn(), "no slot left: the next sleeps on");
        let c = q.join(10).unwrap();
        b.leave_with_slot(true);
        assert!(c.take_turn(), "a slot left: the next looks");
    }

    #[test]
    fn a_waiter_that_gives_up_hands_on_a_turn_it_did_not_use() {
        let q = Arc::new(WaitQueue::default());
        let a = q.join(10).unwrap();
        let b = q.join(10).unwrap();
        assert!(a.take_turn());
        drop(a);
        assert!(!b.take_turn(), "a turn it used is not handed on");
        let c = q.join(10).unwrap();
        q.slot_freed();
        drop(b);
        assert!(c.take_turn(), "the freed slot's turn is");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_declined_waiter_passes_the_turn_back_to_front() {
        let q = Arc::new(WaitQueue::default());
        let a = q.join(10).unwrap();
        let b = q.join(10).unwrap();
        assert!(a.take_turn());
        a.pass_turn();
        assert!(b.take_turn());
        b.pass_turn();
        let c = q.join(10).unwrap();
        assert!(c.take_turn(), "the spare turn goes to the next to join");
        let d = q.join(10).unwrap();
        assert!(!d.take_turn(), "and only to it");
    }

    #[test]
    fn a_full_queue_refuses_and_says_how_many_wait() {
        let q = Arc::new(WaitQueue::default());
        let _a = q.join(1).unwrap();
        assert_eq!(q.join(1).unwrap_err().waiting, 1);
        assert_eq!(q.len(), 1);
    }
}
