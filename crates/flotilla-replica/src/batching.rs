//! One replica's batcher (Ray's `_BatchQueue`): requests that reach a batched
//! deployment's replica wait here, are gathered into batches and handed to the
//! batch handler in one call each.
//!
//! Ray's rules, reproduced:
//! - a batch forms from the first waiting request: it is handed over as soon
//!   as `max_batch_size` requests are in it, or `batch_wait_timeout` after that
//!   first one was taken, whichever is first (one deadline, never extended);
//! - the settings are read when a batch starts forming, so a change applies
//!   from the next batch (batching turned off in place, a Flotilla knob Ray's
//!   code-only `@serve.batch` lacks, sends the batch forming at once: no
//!   request can join it any more);
//! - forming goes on while earlier batches wait for one of the
//!   `max_concurrent_batches` places; waiting batches start in order (a
//!   limit raised in place starts as many as it allows when a batch is
//!   formed or one ends);
//! - a multiplexed deployment's batch is split by model id, in order of each
//!   id's first appearance, and the parts run together in the batch's place;
//! - results go back by position; an error goes to every request of the
//!   (part of the) batch, except one that failed on its own before it (it
//!   did not decode), which keeps its error.
//!
//! Departing from Ray, a caller that gave up is dropped when the batch forms
//! as well as when it starts, so it takes no place in a batch, and from the
//! batches still waiting whenever another is formed, so they do not grow with
//! callers who left behind a slow handler. And a replica that drains (it
//! stopped taking requests) sends what forms at once, where Ray's batch waits
//! out its timeout for requests that cannot come, and a timeout longer than
//! the graceful shutdown's kills the replica with the batch unsent.
//!
//! The batcher is one small task per replica, started by the replica's first
//! batched request and ended with the replica (its endpoint dropped or
//! killed): it sleeps on its queue and on the batch deadline, never polls.
//! A waiting request keeps its caller's `max_ongoing_requests` slot, so it
//! counts as load for routing and autoscaling.

