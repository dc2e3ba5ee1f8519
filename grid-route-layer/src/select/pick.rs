//! The default choice among candidates, as plain code.

use std::sync::Arc;
use std::time::Instant;

use crate::grid::Cluster;

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
