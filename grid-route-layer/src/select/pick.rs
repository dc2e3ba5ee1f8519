//! The default choice among candidates, as plain code.

use std::sync::Arc;
use std::time::Instant;

use crate::grid::{Cluster, InFlight};
use crate::keying::PrefixKeys;
use crate::route::{Placed, PredictedMatch};

/// The least loaded of `candidates` at `now`: the lowest
/// [`routing_load`](crate::grid::ClusterLoad::routing_load) (the windowed worst queue depth,
/// plus the requests in flight when the grid counts them), then the fewest requests in
/// flight from this replica; among clusters equal on both, the
/// `turn`-th (modulo their number), so that a caller passing a rotating counter spreads
/// ties evenly. `None` when there is no candidate.
///
/// Unmeasured clusters (`+inf`) tie with each other and lose to any measured one.
pub fn least_loaded<'a>(
    candidates: impl IntoIterator<Item = &'a Arc<Cluster>>,
    now: Instant,
    turn: usize,
) -> Option<&'a Arc<Cluster>> {
    let loads: Vec<(f64, usize, &Arc<Cluster>)> = candidates
        .into_iter()
        .map(|c| {
            let (load, in_flight) = load_rank(c, now);
            (load, in_flight, c)
        })
        .collect();
    let (queue, in_flight) = loads
        .iter()
        .map(|&(q, n, _)| (q, n))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))?;
    let is_best =
        |&&(q, n, _): &&(f64, usize, &Arc<Cluster>)| q.total_cmp(&queue).is_eq() && n == in_flight;
    let best = loads.iter().filter(is_best).count();
    loads
        .iter()
        .filter(is_best)
        .nth(turn % best)
        .map(|&(_, _, c)| c)
}

/// What [`least_loaded`] ranks a cluster by at `now`, lowest first (compare the load with
/// `total_cmp`): its routing load, then its requests in flight from this replica.
pub(crate) fn load_rank(cluster: &Cluster, now: Instant) -> (f64, usize) {
    let load = cluster.load();
    (load.routing_load(now), load.in_flight())
}

/// Counts a request sent to `cluster` at `now` in its load, as [`Select`](super::Select)
/// does: takes over the count affinity took when it `placed` the request there
/// ([`Placed::take_for`]), else starts one with `prefill` bytes waiting for the first
/// token. Returns the cluster's routing load just before the request counted (what its
/// time to first token is learned against) and the count.
pub fn count_in_flight(
    cluster: &Cluster,
    placed: Option<&Placed>,
    prefill: u64,
    now: Instant,
) -> (f64, InFlight) {
    placed
        .and_then(|placed| placed.take_for(cluster.id()))
        .unwrap_or_else(|| {
            let load = cluster.load().routing_load(now);
            (load, cluster.load().start_request_prefilling(prefill))
        })
}

/// The prompt bytes a request is sent to prefill, as [`Select`](super::Select) counts them
/// in its cluster's [`prefill_waiting_bytes`](crate::grid::ClusterLoad::prefill_waiting_bytes)
/// until its first token: what its `keys` cover, less what affinity `predicted` the serving
/// cluster holds of it; 0 for a request without keys.
///
/// ```
/// use grid_route_layer::keying::PrefixKeys;
/// use grid_route_layer::route::PredictedMatch;
/// use grid_route_layer::select::prefill_bytes;
///
/// // A prompt of ten 256-byte blocks, four of them held where it goes.
/// let digests: Vec<u64> = (0..10).collect();
/// let keys = PrefixKeys::from_block_digests(&digests).unwrap();
/// assert_eq!(prefill_bytes(Some(&keys), None), 2_560);
/// let held = PredictedMatch::new(4, keys.covered_bytes(4));
/// assert_eq!(prefill_bytes(Some(&keys), Some(&held)), 2_560 - 1_024);
/// assert_eq!(prefill_bytes(None, None), 0);
/// ```
pub fn prefill_bytes(keys: Option<&PrefixKeys>, predicted: Option<&PredictedMatch>) -> u64 {
    keys.map_or(0, |keys| {
        keys.total_covered_bytes()
            .saturating_sub(predicted.map_or(0, PredictedMatch::covered_bytes))
    })
}
