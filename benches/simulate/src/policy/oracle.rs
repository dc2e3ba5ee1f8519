//! `oracle`: sees every engine's real cache and queue and sends each request where its
//! first token is predicted soonest — the prefill in progress, the waiting prefills and
//! its own uncached prefill ([`Engine::predicted_ttft`]). Not a router anyone can run: the
//! bound the others are measured against. It ignores replicas (it sees everything).
//!
//! [`Engine::predicted_ttft`]: crate::engine::Engine::predicted_ttft

use super::{Route, Router, Setup};

pub(super) struct Oracle;

impl Oracle {
    pub(super) fn new(_setup: &Setup) -> Self {
        Self
    }
}

impl Router for Oracle {
    fn route(&mut self, route: &Route<'_>) -> usize {
        let mut best = (f64::INFINITY, 0);
        for (engine, state) in route.engines.iter().enumerate() {
            let ttft = state.predicted_ttft(route.request, route.now, route.trace);
            // Strictly less: ties go to the lowest-numbered engine.
            if ttft < best.0 {
                best = (ttft, engine);
            }
        }
        best.1
    }
}
