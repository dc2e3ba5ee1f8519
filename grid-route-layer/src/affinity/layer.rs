//! [`AffinityLayer`]: wraps a balancer in [`AffinityService`].

use tower::Layer;

use super::decide::Affinity;
use super::service::AffinityService;
use crate::grid::Grid;

/// Narrows each request's admitted candidates to the clusters that hold its prompt, and
/// writes them as the [`Candidates`](crate::route::Candidates) request extension for the
/// balancer inside. See the [module docs](super).
#[derive(Debug, Clone)]
pub struct AffinityLayer {
    grid: Grid,
    affinity: Affinity,
}

impl AffinityLayer {
    /// Affinity over `grid`, with the index and settings of `affinity` (keep a clone of
    /// it to reload settings).
    pub fn new(grid: Grid, affinity: Affinity) -> Self {
        Self { grid, affinity }
    }
}

impl<S> Layer<S> for AffinityLayer {
    type Service = AffinityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AffinityService::new(inner, self.grid.clone(), self.affinity.clone())
    }
}
