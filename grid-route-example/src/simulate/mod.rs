//! `grid-route-example simulate`: replays a production trace through the gateway's own
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
//! use grid_route_example::simulate::{Policy, SimulateArgs, read_trace, simulate};
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
//! args.affinity.exploration = 0.0;
//! let report = simulate(&args, &trace, false).unwrap();
//! let (grid_route, round_robin) = (&report.results[0], &report.results[1]);
//! // The second turn finds its first 3000 tokens cached only where the first one ran.
//! assert_eq!(grid_route.outcomes["sticky"], 1);
//! assert!(grid_route.hit_share > round_robin.hit_share);
//! ```

pub mod engine;
pub mod policy;
pub mod report;
pub mod run;
pub mod trace;

use std::fs::File;
use std::io::{BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use grid_route_layer::config::{PrefillPrice, PrefixAffinityConfig};

pub use engine::EngineModel;
pub use policy::Policy;
pub use report::{PolicyResult, Report};
pub use trace::{TraceError, TraceRequest, read_trace};

use crate::config::QueueConfig;

/// Usage of the `simulate` command.
pub const USAGE: &str = "usage: grid-route-example simulate --trace FILE [options]

Replays a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length,
hash_ids of 512-token blocks) through each routing policy in virtual time and prints,
per policy, the prompt tokens served from cache, TTFT p50/p90/p99, the busiest engine's
requests over the mean, and the policy's decision outcomes.

options (defaults in brackets):
  --trace FILE                  the trace (required)
  --sites N                     sites [4]
  --engines-per-site N          engines at each site [1]
  --replicas N                  gateway replicas behind an L4 balancer [1]
  --shared-index                grid-route's replicas share one prefix index
  --policies LIST               comma-separated
                                [grid-route,round-robin,least-queue,cache-aware,chwbl,oracle]
  --seed N                      seed of every random draw [1]
  --fail-share X                share of requests an engine refuses with a 503 on
                                arrival (grid-route drops their keys) [0]
  --json                        print one JSON object instead of the table
  --plot FILE.svg               also write each policy's TTFT CDF as SVG
engine model (Llama-3.1-8B on one H100 under vLLM; see docs/routing.md):
  --kv-tokens N                 KV cache tokens [400000]
  --max-running N               requests running at once [256]
  --prefill-tps X               uncached prompt tokens prefilled a second [20000]
  --prefill-overhead-ms X       fixed time per prefill [20]
  --decode-tps X                tokens a second per running request [75]
gateway (grid-route and least-queue; library defaults):
  --poll-interval-ms N          queue poll interval [500]
  --queue-window-secs N         queue window [10]
  --threshold X                 prefix_affinity.threshold [0.8]
  --exploration X               prefix_affinity.exploration [0.02]
  --prefill-price X             prefix_affinity.prefill_tokens_per_second [10000]
  --engine-feedback true|false  prefix_affinity.engine_feedback [true]
";

/// The parsed command line of `simulate`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulateArgs {
    /// The trace file.
    pub trace: PathBuf,
    /// Sites.
    pub sites: usize,
    /// Engines at each site.
    pub engines_per_site: usize,
    /// Gateway replicas.
    pub replicas: usize,
    /// Whether grid-route's replicas share one index.
    pub shared_index: bool,
    /// The policies, in order.
    pub policies: Vec<Policy>,
    /// The seed.
    pub seed: u64,
    /// JSON output instead of the table.
    pub json: bool,
    /// Where to write the SVG chart.
    pub plot: Option<PathBuf>,
    /// The engine model.
    pub engine: EngineModel,
    /// Queue poll interval.
    pub poll_interval: Duration,
    /// Queue window.
    pub queue_window: Duration,
    /// grid-route's `prefix_affinity` settings.
    pub affinity: PrefixAffinityConfig,
    /// Share of requests an engine refuses with a 503.
    pub fail_share: f64,
}

impl SimulateArgs {
    /// The defaults, reading `trace`.
    pub fn new(trace: impl Into<PathBuf>) -> Self {
        let queue = QueueConfig::default();
        Self {
            trace: trace.into(),
            sites: 4,
            engines_per_site: 1,
            replicas: 1,
            shared_index: false,
            policies: Policy::ALL.to_vec(),
            seed: 1,
            json: false,
            plot: None,
            engine: EngineModel::default(),
            poll_interval: Duration::from_millis(queue.poll_interval_ms),
            queue_window: Duration::from_secs(queue.window_secs),
            affinity: PrefixAffinityConfig::default(),
            fail_share: 0.0,
        }
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} needs a number, got {value:?}"))
}

fn positive(flag: &str, value: &str) -> Result<usize, String> {
    match number::<usize>(flag, value)? {
        0 => Err(format!("{flag} must be at least 1, got 0")),
        n => Ok(n),
    }
}

fn rate(flag: &str, value: &str) -> Result<f64, String> {
    let x: f64 = number(flag, value)?;
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(format!("{flag} must be a number above 0, got {value:?}"))
    }
}

