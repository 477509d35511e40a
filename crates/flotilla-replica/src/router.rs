//! Request routers: which replica takes a request (Ray's `RequestRouter`).
//!
//! A router is a [`RequestRouter`]: given the candidate replicas (each with its
//! in-flight count, limit, node and loaded model ids, read from its
//! [`ReplicaEndpoint`]) and the request (its model id, the caller's preferred
//! node, a random number), it picks one, or none to wait for a free slot. The
//! built-in routers are implementations like any other:
//! [`PowerOfTwoChoicesRouter`] (model-blind) and [`MultiplexedRouter`] (prefers
//! replicas holding the request's model, then those holding the fewest models,
//! then falls back to another router).
//! Ray's default router class is the multiplexed one over power of two choices
//! ([`default_router`]), as Ray's `PowerOfTwoChoicesRequestRouter` carries its
//! `MultiplexMixin`.
//!
//! A custom router is registered under an import path with
//! [`Registry::register_request_router`](crate::Registry::register_request_router)
//! and named by a deployment's `request_router_config.request_router_class`;
//! its `request_router_kwargs` reach its factory. A pick reads atomics and the
//! replicas' published model ids, and allocates nothing.

use std::sync::Arc;

use crate::ReplicaEndpoint;

/// What a router knows of one request.
#[derive(Debug, Clone, Copy)]
pub struct RoutingRequest<'a> {
    model_id: Option<&'a str>,
    preferred_node: Option<&'a str>,
    random: u64,
}

impl<'a> RoutingRequest<'a> {
    /// A request without a model id or a preferred node; `random` seeds the
    /// router's choices (the handle draws one per pick).
    pub fn new(random: u64) -> Self {
        RoutingRequest {
            model_id: None,
            preferred_node: None,
            random,
        }
    }

    /// The same request for model `model_id`.
    pub fn with_model_id(mut self, model_id: Option<&'a str>) -> Self {
        self.model_id = model_id;
        self
    }

    /// The same request from a caller that prefers replicas on `node`.
    pub fn with_preferred_node(mut self, node: Option<&'a str>) -> Self {
        self.preferred_node = node;
        self
    }

    /// The model the request is for (a handle's `with_model_id`, or the
    /// `serve_multiplexed_model_id` HTTP header).
    pub fn model_id(&self) -> Option<&'a str> {
        self.model_id
    }

    /// The node the caller runs on, when it prefers replicas there (calls made
    /// from inside a deployment).
    pub fn preferred_node(&self) -> Option<&'a str> {
        self.preferred_node
    }

    /// A random number drawn for this pick.
    pub fn random(&self) -> u64 {
        self.random
    }
}

/// Picks the replica for a request (Ray's `RequestRouter.choose_replicas`).
///
/// `replicas` are the deployment's running replicas, never empty. Return the
/// index of the one to use, or `None` to wait until a slot frees or the set
/// changes (then the router is asked again). A replica without room
/// ([`ReplicaEndpoint::has_room`]) refuses the request, and the router is asked
/// again at once (a few times) before the request waits. Called on every
/// request: it should read what it needs and allocate nothing.
///
/// ```
/// use std::sync::Arc;
/// use flotilla_replica::{ReplicaEndpoint, RequestRouter, RoutingRequest};
/// /// Always the least loaded replica with room.
/// struct LeastLoaded;
/// impl RequestRouter for LeastLoaded {
///     fn choose(&self, _req: &RoutingRequest<'_>, replicas: &[Arc<ReplicaEndpoint>]) -> Option<usize> {
///         (0..replicas.len())
///             .filter(|&i| replicas[i].has_room())
///             .min_by_key(|&i| replicas[i].in_flight())
///     }
/// }
/// ```
pub trait RequestRouter: Send + Sync + 'static {
    /// The index in `replicas` of the replica for `request`, or `None` to wait.
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize>;
}

impl<R: RequestRouter + ?Sized> RequestRouter for Box<R> {
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        (**self).choose(request, replicas)
    }
}

impl<R: RequestRouter + ?Sized> RequestRouter for Arc<R> {
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        (**self).choose(request, replicas)
    }
}

/// Power of two choices (Ray's default routing): sample two replicas with
/// room, take the less loaded. A caller that prefers a node gets one of that
/// node's replicas while one of them has room.
#[derive(Debug, Clone, Copy, Default)]
pub struct PowerOfTwoChoicesRouter;