use std::{
    collections::VecDeque,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use flotilla_core::{AppName, DeploymentName};
use futures::FutureExt;
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tracing::Instrument;

use crate::{
    BatchStats, CallError, ReplicaId,
    settings::Settings,
    user::{BatchError, BatchFailure, ErasedDeployment},
};

/// What one waiting caller gets back.
type Reply = oneshot::Sender<Result<Vec<u8>, CallError>>;

/// One request waiting for its batch.
struct Entry {
    bytes: Vec<u8>,
    model_id: Option<Arc<str>>,
    reply: Reply,
    /// Counts it in the batcher's queue length until the forming task takes
    /// it (Ray's `qsize`: the batch forming and the batches waiting for a
    /// place are not in it), or it is dropped first.
    queued: Option<Queued>,
}

/// One request counted in [`BatchStats::queued`] while it lives.
struct Queued(Arc<BatchStats>);

impl Queued {
    fn new(stats: &Arc<BatchStats>) -> Queued {
        stats.queue();
        Queued(stats.clone())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.dequeue();
    }
}

impl Entry {
    /// Its caller gave up (dropped the call, or timed out).
    fn gone(&self) -> bool {
        self.reply.is_closed()
    }

    /// The forming task took it off the queue.
    fn taken(mut self) -> Entry {
        self.queued = None;
        self
    }
}

/// Batches formed but not started, and how many run.
#[derive(Default)]
struct Exec {
    running: u32,
    waiting: VecDeque<Vec<Entry>>,
}

/// What the forming task and the batch tasks share.
struct Shared {
    user: Arc<dyn ErasedDeployment>,
    settings: Arc<Settings>,
    app: AppName,
    deployment: DeploymentName,
    replica: ReplicaId,
    stats: Arc<BatchStats>,
    exec: Mutex<Exec>,
    closed: watch::Sender<bool>,
    /// The replica stopped taking requests (it drains): a batch goes as soon
    /// as it holds what has come, without waiting out its timeout.
    draining: watch::Sender<bool>,
    /// The replica's batcher span (no parent: not the first caller's): the
    /// forming task and the batches run in it, each batch in a `batch` span.
    span: tracing::Span,
}

impl Shared {
    fn exec(&self) -> MutexGuard<'_, Exec> {
        self.exec.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn killed(&self) -> CallError {
        CallError::Killed {
            replica: self.replica.to_string(),
        }
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

/// One replica's batcher: the sending side of its queue.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Entry>,
    shared: Arc<Shared>,
}

impl Batcher {
    /// Start the forming task for a replica running `user`.
    pub(crate) fn start(
        home: &crate::home::Home,
        user: Arc<dyn ErasedDeployment>,
        settings: Arc<Settings>,
        app: AppName,
        deployment: DeploymentName,
        replica: ReplicaId,
    ) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        let span = tracing::info_span!(parent: None, "batcher", app = %app,
            deployment = %deployment, replica = %replica);
        let shared = Arc::new(Shared {
            user,
            settings,
            app,
            deployment,
            replica,
            stats: Arc::new(BatchStats::default()),
            exec: Mutex::new(Exec::default()),
            closed: watch::Sender::new(false),
            draining: watch::Sender::new(false),
            span: span.clone(),
        });
        home.spawn(form(shared.clone(), rx).instrument(span));
        Batcher { queue, shared }
    }

    /// Wait for a place in a batch and for the batch's answer to this request.
    pub(crate) async fn submit(
        &self,
        bytes: Vec<u8>,
        model_id: Option<Arc<str>>,
    ) -> Result<Vec<u8>, CallError> {
        if self.shared.is_closed() {
            return Err(self.shared.killed());
        }
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            bytes,
            model_id,
            reply,
            queued: Some(Queued::new(&self.shared.stats)),
        };
        if self.queue.send(entry).is_err() {
            return Err(self.shared.killed());
        }
        answer.await.unwrap_or_else(|_| Err(self.shared.killed()))
    }

    /// Its figures (`ray_serve_batch_*`).
    pub(crate) fn stats(&self) -> &BatchStats {
        &self.shared.stats
    }

    /// The replica drains: what forms goes at once, with what has come,
    /// rather than waiting for more requests that will not come (a stopping
    /// replica takes none) until the batch's timeout.
    pub(crate) fn drain(&self) {
        self.shared.draining.send_replace(true);
    }

    /// The replica is gone: fail what waits, cut what runs, end the task.
    pub(crate) fn close(&self) {
        self.shared.closed.send_replace(true);
    }
}