/// Parses the command line (`--flag value` or `--flag=value`).
pub fn parse_args(args: &[String]) -> Result<SimulateArgs, String> {
    let mut parsed = SimulateArgs::new(PathBuf::new());
    let mut trace = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        if matches!(flag, "--shared-index" | "--json") {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            if flag == "--json" {
                parsed.json = true;
            } else {
                parsed.shared_index = true;
            }
            continue;
        }
        if !flag.starts_with("--") {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let v = value.as_str();
        match flag {
            "--trace" => trace = Some(PathBuf::from(v)),
            "--sites" => parsed.sites = positive(flag, v)?,
            "--engines-per-site" => parsed.engines_per_site = positive(flag, v)?,
            "--replicas" => parsed.replicas = positive(flag, v)?,
            "--policies" => {
                parsed.policies = v
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<Vec<Policy>, String>>()?;
            }
            "--seed" => parsed.seed = number(flag, v)?,
            "--plot" => parsed.plot = Some(PathBuf::from(v)),
            "--kv-tokens" => parsed.engine.kv_tokens = positive(flag, v)? as u64,
            "--max-running" => parsed.engine.max_running = positive(flag, v)?,
            "--prefill-tps" => parsed.engine.prefill_tps = rate(flag, v)?,
            "--prefill-overhead-ms" => {
                let ms: f64 = number(flag, v)?;
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(format!("{flag} must be 0 or more, got {v:?}"));
                }
                parsed.engine.prefill_overhead_s = ms / 1000.0;
            }
            "--decode-tps" => parsed.engine.decode_tps = rate(flag, v)?,
            "--poll-interval-ms" => {
                parsed.poll_interval = Duration::from_millis(positive(flag, v)? as u64);
            }
            "--queue-window-secs" => {
                parsed.queue_window = Duration::from_secs(positive(flag, v)? as u64);
            }
            "--threshold" => parsed.affinity.threshold = number(flag, v)?,
            "--exploration" => parsed.affinity.exploration = number(flag, v)?,
            "--prefill-price" => {
                parsed.affinity.prefill_tokens_per_second = PrefillPrice::Fixed(number(flag, v)?);
            }
            "--engine-feedback" => parsed.affinity.engine_feedback = number(flag, v)?,
            "--fail-share" => {
                let share: f64 = number(flag, v)?;
                if !(0.0..1.0).contains(&share) {
                    return Err(format!("{flag} must be in [0, 1), got {v:?}"));
                }
                parsed.fail_share = share;
            }
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    parsed.trace = trace.ok_or("--trace is required")?;
    if parsed.policies.is_empty() {
        return Err("--policies needs at least one policy".into());
    }
    parsed
        .affinity
        .validate()
        .map_err(|error| error.to_string())?;
    Ok(parsed)
}

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
    let trace = read_trace(BufReader::new(file)).map_err(SimulateError::Trace)?;
    simulate(args, &trace, progress)
}

/// Runs every policy of `args` over `trace`.
pub fn simulate(
    args: &SimulateArgs,
    trace: &[TraceRequest],
    progress: bool,
) -> Result<Report, SimulateError> {
    let capacity = args.engine.capacity_blocks() as u64 * trace::TRACE_BLOCK_TOKENS;
    if let Some((i, request)) = trace
        .iter()
        .enumerate()
        .find(|(_, r)| EngineModel::blocks_needed(r) as u64 * trace::TRACE_BLOCK_TOKENS > capacity)
    {
        return Err(SimulateError::TooLarge {
            request: i + 1,
            tokens: EngineModel::blocks_needed(request) as u64 * trace::TRACE_BLOCK_TOKENS,
            kv_tokens: args.engine.kv_tokens,
        });
    }
    let prefix_affinity = args
        .affinity
        .validate()
        .map_err(|e| SimulateError::Settings(e.to_string()))?;
    let keys: Vec<_> = trace.iter().map(TraceRequest::keys).collect();
    let setup = run::RunSetup {
        policies: policy::Setup {
            sites: args.sites,
            engines_per_site: args.engines_per_site,
            replicas: args.replicas,
            shared_index: args.shared_index,
            affinity: prefix_affinity.affinity,
            index: prefix_affinity.index,
            queue_window: args.queue_window,
            seed: args.seed,
            base: Instant::now(),
        },
        engine: args.engine,
        poll_interval_s: args.poll_interval.as_secs_f64(),
        fail_share: args.fail_share,
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
        sites: args.sites,
        engines_per_site: args.engines_per_site,
        replicas: args.replicas,
        shared_index: args.shared_index,
        seed: args.seed,
        results,
    })
}

/// Whether progress goes to stderr: only when it is a terminal.
pub fn progress_wanted() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
// Hand-computed results are compared after rounding to the printed precision.
#[allow(clippy::float_cmp)]
mod tests;