impl RequestRouter for PowerOfTwoChoicesRouter {
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        if let Some(node) = request.preferred_node()
            && let Some(i) = power_of_two_choices(replicas, request.random(), |e| e.node() == node)
        {
            return Some(i);
        }
        power_of_two_choices(replicas, request.random(), |_| true)
    }
}

/// Model-aware routing (Ray's `MultiplexMixin`): a request with a model id
/// goes to a replica that has the model loaded (or loading), by power of two
/// choices among those with room; when none of those has room (or none holds
/// the model), to one of the replicas with room that hold the fewest models
/// (loaded or loading), so that a new model lands where it evicts least (Ray's
/// `_get_replica_ids_with_fewest_multiplexed_models`). Among those, unlike
/// Ray (which draws at random), the one whose next victim (its least
/// recently used model) has been used least lately, by uses weighted by age:
/// a full deployment evicts its least used model, as one frequency-aware
/// cache would, instead of some replica's, and a model that a single request
/// brought in goes first (power of two choices when a candidate is in
/// another process and cannot tell).
/// A request without a model id, or for a deployment that is not
/// multiplexed, is the `fallback` router's.
///
/// Unlike Ray, a request never waits for a busy holder of its model (Ray
/// backs off for up to `RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S`
/// before trying the rest): it goes elsewhere at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct MultiplexedRouter<F = PowerOfTwoChoicesRouter> {
    fallback: F,
}

impl<F: RequestRouter> MultiplexedRouter<F> {
    /// Prefer replicas holding the model, else ask `fallback`.
    pub fn new(fallback: F) -> Self {
        MultiplexedRouter { fallback }
    }
}

impl<F: RequestRouter> RequestRouter for MultiplexedRouter<F> {
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        if let Some(id) = request.model_id() {
            if let Some(i) = power_of_two_choices(replicas, request.random(), |e| e.has_model(id)) {
                return Some(i);
            }
            let fewest = replicas
                .iter()
                .filter(|e| e.is_multiplexed() && e.has_room())
                .map(|e| e.model_count())
                .min();
            if let Some(fewest) = fewest {
                let eligible =
                    |e: &ReplicaEndpoint| e.is_multiplexed() && e.model_count() == fewest;
                if let Some(i) = coldest(replicas, request.random(), eligible).or_else(|| {
                    power_of_two_choices(replicas, request.random().rotate_left(29), eligible)
                }) {
                    return Some(i);
                }
            }
        }
        self.fallback.choose(request, replicas)
    }
}

/// Among the replicas with room that `eligible` accepts, the one whose least
/// recently used model is coldest, by its heat (uses weighted by age; ties:
/// the less loaded, then from a place drawn with `random`), so that a new
/// model evicts the deployment's least used model, not one a replica happens
/// to use least. `None` if none qualifies or one of them cannot tell (a
/// replica in another process).
fn coldest(
    replicas: &[Arc<ReplicaEndpoint>],
    random: u64,
    eligible: impl Fn(&ReplicaEndpoint) -> bool,
) -> Option<usize> {
    let n = replicas.len();
    let start = (random % n.max(1) as u64) as usize;
    let mut best: Option<(f64, u32, usize)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        let e = &replicas[i];
        if !(e.has_room() && eligible(e)) {
            continue;
        }
        let key = (e.coldest_model_heat()?, e.in_flight(), i);
        let colder = |b: &(f64, u32, usize)| {
            key.0.total_cmp(&b.0).then(key.1.cmp(&b.1)) == std::cmp::Ordering::Less
        };
        if best.as_ref().is_none_or(colder) {
            best = Some(key);
        }
    }
    best.map(|(_, _, i)| i)
}

/// The router Ray's default class names: [`MultiplexedRouter`] over
/// [`PowerOfTwoChoicesRouter`].
pub fn default_router() -> Arc<dyn RequestRouter> {
    Arc::new(MultiplexedRouter::new(PowerOfTwoChoicesRouter))
}