/// The forming task: one batch after another, until the replica ends.
async fn form(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Entry>) {
    let mut closed = shared.closed.subscribe();
    let mut draining = shared.draining.subscribe();
    let mut settings = shared.settings.watch_batching();
    loop {
        let first = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => break,
            e = rx.recv() => match e {
                Some(e) => e.taken(),
                None => break,
            },
            // The limit may have been raised while batches wait and every
            // slot is theirs (so no request comes to form the next batch).
            Ok(()) = settings.changed() => {
                start_waiting(&shared, &mut shared.exec());
                continue;
            }
        };
        if first.gone() {
            continue;
        }
        // The settings of this batch, read as it starts (Ray's per-batch cache).
        let Some(config) = shared.settings.batching() else {
            // Batching was turned off while this request queued: it came in
            // batched, so it goes as a batch, of its own, at once.
            dispatch(&shared, vec![first]);
            continue;
        };
        let max = config.max_batch_size as usize;
        let wait = if *draining.borrow() {
            Duration::ZERO
        } else {
            config.batch_wait_timeout
        };
        let started = Instant::now();
        let deadline = started + wait;
        let mut batch = Vec::with_capacity(max.min(1024));
        batch.push(first);
        let sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(sleep);
        loop {
            if batch.len() >= max {
                // Full, unless callers left since they were taken: they take
                // no place (checked only when full, so forming stays O(max)).
                batch.retain(|e| !e.gone());
                if batch.len() >= max {
                    break;
                }
            }
            match rx.try_recv() {
                Ok(e) => {
                    if !e.gone() {
                        batch.push(e.taken());
                    }
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                biased;
                _ = closed.wait_for(|c| *c) => break,
                _ = draining.wait_for(|d| *d) => break,
                e = rx.recv() => match e {
                    Some(e) if !e.gone() => batch.push(e.taken()),
                    Some(_) => {}
                    None => break,
                },
                _ = &mut sleep => break,
                // This batch keeps the settings it started with, but a
                // limit raised in place has room for the waiting batches
                // now; and with batching turned off no request comes to
                // this one any more (they are served one by one), so it
                // goes at once, as a draining replica's does.
                Ok(()) = settings.changed() => {
                    start_waiting(&shared, &mut shared.exec());
                    if shared.settings.batching().is_none() {
                        break;
                    }
                }
            }
        }
        if shared.is_closed() {
            fail(&shared, batch);
            break;
        }
        shared.stats.formed(started.elapsed());
        dispatch(&shared, batch);
    }
    // Ended: nothing waiting is served any more.
    rx.close();
    while let Ok(e) = rx.try_recv() {
        let _ = e.reply.send(Err(shared.killed()));
    }
    let waiting: Vec<_> = shared.exec().waiting.drain(..).collect();
    for batch in waiting {
        fail(&shared, batch);
    }
}

fn fail(shared: &Shared, batch: Vec<Entry>) {
    for e in batch {
        let _ = e.reply.send(Err(shared.killed()));
    }
}

/// Queue a formed batch and start what the concurrency limit allows.
///
/// Callers who left batches still waiting are dropped first: each left its
/// `max_ongoing_requests` slot, so while the batches ahead run (a slow or
/// stuck handler) new requests keep coming, and what waits would otherwise
/// grow, payloads and all, with every caller that gives up.
fn dispatch(shared: &Arc<Shared>, batch: Vec<Entry>) {
    let mut exec = shared.exec();
    for waiting in &mut exec.waiting {
        waiting.retain(|e| !e.gone());
    }
    exec.waiting.retain(|b| !b.is_empty());
    exec.waiting.push_back(batch);
    start_waiting(shared, &mut exec);
}

/// Start waiting batches, oldest first, while fewer than the limit run.
fn start_waiting(shared: &Arc<Shared>, exec: &mut Exec) {
    let limit = shared.settings.max_concurrent_batches();
    while exec.running < limit {
        let Some(batch) = exec.waiting.pop_front() else {
            return;
        };
        exec.running += 1;
        tokio::spawn(run_batches(shared.clone(), batch).instrument(shared.span.clone()));
    }
}

/// Run `batch`, then the next waiting ones while the limit allows.
async fn run_batches(shared: Arc<Shared>, batch: Vec<Entry>) {
    let mut next = Some(batch);
    while let Some(batch) = next.take() {
        // The handler's own panics are its batch's error (`guarded`), and a
        // response's `Serialize` panic its request's (`serve_batch`); any
        // other must not end this task with its place among the running
        // batches still taken: its callers are answered as killed, and the
        // next batches run.
        if let Err(p) = AssertUnwindSafe(run_batch(&shared, batch))
            .catch_unwind()
            .await
        {
            tracing::error!(panic = %crate::user::panic_message(p),
                "a batch panicked outside its handler");
        }
        let mut exec = shared.exec();
        if exec.running <= shared.settings.max_concurrent_batches() {
            next = exec.waiting.pop_front();
        }
        if next.is_none() {
            exec.running -= 1;
        }
        // A limit raised in place has room for more waiting batches now.
        start_waiting(&shared, &mut exec);
    }
}

