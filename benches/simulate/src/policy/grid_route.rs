//! `grid-route`: the gateway's own affinity code, driven in virtual time.
//!
//! Per request, exactly what `serve` runs: [`Affinity::decide`] over the grid's
//! candidates with the request's keys, `now` and a seeded draw for exploration (the
//! library's [`narrow`](grid_route_layer::affinity::narrow): the prefix index's depths,
//! the threshold, the load gate; the session step, with each request's thread and with
//! `--sessions` its session), then `Select`'s
//! [`least_loaded`] among the clusters that stay, then p2c inside the cluster. At the
//! answer head, which the engine model sends with the first token (as `ConfirmLayer`
//! confirms a stream at its first output), [`Verdict`] applies the status to the index: a
//! 200 confirms the keys and the session, a 503 (an engine refusing, `--fail-share`)
//! drops them. When the answer ends, engine feedback weighs what the engine served from
//! its cache against a sticky or session request's predicted match, as `FeedbackLayer` does with
//! `engine_feedback` on: an engine that fell short evicted the prompt, and the index
//! forgets what it recorded at that cluster before it (the library's [`EvictionMarks`]);
//! a conversation's first turn that asked for a shared head counts whether it was found
//! into the cluster's tally (the library's [`count_shared_head`]), both as in `serve`;
//! and the answer's time to first token, its uncached tokens and its
//! cluster's load at dispatch teach the cluster's two prices ([`Affinity::learn`]), as
//! `FeedbackLayer` does.
//!
//! [`least_loaded`]: grid_route_layer::select::least_loaded

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use grid_route_layer::affinity::{Affinity, AnswerTiming, Outcome, predicted_match};
use grid_route_layer::confirm::Verdict;
use grid_route_layer::feedback::{EvictionMarks, count_shared_head};
use grid_route_layer::grid::ClusterId;
use grid_route_layer::index::PrefixIndex;
use grid_route_layer::keying::{PrefixKeys, SessionKey};
use grid_route_layer::route::PredictedMatch;
use grid_route_layer::select::prefill_bytes;

use super::gateway::{Gateways, MODEL};
use super::{Route, Router, Setup, instant};
use crate::engine::Engine;

/// Counted when affinity had nothing to decide (fewer than two sites).
const UNDECIDED: &str = "undecided";

/// What a request's answer head confirms or drops: its keys, its session and its thread.
struct Unconfirmed {
    keys: Option<PrefixKeys>,
    session: Option<SessionKey>,
    thread: Option<SessionKey>,
}

pub(super) struct GridRoute {
    gateways: Gateways,
    /// One per replica; with a shared index they all read and write the same one.
    affinity: Vec<Affinity>,
    /// Requests waiting for their answer head, for confirmation.
    keys: HashMap<usize, Unconfirmed>,
    /// Sticky requests until their answer ends, for engine feedback.
    predictions: HashMap<usize, Prediction>,
    /// Every request until its answer ends, for learning prices.
    timings: HashMap<usize, Timing>,
    outcomes: BTreeMap<&'static str, u64>,
    draws: fastrand::Rng,
    base: std::time::Instant,
}

/// What a request's answer teaches its cluster's prices with.
struct Timing {
    replica: usize,
    dispatched: f64,
    load: f64,
    input_tokens: u64,
    /// The first token's time and the cluster that answered, from the answer's head.
    head: Option<(f64, ClusterId)>,
}

/// A sticky request's predicted match, weighed when its answer ends.
struct Prediction {
    replica: usize,
    matched: PredictedMatch,
    /// When each sticky candidate was last confirmed for the deepest matched key.
    marks: EvictionMarks,
    /// The cluster that answered, from the answer's head.
    served: Option<ClusterId>,
}

impl GridRoute {
    pub(super) fn new(setup: &Setup) -> Self {
        let gateways = Gateways::new(setup);
        let index_for = |replica: usize| {
            let clusters = gateways
                .grid(replica)
                .view()
                .cluster_ids()
                .collect::<Vec<_>>();
            Arc::new(PrefixIndex::starting_at(setup.index, clusters, setup.base))
        };
        let shared = setup.shared_index.then(|| index_for(0));
        let affinity = (0..setup.replicas)
            .map(|replica| {
                let index = shared.clone().unwrap_or_else(|| index_for(replica));
                let affinity = Affinity::new(index, setup.affinity);
                affinity.set_index_shared(setup.shared_index);
                affinity
            })
            .collect();
        let mut outcomes: BTreeMap<&'static str, u64> =
            Outcome::ALL.iter().map(|o| (o.as_str(), 0)).collect();
        outcomes.insert(UNDECIDED, 0);
        Self {
            gateways,
            affinity,
            keys: HashMap::new(),
            predictions: HashMap::new(),
            timings: HashMap::new(),
            outcomes,
            draws: fastrand::Rng::with_seed(setup.seed ^ 0x6578_706c_6f72_6521),
            base: setup.base,
        }
    }
}