/// Power of two choices among the replicas that have room and that `eligible`
/// accepts: two of them drawn with `random`, the less loaded taken; `None` if
/// none qualifies. Allocates nothing: a first draw among all replicas usually
/// decides; otherwise the qualifying ones are counted and drawn from by rank.
pub fn power_of_two_choices(
    replicas: &[Arc<ReplicaEndpoint>],
    random: u64,
    eligible: impl Fn(&ReplicaEndpoint) -> bool,
) -> Option<usize> {
    let ok = |i: usize| replicas[i].has_room() && eligible(&replicas[i]);
    let better = |a: usize, b: usize| {
        if replicas[b].in_flight() < replicas[a].in_flight() {
            b
        } else {
            a
        }
    };
    let n = replicas.len();
    let (i, j) = two_of(n, random)?;
    match (ok(i), j.is_some_and(ok)) {
        (true, true) => return j.map(|j| better(i, j)),
        (true, false) => return Some(i),
        (false, true) => return j,
        (false, false) => {}
    }
    // Both draws missed: draw among the qualifying ones by rank.
    let nth = |k: usize| (0..n).filter(|&x| ok(x)).nth(k);
    let count = (0..n).filter(|&x| ok(x)).count();
    let (a, b) = two_of(count, random.rotate_left(17))?;
    match (nth(a), b.and_then(nth)) {
        (Some(x), Some(y)) => Some(better(x, y)),
        (Some(x), None) | (None, Some(x)) => Some(x),
        (None, None) => nth(0),
    }
}

/// Two distinct indices below `n` from `random` (the second `None` if `n` is
/// 1); `None` if `n` is 0.
fn two_of(n: usize, random: u64) -> Option<(usize, Option<usize>)> {
    match n {
        0 => None,
        1 => Some((0, None)),
        n => {
            let i = (random % n as u64) as usize;
            let mut j = ((random >> 32) % (n as u64 - 1)) as usize;
            if j >= i {
                j += 1;
            }
            Some((i, Some(j)))
        }
    }
}

