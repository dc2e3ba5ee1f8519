//! `grid-route-simulate`: replays a production trace through the gateway's own
//! routing code in virtual time, side by side with the policies of other routers.
//!
//! The trace ([`trace`]) is Mooncake's FAST'25 JSONL. Each request gets the prefix keys
//! the gateway would compute ([`TraceRequest::keys`], through
//! [`PrefixKeys::from_block_digests`](grid_route_layer::keying::PrefixKeys::from_block_digests)),
//! arrives at a gateway replica, is routed by a [`Policy`] to an engine ([`engine`]: a
//! vLLM-like block prefix cache, continuous batching, prefill and decode rates), and its
//! time to first token and cache hit are measured on the engine. `grid-route` runs the
//! library's [`Affinity::decide`](grid_route_layer::affinity::Affinity::decide), prefix
//! index, confirmation and `Select` choice, fed by the same queue poll the gateway runs.
//! Everything random is drawn from `--seed`, so a run repeats byte for byte.
//!
//! `docs/routing.md` explains the models, what each policy leaves out, and the results
//! on the bundled trace.
//!
//! ```
//! use grid_route_simulate::{Policy, SimulateArgs, read_trace, simulate};
//!
//! // Two turns of one conversation, ten seconds apart, then a new conversation.
//! let trace = read_trace(
//!     concat!(
//!         r#"{"timestamp": 0, "input_length": 3000, "output_length": 100, "hash_ids": [0, 1, 2, 3, 4, 5]}"#, "\n",
//!         r#"{"timestamp": 10000, "input_length": 3500, "output_length": 100, "hash_ids": [0, 1, 2, 3, 4, 5, 6]}"#, "\n",
//!         r#"{"timestamp": 20000, "input_length": 3000, "output_length": 100, "hash_ids": [0, 7, 8, 9, 10, 11]}"#, "\n",
//!     )
//!     .as_bytes(),
//! )
//! .unwrap();
//! let mut args = SimulateArgs::new("three-requests.jsonl");
//! args.policies = vec![Policy::GridRoute, Policy::RoundRobin];
//! args.gateway.exploration = 0.0;
//! let report = simulate(&args, &trace, false).unwrap();
//! let (grid_route, round_robin) = (&report.results[0], &report.results[1]);
//! // The second turn finds its first 3000 tokens cached only where the first one ran.
//! assert_eq!(grid_route.outcomes["sticky"], 1);
//! assert!(grid_route.hit_share > round_robin.hit_share);
//! ```

mod args;
pub mod engine;
pub mod policy;
pub mod report;
pub mod run;
pub mod slots;
pub mod trace;

use std::fs::File;
use std::io::{BufReader, IsTerminal, Write};
use std::time::Instant;

use grid_route_layer::keying::{PrefixKeys, SessionKey};

pub use args::{ClientArgs, EngineArgs, GATEWAY_POLL_INTERVAL_MS, GatewayArgs, SimulateArgs};
pub use engine::{EngineKind, EngineModel};
pub use policy::Policy;
pub use report::{PolicyResult, Report};
pub use trace::{TraceError, TraceRequest, read_trace, read_trace_of_blocks};

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The trace could not be read or is malformed.
    #[error("{0}")]
    Trace(TraceError),
    /// A request can never fit in an engine's KV cache.
    #[error(
        "request {request} of the trace needs {tokens} KV tokens, more than --kv-tokens {kv_tokens}"
    )]
    TooLarge {
        /// The request's position in the trace, from 1.
        request: usize,
        /// Tokens it needs.
        tokens: u64,
        /// `--kv-tokens`.
        kv_tokens: u64,
    },
    /// The settings were refused.
    #[error("{0}")]
    Settings(String),
}

/// Reads the trace and runs every policy; `progress` (when set) gets a line per 1% on
/// stderr.
pub fn run(args: &SimulateArgs, progress: bool) -> Result<Report, SimulateError> {
    let file = File::open(&args.trace).map_err(|e| SimulateError::Trace(TraceError::Io(e)))?;
    let trace = read_trace_of_blocks(BufReader::new(file), args.block_tokens)
        .map_err(SimulateError::Trace)?;
    simulate(args, &trace, progress)
}

