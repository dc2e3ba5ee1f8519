//! `least-queue`: what the gateway's `Select` does without affinity — the least windowed
//! worst queue, then the fewest requests in flight from this replica, then in turn; p2c
//! inside the cluster. The same library code as `grid-route`, minus the decision.

use super::gateway::{Gateways, MODEL};
use super::{Route, Router, Setup};
use crate::engine::Engine;

pub(super) struct LeastQueue {
    gateways: Gateways,
}

impl LeastQueue {
    pub(super) fn new(setup: &Setup) -> Self {
        Self {
            gateways: Gateways::new(setup),
        }
    }
}

impl Router for LeastQueue {
    fn route(&mut self, route: &Route<'_>) -> usize {
        let candidates = self
            .gateways
            .grid(route.replica)
            .view()
            .candidates(Some(MODEL));
        self.gateways
            .dispatch(route.replica, &candidates, route.id, route.now, 0, None)
            .0
    }

    fn head(&mut self, id: usize, _status: u16, _now: f64) {
        self.gateways.head(id);
    }

    fn finished(&mut self, id: usize, now: f64) {
        self.gateways.finished(id, now);
    }

    fn poll(&mut self, now: f64, engines: &[Engine]) {
        self.gateways.poll(now, engines);
    }
}
