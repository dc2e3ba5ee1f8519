//! The event loop: arrivals, queue polls and engine events in virtual time.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use grid_route_layer::keying::{PrefixKeys, SessionKey};

use super::engine::{Engine, EngineModel};
use super::policy::{Policy, Route, Setup, router};
use super::report::{PerRequest, PolicyResult};
use super::trace::TraceRequest;

/// What one policy's run needs besides the trace.
#[derive(Debug, Clone)]
pub struct RunSetup {
    /// The policies' common setup.
    pub policies: Setup,
    /// Every engine's model.
    pub engine: EngineModel,
    /// Seconds between the gateway's queue polls.
    pub poll_interval_s: f64,
    /// Share of requests an engine refuses with a 503 on arrival.
    pub fail_share: f64,
}

/// Mixed into `--seed` for the draws that decide which requests fail, so that they do
/// not change the other draws.
pub const FAILURE_SEED_SALT: u64 = 0x6661_696c_7572_6573;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    FirstToken,
    Finished,
}

/// An engine event; ordered by time, then by when it was scheduled.
struct Event {
    at: f64,
    seq: u64,
    kind: Kind,
    engine: usize,
    request: usize,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.seq.cmp(&other.seq))
    }
}

struct Loop<'a> {
    trace: &'a [TraceRequest],
    engines: Vec<Engine>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    per_request: PerRequest,
}

impl Loop<'_> {
    fn schedule(&mut self, at: f64, kind: Kind, engine: usize, request: usize) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            at,
            seq: self.seq,
            kind,
            engine,
            request,
        }));
    }

    /// Starts what engine `engine` can start at `now` (a slot engine may start several).
    fn start(&mut self, engine: usize, now: f64) {
        while let Some(started) = self.engines[engine].start_next(self.trace, now) {
            self.per_request.cached[started.request] = started.cached_tokens;
            self.schedule(
                started.first_token_at,
                Kind::FirstToken,
                engine,
                started.request,
            );
        }
    }
}

/// Replays `trace` (with each request's `keys`, its session when `sessions` is not empty,
/// and its thread when `threads` is not) under `policy`; `progress` is told how many
/// requests have arrived, every 1%.
pub fn run_policy(
    policy: Policy,
    trace: &[TraceRequest],
    keys: &[Option<PrefixKeys>],
    sessions: &[SessionKey],
    threads: &[SessionKey],
    setup: &RunSetup,
    progress: &mut dyn FnMut(usize),
) -> PolicyResult {
    let mut router = router(policy, &setup.policies);
    let engines = setup.policies.engines();
    let mut state = Loop {
        trace,
        engines: (0..engines).map(|_| Engine::new(setup.engine)).collect(),
        events: BinaryHeap::new(),
        seq: 0,
        per_request: PerRequest::new(trace.len()),
    };
    // The L4 balancer in front of the replicas: a uniform draw per request, the same
    // sequence for every policy.
    let mut balancer = fastrand::Rng::with_seed(setup.policies.seed);
    let mut failures = fastrand::Rng::with_seed(setup.policies.seed ^ FAILURE_SEED_SALT);
    let replicas = setup.policies.replicas;
    let (mut next, mut polls) = (0usize, 0u64);
    let step = (trace.len() / 100).max(1);
    loop {
        let arrival_at = trace.get(next).map(|r| r.arrival_ms as f64 / 1000.0);
        let event_at = state.events.peek().map(|Reverse(e)| e.at);
        // Polls run while requests still arrive; after the last one nothing routes.
        let poll_at = arrival_at.map(|_| polls as f64 * setup.poll_interval_s);
        // Ties: engine events first, then the poll, then the arrival.
        let first = [event_at, poll_at, arrival_at]
            .into_iter()
            .enumerate()
            .filter_map(|(what, at)| at.map(|at| (at, what)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some((now, what)) = first else {
            break;
        };
        match what {
            0 => {
                let Some(Reverse(event)) = state.events.pop() else {
                    break;
                };
                let request = &trace[event.request];
                match event.kind {
                    Kind::FirstToken => {
                        state.engines[event.engine].end_prefill(event.request);
                        state.per_request.ttft[event.request] =
                            now - request.arrival_ms as f64 / 1000.0;
                        router.head(event.request, 200, now);
                        let decode = request.output_tokens as f64 / setup.engine.decode_tps;
                        state.schedule(now + decode, Kind::Finished, event.engine, event.request);
                    }
                    Kind::Finished => {
                        state.engines[event.engine].finish(event.request, request);
                        router.ended(event.request, state.per_request.cached[event.request], now);
                        router.finished(event.request, now);
                    }
                }
                state.start(event.engine, now);
            }
            1 => {
                router.poll(now, &state.engines);
                polls += 1;
            }
            _ => {
                let id = next;
                next += 1;
                let replica = if replicas > 1 {
                    balancer.usize(..replicas)
                } else {
                    0
                };
                state.per_request.held_anywhere[id] = state
                    .engines
                    .iter()
                    .map(|engine| engine.cached_tokens(&trace[id]))
                    .max()
                    .unwrap_or(0);
                let engine = router.route(&Route {
                    replica,
                    id,
                    request: &trace[id],
                    keys: keys[id].as_ref(),
                    session: sessions.get(id).copied(),
                    thread: threads.get(id).copied(),
                    now,
                    engines: &state.engines,
                    trace,
                });
                state.per_request.served_by[id] = engine;
                // One draw per request whatever the share, so a share changes which
                // requests fail and nothing else.
                if failures.f64() < setup.fail_share {
                    // Refused on arrival: the answer head is a 503, nothing is queued.
                    state.per_request.failed[id] = true;
                    router.head(id, 503, now);
                    router.finished(id, now);
                } else {
                    state.engines[engine].enqueue(id, &trace[id]);
                    state.start(engine, now);
                }
                if next % step == 0 || next == trace.len() {
                    progress(next);
                }
            }
        }
    }
    PolicyResult::new(
        policy,
        trace,
        &state.per_request,
        engines,
        router.outcomes(),
    )
}