/// Runs every policy of `args` over `trace`.
pub fn simulate(
    args: &SimulateArgs,
    trace: &[TraceRequest],
    progress: bool,
) -> Result<Report, SimulateError> {
    let mut engine = args.engine.model();
    engine.block_tokens = args.block_tokens;
    let capacity = engine.capacity_blocks() as u64 * engine.block_tokens;
    if let Some((i, request)) = trace.iter().enumerate().find(|(_, r)| {
        engine.kind == EngineKind::Batching
            && EngineModel::blocks_needed(r) as u64 * engine.block_tokens > capacity
    }) {
        return Err(SimulateError::TooLarge {
            request: i + 1,
            tokens: EngineModel::blocks_needed(request) as u64 * engine.block_tokens,
            kv_tokens: args.engine.kv_tokens,
        });
    }
    let prefix_affinity = args
        .gateway
        .prefix_affinity()
        .validate()
        .map_err(|e| SimulateError::Settings(e.to_string()))?;
    let answered;
    let trace = if engine.answers_cached {
        answered = trace::with_answers(trace);
        &answered[..]
    } else {
        trace
    };
    let continued = trace::continued_of(trace);
    let (keys, sessions, threads) = what_clients_send(trace, &continued, &args.clients);
    let closed_loop = args
        .clients
        .closed_loop
        .map(|clients| run::ClosedLoop::new(clients, &continued));
    let setup = run::RunSetup {
        policies: policy::Setup {
            sites: args.sites,
            engines_per_site: args.engines_per_site,
            replicas: args.replicas,
            shared_index: args.shared_index,
            affinity: args.gateway.affinity(prefix_affinity.affinity),
            index: prefix_affinity.index,
            queue_window: args.gateway.queue_window(),
            count_in_flight: args.gateway.count_in_flight,
            streams_count_whole: args.gateway.streams_count_whole,
            slots_unknown: args.gateway.slots_unknown,
            seed: args.seed,
            base: Instant::now(),
        },
        engine,
        poll_interval_s: args.gateway.poll_interval().as_secs_f64(),
        fail_share: args.fail_share,
        closed_loop,
    };
    let mut results = Vec::with_capacity(args.policies.len());
    for (i, &policy) in args.policies.iter().enumerate() {
        let mut report_progress = |done: usize| {
            if progress {
                let mut stderr = std::io::stderr().lock();
                // Progress is best effort: a closed stderr must not stop the run.
                let _ = write!(
                    stderr,
                    "\rsimulate: policy {}/{} {:<12} {:>3}%",
                    i + 1,
                    args.policies.len(),
                    policy.name(),
                    done * 100 / trace.len()
                );
                let _ = stderr.flush();
            }
        };
        results.push(run::run_policy(
            policy,
            trace,
            &keys,
            &sessions,
            &threads,
            &setup,
            &mut report_progress,
        ));
    }
    if progress {
        eprintln!();
    }
    Ok(Report {
        trace: args.trace.display().to_string(),
        requests: trace.len(),
        conversations: continued.iter().filter(|earlier| earlier.is_none()).count(),
        sites: args.sites,
        engines_per_site: args.engines_per_site,
        replicas: args.replicas,
        shared_index: args.shared_index,
        seed: args.seed,
        results,
    })
}

/// Each request's keys, and the sessions and threads of the requests (empty when the clients
/// send none).
type ClientInputs = (Vec<Option<PrefixKeys>>, Vec<SessionKey>, Vec<SessionKey>);

/// Each request's keys, session and thread as the gateway would read them from what the
/// clients send ([`ClientArgs`]). A request that continues no earlier one opens its
/// conversation: a gateway reads that from the messages (no earlier answer in them). One
/// that does names the thread of the request it continues, as a gateway keys it from a
/// history sent back as it was. `continued` is the request each one continues
/// ([`trace::continued_of`]).
fn what_clients_send(
    trace: &[TraceRequest],
    continued: &[Option<usize>],
    clients: &ClientArgs,
) -> ClientInputs {
    let keys = trace
        .iter()
        .zip(continued)
        .map(|(request, earlier)| {
            let follows = earlier
                .filter(|_| !clients.no_threads)
                .map(trace::thread_key);
            request
                .keys()
                .map(|keys| keys.opening(earlier.is_none()).following(follows))
        })
        .collect();
    let sessions = if clients.sessions {
        trace::sessions_of(continued)
            .into_iter()
            .map(trace::session_key)
            .collect()
    } else {
        Vec::new()
    };
    let threads = if clients.no_threads {
        Vec::new()
    } else {
        (0..trace.len()).map(trace::thread_key).collect()
    };
    (keys, sessions, threads)
}

/// Whether progress goes to stderr: only when it is a terminal.
pub fn progress_wanted() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
// Hand-computed results are compared after rounding to the printed precision.
#[allow(clippy::float_cmp)]
mod tests;
