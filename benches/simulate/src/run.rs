//! The event loop: arrivals, queue polls and engine events in virtual time.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use grid_route_layer::keying::{PrefixKeys, SessionKey};

use super::engine::{Engine, EngineModel};
use super::policy::{Policy, Route, Router, Setup, router};
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
    /// Closed-loop clients (`--closed-loop`); `None` sends every request at its trace time.
    pub closed_loop: Option<ClosedLoop>,
}

/// Clients that send each conversation's next turn when the answer to the one before has
/// ended, and start a new conversation when one of theirs ends (`--closed-loop`).
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    clients: usize,
    /// The request that continues each one, if any.
    next_turn: Vec<Option<usize>>,
    /// The requests that begin a conversation, in trace order.
    first_turns: Vec<usize>,
}

impl ClosedLoop {
    /// `clients` of them, over a trace whose requests continue `continued` (see
    /// [`continued_of`](super::trace::continued_of)).
    pub fn new(clients: usize, continued: &[Option<usize>]) -> Self {
        let mut next_turn = vec![None; continued.len()];
        let mut first_turns = Vec::new();
        for (id, earlier) in continued.iter().enumerate() {
            match *earlier {
                Some(earlier) => next_turn[earlier] = Some(id),
                None => first_turns.push(id),
            }
        }
        Self {
            clients,
            next_turn,
            first_turns,
        }
    }
}

/// When each request is sent: at its trace time (open-loop), or as [`ClosedLoop`] clients
/// send it.
struct Arrivals<'a> {
    /// Requests whose send time is known, soonest first (ties in trace order).
    due: BinaryHeap<Reverse<Due>>,
    /// Closed-loop: the clients, and the conversations not yet begun, in trace order.
    closed: Option<(&'a ClosedLoop, VecDeque<usize>)>,
    /// Requests sent so far.
    sent: usize,
}

/// A request due to be sent at `at` seconds.
#[derive(Debug, Clone, Copy)]
struct Due {
    at: f64,
    id: usize,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.id.cmp(&other.id))
    }
}

impl<'a> Arrivals<'a> {
    fn new(trace: &[TraceRequest], closed: Option<&'a ClosedLoop>) -> Self {
        let at = |id: usize| trace[id].arrival_ms as f64 / 1000.0;
        let mut due = BinaryHeap::new();
        let closed = closed.map(|loop_| {
            let mut firsts: VecDeque<usize> = loop_.first_turns.iter().copied().collect();
            for id in firsts.drain(..loop_.clients.min(firsts.len())) {
                due.push(Reverse(Due { at: at(id), id }));
            }
            (loop_, firsts)
        });
        if closed.is_none() {
            due.extend((0..trace.len()).map(|id| Reverse(Due { at: at(id), id })));
        }
        Self {
            due,
            closed,
            sent: 0,
        }
    }

    /// The next request due, and when.
    fn peek(&self) -> Option<Due> {
        self.due.peek().map(|Reverse(due)| *due)
    }

    fn pop(&mut self) -> Option<Due> {
        let due = self.due.pop().map(|Reverse(due)| due);
        self.sent += usize::from(due.is_some());
        due
    }

    /// Request `id`'s answer ended at `now` (or it was refused): closed-loop, its client
    /// sends the conversation's next turn, or begins the next conversation.
    fn answered(&mut self, id: usize, now: f64) {
        let Some((loop_, firsts)) = &mut self.closed else {
            return;
        };
        if let Some(next) = loop_.next_turn[id].or_else(|| firsts.pop_front()) {
            self.due.push(Reverse(Due { at: now, id: next }));
        }
    }
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
    /// When each request was sent, for its time to first token.
    sent_at: Vec<f64>,
}

impl Loop<'_> {
    /// Runs engine event `event` at `now`: the router hears of it, and closed-loop clients
    /// of an ended answer (`arrivals`); then the engine starts what it can.
    fn engine_event(
        &mut self,
        event: &Event,
        router: &mut dyn Router,
        arrivals: &mut Arrivals<'_>,
        decode_tps: f64,
        now: f64,
    ) {
        let request = &self.trace[event.request];
        match event.kind {
            Kind::FirstToken => {
                self.engines[event.engine].end_prefill(event.request);
                self.per_request.ttft[event.request] = now - self.sent_at[event.request];
                router.head(event.request, 200, now);
                let decode = request.output_tokens as f64 / decode_tps;
                self.schedule(now + decode, Kind::Finished, event.engine, event.request);
            }
            Kind::Finished => {
                self.engines[event.engine].finish(event.request, request);
                router.ended(event.request, self.per_request.cached[event.request], now);
                router.finished(event.request, now);
                arrivals.answered(event.request, now);
            }
        }
        self.start(event.engine, now);
    }

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
        sent_at: vec![0.0; trace.len()],
    };
    // The L4 balancer in front of the replicas: a uniform draw per request, the same
    // sequence for every policy.
    let mut balancer = fastrand::Rng::with_seed(setup.policies.seed);
    let mut failures = fastrand::Rng::with_seed(setup.policies.seed ^ FAILURE_SEED_SALT);
    let replicas = setup.policies.replicas;
    let mut arrivals = Arrivals::new(trace, setup.closed_loop.as_ref());
    let mut polls = 0u64;
    let step = (trace.len() / 100).max(1);
    loop {
        let arrival_at = arrivals.peek().map(|due| due.at);
        let event_at = state.events.peek().map(|Reverse(e)| e.at);
        if arrival_at.is_none() && event_at.is_none() {
            // Nothing in flight and nothing due: every request was sent and answered.
            break;
        }
        // Polls run while requests are still to be sent; after the last one nothing routes.
        let poll_at = (arrivals.sent < trace.len()).then_some(polls as f64 * setup.poll_interval_s);
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
                let decode_tps = setup.engine.decode_tps;
                state.engine_event(&event, router.as_mut(), &mut arrivals, decode_tps, now);
            }
            1 => {
                router.poll(now, &state.engines);
                polls += 1;
            }
            _ => {
                let Some(Due { id, .. }) = arrivals.pop() else {
                    break;
                };
                state.sent_at[id] = now;
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
                    arrivals.answered(id, now);
                } else {
                    state.engines[engine].enqueue(id, &trace[id]);
                    state.start(engine, now);
                }
                if arrivals.sent.is_multiple_of(step) || arrivals.sent == trace.len() {
                    progress(arrivals.sent);
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