/// Run one formed batch: without the callers who left, split by model id for
/// a multiplexed deployment.
async fn run_batch(shared: &Shared, mut batch: Vec<Entry>) {
    batch.retain(|e| !e.gone());
    if batch.is_empty() {
        return;
    }
    if shared.is_closed() {
        fail(shared, batch);
        return;
    }
    if shared.user.models().is_none() {
        run_part(shared, None, batch).await;
        return;
    }
    let mut parts: Vec<(Option<Arc<str>>, Vec<Entry>)> = Vec::new();
    for e in batch {
        match parts.iter_mut().find(|(id, _)| *id == e.model_id) {
            Some((_, part)) => part.push(e),
            None => parts.push((e.model_id.clone(), vec![e])),
        }
    }
    futures::future::join_all(
        parts
            .into_iter()
            .map(|(id, part)| run_part(shared, id, part)),
    )
    .await;
}

/// Hand one batch (or one model's part of it) to the batch handler and give
/// every caller its answer.
async fn run_part(shared: &Shared, model_id: Option<Arc<str>>, part: Vec<Entry>) {
    let (requests, mut replies): (Vec<_>, Vec<_>) =
        part.into_iter().map(|e| (e.bytes, e.reply)).unzip();
    // As Ray: counted as it starts, its run timed however it ends.
    let size = requests.len();
    let max = shared
        .settings
        .batching()
        .map_or(size as u32, |c| c.max_batch_size);
    shared.stats.started(size, max);
    let began = Instant::now();
    let mut closed = shared.closed.subscribe();
    let span = tracing::info_span!(
        "batch",
        size = requests.len(),
        model_id = model_id.as_deref().unwrap_or("")
    );
    // Every caller gone (each dropped or timed out): the batch is cancelled,
    // as an unbatched handler is when its caller leaves, and so is the load
    // of its model a multiplexed one may wait for; the place it held frees.
    let all_left = futures::future::join_all(replies.iter_mut().map(|r| r.closed()));
    let result = tokio::select! {
        r = shared.user.handle_batch(model_id, requests).instrument(span) => Some(r),
        _ = closed.wait_for(|c| *c) => Some(Err(BatchError::Failed(shared.killed()).into())),
        _ = all_left => None,
    };
    shared.stats.ran(began.elapsed());
    let Some(result) = result else { return };
    match result {
        Ok(responses) => {
            for (reply, response) in replies.into_iter().zip(responses) {
                let _ = reply.send(response);
            }
        }
        Err(BatchFailure { error, own }) => {
            let error = match error {
                BatchError::Failed(e) => e,
                BatchError::Length { expected, got } => CallError::BatchSize {
                    app: shared.app.to_string(),
                    deployment: shared.deployment.to_string(),
                    requests: expected,
                    responses: got,
                },
            };
            // A request that failed on its own keeps its error.
            let mut own = own.into_iter();
            for reply in replies {
                let e = own.next().flatten().unwrap_or_else(|| error.clone());
                let _ = reply.send(Err(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::Ordering;

    use flotilla_core::BatchConfig;

    use super::*;
    use crate::{Deployment, UserError, user::Erased};

    /// Sums are the batches it saw; 999 fails its batch, 998 makes it answer
    /// one response too few, 996 never answers; every batch takes 10 ms.
    #[derive(Default)]
    struct Recorder {
        batches: Mutex<Vec<Vec<u32>>>,
        running: std::sync::atomic::AtomicU32,
        peak: std::sync::atomic::AtomicU32,
    }

    impl Deployment for Arc<Recorder> {
        type Request = u32;
        type Response = u32;
        const BATCHED: bool = true;
        async fn handle(&self, x: u32) -> Result<u32, UserError> {
            Ok(x)
        }
        async fn handle_batch(&self, xs: Vec<u32>) -> Result<Vec<u32>, UserError> {
            let n = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(n, Ordering::SeqCst);
            self.batches.lock().unwrap().push(xs.clone());
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if xs.contains(&996) {
                // Stuck for good (the place it holds too).
                std::future::pending::<()>().await;
            }
            if xs.contains(&999) {
                return Err(UserError::new("asked to fail"));
            }
            if xs.contains(&998) {
                return Ok(xs[1..].to_vec());
            }
            Ok(xs.into_iter().map(|x| x * 10).collect())
        }
    }

    fn batcher(config: BatchConfig) -> (Arc<Recorder>, Arc<Settings>, Arc<Batcher>) {
        let rec = Arc::new(Recorder::default());
        let settings = Arc::new(Settings::default());
        settings.set_batching(Some(config));
        let b = Batcher::start(
            &crate::home::Home::current(),
            Arc::new(Erased(rec.clone())),
            settings.clone(),
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
            ReplicaId(7),
        );
        (rec, settings, Arc::new(b))
    }

    fn submit(b: &Arc<Batcher>, x: u32) -> tokio::task::JoinHandle<Result<u32, CallError>> {
        let b = b.clone();
        tokio::spawn(async move {
            let bytes = rmp_serde::to_vec(&x).unwrap();
            b.submit(bytes, None)
                .await
                .map(|out| rmp_serde::from_slice(&out).unwrap())
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_the_rest_at_the_deadline() {
        let (rec, _, b) = batcher(BatchConfig::new(3, Duration::from_secs(10)));
        let calls: Vec<_> = (1..=5).map(|x| submit(&b, x)).collect();
        let t0 = Instant::now();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.unwrap().unwrap());
        }
        assert_eq!(out, [10, 20, 30, 40, 50]);
        assert_eq!(*rec.batches.lock().unwrap(), [vec![1, 2, 3], vec![4, 5]]);
        // The second batch waited for its deadline.
        assert!(t0.elapsed() >= Duration::from_secs(10));
    }

    /// Ray's batch figures: each batch counted as it starts (size, share of
    /// `max_batch_size`), its run timed however it ends (its callers all
    /// gone included), its wait from its first request; the queue empty once
    /// the forming task took every request.
    #[tokio::test(start_paused = true)]
    async fn batch_figures_count_every_batch_that_starts() {
        let (_, _, b) = batcher(BatchConfig::new(4, Duration::from_millis(100)));
        let calls: Vec<_> = (1..=4).map(|x| submit(&b, x)).collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        // A stuck batch whose one caller gives up.
        let stuck = submit(&b, 996);
        tokio::time::sleep(Duration::from_millis(150)).await;
        stuck.abort();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let s = b.stats();
        assert_eq!(s.processed(), 2);
        let size = s.size().snapshot();
        assert_eq!((size.count, size.sum), (2, 5.0));
        let utilization = s.utilization().snapshot();
        assert_eq!((utilization.count, utilization.sum), (2, 125.0));
        let wait = s.wait().snapshot();
        // The full one went at once, the lone one at its deadline.
        assert_eq!((wait.count, wait.sum), (2, 100.0));
        let ran = s.execution().snapshot();
        // 10 ms, then the stuck one until its caller left (50 ms).
        assert_eq!((ran.count, ran.sum), (2, 60.0));
        assert_eq!(s.queued(), 0);
    }

    /// A draining replica's forming batch goes with what it holds, and so
    /// does each later one: no request is coming to fill them, and waiting
    /// out their timeout would hold the replica's stop as long.
    #[tokio::test(start_paused = true)]
    async fn a_draining_replica_sends_its_forming_batch_at_once() {
        let (rec, _, b) = batcher(BatchConfig::new(8, Duration::from_secs(60)));
        let t0 = Instant::now();
        let calls = [submit(&b, 1), submit(&b, 2)];
        settle().await;
        assert!(rec.batches.lock().unwrap().is_empty(), "still forming");
        b.drain();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        // A request admitted before the stop, arriving after it.
        submit(&b, 3).await.unwrap().unwrap();
        assert_eq!(*rec.batches.lock().unwrap(), [vec![1, 2], vec![3]]);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    /// A caller that leaves while its batch forms frees its place in it: the
    /// next requests fill the batch, which goes at once.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_leaves_a_forming_batch_frees_its_place() {
        let (rec, _, b) = batcher(BatchConfig::new(2, Duration::from_secs(10)));
        let first = submit(&b, 1);
        settle().await;
        first.abort();
        settle().await;
        let t0 = Instant::now();
        let calls = [submit(&b, 2), submit(&b, 3)];
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(*rec.batches.lock().unwrap(), [vec![2, 3]]);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn max_concurrent_batches_bounds_running_batches_and_formation_goes_on() {
        let (rec, settings, b) =
            batcher(BatchConfig::new(2, Duration::ZERO).with_max_concurrent_batches(2));
        let calls: Vec<_> = (0..12).map(|x| submit(&b, x)).collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(rec.peak.load(Ordering::SeqCst), 2);
        // Raised in place: from the next batches.
        settings.set_batching(Some(
            BatchConfig::new(2, Duration::ZERO).with_max_concurrent_batches(4),
        ));
        let calls: Vec<_> = (0..16).map(|x| submit(&b, x)).collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(rec.peak.load(Ordering::SeqCst), 4);
    }

    /// A limit raised in place starts the batches already waiting at once:
    /// not when a running one ends, nor when the next request comes (with
    /// every slot held by waiting batches, none may come).
    #[tokio::test(start_paused = true)]
    async fn a_raised_limit_starts_the_batches_already_waiting() {
        let (rec, settings, b) = batcher(BatchConfig::new(1, Duration::ZERO));
        let calls: Vec<_> = (0..4).map(|x| submit(&b, x)).collect();
        settle().await;
        assert_eq!(b.shared.exec().waiting.len(), 3);
        settings.set_batching(Some(
            BatchConfig::new(1, Duration::ZERO).with_max_concurrent_batches(4),
        ));
        settle().await;
        assert_eq!(b.shared.exec().waiting.len(), 0, "started at the change");
        let t0 = Instant::now();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(rec.peak.load(Ordering::SeqCst), 4);
        assert!(
            t0.elapsed() <= Duration::from_millis(10),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A running batch whose every caller gave up is cancelled: the place
    /// it held goes to the next batch (here, behind a handler that never
    /// answers).
    #[tokio::test(start_paused = true)]
    async fn a_running_batch_every_caller_left_is_cancelled_and_frees_its_place() {
        let (rec, _, b) = batcher(BatchConfig::new(1, Duration::ZERO));
        let stuck = {
            let b = b.clone();
            let bytes = rmp_serde::to_vec(&996u32).unwrap();
            tokio::time::timeout(Duration::from_millis(50), async move {
                b.submit(bytes, None).await
            })
        };
        assert!(stuck.await.is_err(), "the stuck batch's caller gave up");
        let next = tokio::time::timeout(Duration::from_secs(5), submit(&b, 7)).await;
        assert_eq!(next.expect("served").unwrap().unwrap(), 70);
        assert_eq!(rec.peak.load(Ordering::SeqCst), 1);
    }

    /// Callers who give up while their batches wait behind a stuck one do
    /// not pile up there.
    #[tokio::test(start_paused = true)]
    async fn callers_who_left_waiting_batches_do_not_pile_up_behind_a_stuck_one() {
        let (_, _, b) = batcher(BatchConfig::new(1, Duration::ZERO));
        let _stuck = submit(&b, 996);
        settle().await;
        for x in 0..100 {
            let b = b.clone();
            let bytes = rmp_serde::to_vec(&x).unwrap();
            let gave_up = tokio::time::timeout(Duration::from_millis(1), async move {
                b.submit(bytes, None).await
            })
            .await;
            assert!(gave_up.is_err());
        }
        settle().await;
        assert!(
            b.shared.exec().waiting.len() <= 1,
            "{}",
            b.shared.exec().waiting.len()
        );
    }

    /// A request that does not decode fails on its own, beside a batch
    /// that fails or answers the wrong number of responses.
    #[tokio::test(start_paused = true)]
    async fn an_undecodable_request_keeps_its_own_error_when_its_batch_fails() {
        let (_, _, b) = batcher(BatchConfig::new(2, Duration::from_millis(1)));
        for x in [999, 998] {
            let garbled = tokio::spawn({
                let b = b.clone();
                async move { b.submit(rmp_serde::to_vec("x").unwrap(), None).await }
            });
            let call = submit(&b, x);
            let e = garbled.await.unwrap().unwrap_err();
            assert!(matches!(e, CallError::BadRequest(_)), "{x}: {e}");
            let e = call.await.unwrap().unwrap_err();
            assert!(
                matches!(e, CallError::User(_) | CallError::BatchSize { .. }),
                "{x}: {e}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn errors_and_wrong_lengths_fail_the_whole_batch() {
        let (_, _, b) = batcher(BatchConfig::new(3, Duration::from_millis(1)));
        let calls: Vec<_> = [1, 999, 2].into_iter().map(|x| submit(&b, x)).collect();
        for c in calls {
            assert_eq!(
                c.await.unwrap().unwrap_err(),
                CallError::User("asked to fail".into())
            );
        }
        let calls: Vec<_> = [1, 998].into_iter().map(|x| submit(&b, x)).collect();
        for c in calls {
            let e = c.await.unwrap().unwrap_err();
            assert!(
                matches!(
                    e,
                    CallError::BatchSize {
                        requests: 2,
                        responses: 1,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(
                e.to_string().contains("deployment 'd' of application 'a'"),
                "{e}"
            );
        }
    }

    /// A batch handler written as a plain `fn`: it panics on 997 before it
    /// returns its future.
    struct Hasty;

    impl Deployment for Hasty {
        type Request = u32;
        type Response = u32;
        const BATCHED: bool = true;
        async fn handle(&self, x: u32) -> Result<u32, UserError> {
            Ok(x)
        }
        #[allow(clippy::manual_async_fn)]
        fn handle_batch(
            &self,
            xs: Vec<u32>,
        ) -> impl Future<Output = Result<Vec<u32>, UserError>> + Send {
            assert!(!xs.contains(&997), "asked to panic at once");
            async move { Ok(xs) }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_panics_before_its_future_fails_its_batch_and_the_next_runs() {
        let settings = Arc::new(Settings::default());
        settings.set_batching(Some(BatchConfig::new(2, Duration::from_millis(1))));
        let b = Arc::new(Batcher::start(
            &crate::home::Home::current(),
            Arc::new(Erased(Hasty)),
            settings,
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
            ReplicaId(7),
        ));
        let first = submit(&b, 997).await.unwrap().unwrap_err();
        assert_eq!(
            first,
            CallError::Panicked("asked to panic at once".into()),
            "{first}"
        );
        // The batcher's place for it was given back (with the default one
        // batch at a time, a lost place stalled every later batch).
        let next = tokio::time::timeout(Duration::from_secs(60), submit(&b, 5))
            .await
            .expect("the next batch ran");
        assert_eq!(next.unwrap().unwrap(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_leaves_is_not_in_the_batch_and_close_fails_the_rest() {
        let (rec, _, b) = batcher(BatchConfig::new(3, Duration::from_millis(50)));
        let leaver = submit(&b, 1);
        let stayer = submit(&b, 2);
        settle().await;
        leaver.abort();
        assert!(leaver.await.is_err());
        assert_eq!(stayer.await.unwrap().unwrap(), 20);
        assert_eq!(*rec.batches.lock().unwrap(), [vec![2]]);
        let waiting = submit(&b, 3);
        settle().await;
        b.close();
        assert!(matches!(
            waiting.await.unwrap(),
            Err(CallError::Killed { .. })
        ));
        assert!(matches!(
            submit(&b, 4).await.unwrap(),
            Err(CallError::Killed { .. })
        ));
    }
}