impl Router for GridRoute {
    fn route(&mut self, route: &Route<'_>) -> usize {
        let now = instant(self.base, route.now);
        let candidates = self
            .gateways
            .grid(route.replica)
            .view()
            .candidates(Some(MODEL));
        let draw = self.draws.f64();
        // As KeyingLayer and ConfirmLayer: with sessions off, a request carries none, and
        // its thread is not confirmed.
        let sessions_on = self.affinity[route.replica].settings().session_affinity();
        let session = route.session.filter(|_| sessions_on);
        let thread = route.thread.filter(|_| sessions_on);
        let decision =
            self.affinity[route.replica].decide(candidates, route.keys, session, now, draw);
        let outcome = decision.outcome().map_or(UNDECIDED, Outcome::as_str);
        *self.outcomes.entry(outcome).or_default() += 1;
        if route.keys.is_some() || session.is_some() || thread.is_some() {
            let unconfirmed = Unconfirmed {
                keys: route.keys.cloned(),
                session,
                thread,
            };
            self.keys.insert(route.id, unconfirmed);
        }
        if let Some(keys) = route.keys {
            let affinity = &self.affinity[route.replica];
            // What FeedbackService reads when the request goes out.
            if let Some(matched) = predicted_match(&decision)
                && affinity.settings().engine_feedback()
            {
                let candidates = decision.clusters().iter().map(|c| c.id());
                let marks = EvictionMarks::read(affinity.index(), candidates, keys, matched, now);
                self.predictions.insert(
                    route.id,
                    Prediction {
                        replica: route.replica,
                        matched,
                        marks,
                        served: None,
                    },
                );
            }
        }
        // What Select counts as waiting to be prefilled until the first token.
        let prefill = prefill_bytes(route.keys, predicted_match(&decision).as_ref());
        let (engine, load) = self.gateways.dispatch(
            route.replica,
            decision.clusters(),
            route.id,
            route.now,
            prefill,
            decision.placed(),
        );
        self.timings.insert(
            route.id,
            Timing {
                replica: route.replica,
                dispatched: route.now,
                load,
                input_tokens: route.request.input_tokens,
                head: None,
            },
        );
        engine
    }

    fn head(&mut self, id: usize, status: u16, now: f64) {
        let Some((replica, cluster)) = self.gateways.head(id) else {
            return;
        };
        if let Some(prediction) = self.predictions.get_mut(&id) {
            prediction.served = Some(cluster.clone());
        }
        if let Some(timing) = self.timings.get_mut(&id) {
            // A refusal (503) comes at once and teaches nothing: it has no usage.
            timing.head = (status == 200).then(|| (now, cluster.clone()));
        }
        if let Some(Unconfirmed {
            keys,
            session,
            thread,
        }) = self.keys.remove(&id)
        {
            Verdict::of_status(status).apply_to_request(
                self.affinity[replica].index(),
                &cluster,
                keys.as_ref(),
                session.into_iter().chain(thread),
                instant(self.base, now),
            );
        }
    }

    fn ended(&mut self, id: usize, cached_tokens: u64, _now: f64) {
        if let Some(timing) = self.timings.remove(&id)
            && let Some((first_token, cluster)) = timing.head
        {
            self.affinity[timing.replica].learn(
                &cluster,
                AnswerTiming {
                    uncached_tokens: timing.input_tokens.saturating_sub(cached_tokens),
                    load: timing.load,
                    started: std::time::Duration::from_secs_f64(
                        (first_token - timing.dispatched).max(0.0),
                    ),
                    first_token: true,
                },
            );
        }
        let Some(prediction) = self.predictions.remove(&id) else {
            return;
        };
        if let Some(served) = prediction.served {
            let affinity = &self.affinity[prediction.replica];
            prediction
                .marks
                .weigh(affinity.index(), &served, prediction.matched, cached_tokens);
            count_shared_head(affinity, &served, prediction.matched, cached_tokens);
        }
    }

    fn finished(&mut self, id: usize, now: f64) {
        self.timings.remove(&id);
        self.gateways.finished(id, now);
    }

    fn poll(&mut self, now: f64, engines: &[Engine]) {
        self.gateways.poll(now, engines);
    }

    fn outcomes(&self) -> BTreeMap<&'static str, u64> {
        self.outcomes.clone()
    }
}