/// Why a deployment's router could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// Nothing is registered under the class's import path.
    #[error(
        "no request router is registered under import path '{path}' (register it with \
         Registry::register_request_router, or name Ray's default router)"
    )]
    NotRegistered {
        /// The import path.
        path: String,
    },
    /// The router's factory refused its `request_router_kwargs`.
    #[error("request router '{path}' refused its request_router_kwargs: {message}")]
    Kwargs {
        /// The import path.
        path: String,
        /// The factory's error.
        message: String,
    },
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::endpoint::{test_endpoint, test_multiplexed_endpoint};

    #[test]
    fn two_of_draws_distinct_indices() {
        assert_eq!(two_of(0, 5), None);
        assert_eq!(two_of(1, 5), Some((0, None)));
        for r in 0..1_000u64 {
            let r = r.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let (i, j) = two_of(5, r).unwrap();
            let j = j.unwrap();
            assert!(i < 5 && j < 5 && i != j);
        }
    }

    #[tokio::test]
    async fn power_of_two_choices_takes_the_less_loaded_and_skips_full_replicas() {
        let eps: Vec<_> = (0..2).map(|i| test_endpoint(i, "n1", 2, &[])).collect();
        let _held = eps[0].try_acquire().unwrap();
        for r in 0..50u64 {
            let req = RoutingRequest::new(r.wrapping_mul(0x2545_F491_4F6C_DD1D));
            assert_eq!(PowerOfTwoChoicesRouter.choose(&req, &eps), Some(1));
        }
        // Full everywhere: wait.
        let _more = [
            eps[0].try_acquire().unwrap(),
            eps[1].try_acquire().unwrap(),
            eps[1].try_acquire().unwrap(),
        ];
        assert_eq!(
            PowerOfTwoChoicesRouter.choose(&RoutingRequest::new(1), &eps),
            None
        );
    }

    #[tokio::test]
    async fn a_preferred_node_wins_while_it_has_room() {
        let eps: Vec<_> = [("a", 1), ("b", 1), ("b", 1)]
            .iter()
            .enumerate()
            .map(|(i, (node, max))| test_endpoint(i as u64, node, *max, &[]))
            .collect();
        for r in 0..50u64 {
            let req = RoutingRequest::new(r * 7919).with_preferred_node(Some("a"));
            assert_eq!(PowerOfTwoChoicesRouter.choose(&req, &eps), Some(0));
        }
        let _held = eps[0].try_acquire().unwrap();
        let req = RoutingRequest::new(3).with_preferred_node(Some("a"));
        assert!(matches!(
            PowerOfTwoChoicesRouter.choose(&req, &eps),
            Some(1 | 2)
        ));
    }

    #[tokio::test]
    async fn the_multiplexed_router_prefers_the_replica_with_the_model_then_falls_back() {
        let eps: Vec<_> = [&["m1"][..], &["m2"], &[]]
            .iter()
            .enumerate()
            .map(|(i, models)| test_multiplexed_endpoint(i as u64, "n", 1, models))
            .collect();
        let router = MultiplexedRouter::new(PowerOfTwoChoicesRouter);
        for r in 0..50u64 {
            let req = RoutingRequest::new(r * 104_729).with_model_id(Some("m2"));
            assert_eq!(router.choose(&req, &eps), Some(1));
        }
        // The holder is full: the replica with the fewest models.
        let _held = eps[1].try_acquire().unwrap();
        for r in 0..50u64 {
            let req = RoutingRequest::new(r * 104_729).with_model_id(Some("m2"));
            assert_eq!(router.choose(&req, &eps), Some(2));
        }
        // No model id: model-blind.
        assert!(router.choose(&RoutingRequest::new(9), &eps).is_some());
    }

    #[tokio::test]
    async fn a_new_model_evicts_the_deployments_least_used_model() {
        // Three full replicas: the new model goes where the least recently
        // used model has been used least lately.
        let eps: Vec<_> = [&["a", "b"][..], &["c", "d"], &["e", "f"]]
            .iter()
            .enumerate()
            .map(|(i, models)| test_multiplexed_endpoint(i as u64, "n", 1, models))
            .collect();
        for (ep, used) in eps.iter().zip([7, 3, 9]) {
            ep.set_coldest_model_uses(&[used]);
        }
        let router = MultiplexedRouter::new(PowerOfTwoChoicesRouter);
        let pick = |r: u64| {
            let req = RoutingRequest::new(r.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .with_model_id(Some("new"));
            router.choose(&req, &eps)
        };
        for r in 0..50u64 {
            assert_eq!(pick(r), Some(1));
        }
        // The coldest has no room: the next coldest.
        let held = eps[1].try_acquire().unwrap();
        for r in 0..50u64 {
            assert_eq!(pick(r), Some(0));
        }
        drop(held);
        // Used often a little earlier outranks used once a little later:
        // replica 1's victim served ten requests up to tick 100, replica 2's
        // one at tick 200 (the last use alone would pick replica 1).
        eps[1].set_coldest_model_uses(&(91..=100).collect::<Vec<_>>());
        eps[2].set_coldest_model_uses(&[200]);
        eps[0].set_coldest_model_uses(&(191..=200).collect::<Vec<_>>());
        for r in 0..50u64 {
            assert_eq!(pick(r), Some(2));
        }
    }

    #[tokio::test]
    async fn a_new_model_goes_to_a_replica_with_the_fewest_models_that_has_room() {
        let eps: Vec<_> = [&["a", "b"][..], &["c"], &["d"], &["e", "f"]]
            .iter()
            .enumerate()
            .map(|(i, models)| test_endpoint(i as u64, "n", 1, models))
            .collect();
        let router = MultiplexedRouter::new(PowerOfTwoChoicesRouter);
        let pick = |r: u64| {
            let req = RoutingRequest::new(r.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .with_model_id(Some("new"));
            router.choose(&req, &eps)
        };
        let mut seen = [false; 4];
        for r in 0..100u64 {
            let i = pick(r).unwrap();
            assert!(matches!(i, 1 | 2), "{i}");
            seen[i] = true;
        }
        // Both of the fewest are drawn from.
        assert!(seen[1] && seen[2]);
        // Those full: the fewest among the replicas with room.
        let _held = [eps[1].try_acquire().unwrap(), eps[2].try_acquire().unwrap()];
        for r in 0..50u64 {
            assert!(matches!(pick(r), Some(0 | 3)));
        }
        // Not multiplexed: the fallback's (the model id is ignored).
        let plain: Vec<_> = (0..2).map(|i| test_endpoint(i, "n", 1, &[])).collect();
        let req = RoutingRequest::new(5).with_model_id(Some("m"));
        assert!(router.choose(&req, &plain).is_some());
    }
}
