//! `round-robin`: each replica turns through every engine in order.

use super::{Route, Router, Setup};

pub(super) struct RoundRobin {
    next: Vec<usize>,
    engines: usize,
}

impl RoundRobin {
    pub(super) fn new(setup: &Setup) -> Self {
        Self {
            next: vec![0; setup.replicas],
            engines: setup.engines(),
        }
    }
}

impl Router for RoundRobin {
    fn route(&mut self, route: &Route<'_>) -> usize {
        let next = &mut self.next[route.replica];
        let engine = *next;
        *next = (*next + 1) % self.engines;
        engine
    }
}
