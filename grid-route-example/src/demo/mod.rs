//! The demo: grid-route against three mock sites, with prefix affinity on and off, in one
//! process and a quarter of a minute (`grid-route-example demo`, or no command at all).
//!
//! # What it does
//!
//! 1. Starts three [mock engines](grid_route_mock_engine), one cluster at each of three sites
//!    (`us-east`, `eu-west`, `ap-south`). They behave like small vLLM servers: a block
//!    prefix cache, a prefill of 4,000 uncached tokens a second (a 3,000-token prompt
//!    prefilled from scratch costs ¾ s, from cache almost nothing), two requests running
//!    at once with the rest queued, and the queue on `/metrics`.
//! 2. Starts the [gateway](crate::gateway) in front of them, reading their queues every
//!    50 ms, with prefix affinity **on**, priced for these engines: their prefill speed,
//!    and a queued request worth one cached request's time in a slot over the slots.
//! 3. Replays a multi-turn workload through the gateway, 10 sessions at a time, each
//!    session's turns in order, so that queues form:
//!    - 30 chat conversations of 5 streamed turns. Two in three open with one of three
//!      shared 9 KB system prompts (about 7 conversations each, like an app's users); the
//!      others with a private 4 KB one. The first turn attaches a private 4 KB document;
//!      each later turn asks a 400-byte question. Every turn resends the whole history.
//!    - 3 Responses chains of 5 requests: the first keyed like any prompt, the next ones
//!      naming the gateway's tagged id of the previous answer in `previous_response_id`.
//!    - 1 stored Conversation (`POST /v1/conversations`) and 5 responses in it.
//! 4. Stops everything, then does steps 1–3 again with fresh engines (empty caches), a
//!    fresh gateway (an empty index) and prefix affinity **off**: the same requests, routed
//!    on queue depth alone.
//! 5. Prints the table on stdout. Progress (a line per phase, a running count of requests)
//!    goes to stderr.
//!
//! `--conversations`, `--turns` and `--concurrency` change the workload's size (one chain
//! per 10 conversations, at least one); `--quick` is a small workload for tests.
//!
//! # Reading the table
//!
//! One column per run, one row per measure:
//!
//! - **requests answered 2xx**: every request of the run; a stream counts only when it
//!   ended and reported its usage.
//! - **cache-hit share of prompt tokens**: of the prompt tokens the engines prefilled
//!   (`usage.prompt_tokens`, `input_tokens` for Responses), the share they read from
//!   their prefix cache (`prompt_tokens_details.cached_tokens`), summed over the answers.
//!   Affinity sends each turn to the site that served the previous one, where the history
//!   is cached; without it a turn lands on a site that has not seen the conversation two
//!   times in three. Shared system prompts soon sit in every site's cache, so they hit
//!   either way. What no routing saves — a conversation's first turn, each new question —
//!   keeps the share with affinity well under 100%.
//! - **TTFT p50 / p99**: time from sending a streamed chat request to its first token,
//!   over the chat turns: its wait for a running slot plus the prefill of the uncached
//!   part of its prompt. Less prefill also means shorter queues, so the median falls
//!   further than the hit share alone suggests. The p99 is the cold start — every
//!   session's first turn at once on empty caches — the same in both runs.
//! - **requests to SITE**: which site answered, by the engine that answered.
//! - **affinity OUTCOME**: the gateway's `grid_route_prefix_affinity_total` during the run
//!   (a difference of two scrapes of `/metrics`: the recorder is process-wide). `sticky`:
//!   a site held enough of the prompt and its queue allowed; `no_match`: no site did (a
//!   conversation's first turn on a private prompt, or before any answer confirmed its
//!   prompt); `load_override`: the holder's queue outweighed the prefill it would save;
//!   `exploration`: the 2% that skip affinity so a second site learns a shared prompt;
//!   `not_applicable`: requests without keys; `session`: a request that did not stick but
//!   whose session its cluster answered last (the demo's clients name no session, so it
//!   stays at zero). Pinned requests count nothing, and with
//!   affinity off nothing is decided, so that column is all zeros. `load_override` stays
//!   at zero here, as it should: on these engines a queued request costs about 40 ms and
//!   a match saves half a second or more of prefill, so the gate gives way only to a
//!   queue over ten requests deeper than another site's.
//! - **pinned follow-ups answered 2xx**: requests naming a stored response or
//!   conversation. The gateway pins them to the cluster that stored it, with affinity on
//!   or off; any other engine would answer 404.
//! - **replay time**: the run's wall time, start of the first request to the last answer.
//!
//! # Example
//!
//! ```no_run
//! use grid_route_example::demo::{self, DemoOptions, Progress};
//!
//! # async fn run() -> Result<(), demo::DemoError> {
//! let report = demo::run(&DemoOptions::quick(), Progress::Quiet).await?;
//! assert!(report.affinity_on.all_ok());
//! assert!(report.affinity_on.cache_hit_share() > report.affinity_off.cache_hit_share());
//! println!("{report}");
//! # Ok(())
//! # }
//! ```

mod cli;
mod client;
mod progress;
mod replay;
mod report;
mod testbed;
mod workload;

use std::io;
use std::time::Duration;

pub use cli::DemoArgs;
pub use progress::Progress;
pub use report::{DemoReport, RunReport, TABLE_LEGEND, TABLE_ROWS};

use crate::config::ConfigError;
use crate::gateway::GatewayError;
use progress::RunningCount;
use testbed::{EngineProfile, SITES, Testbed};
use workload::{Shape, Workload};

/// The mock engines' behaviour in both runs. 4,000 tokens a second is a small GPU's
/// prefill: slow enough that recomputing a conversation's history shows in TTFT, fast
/// enough that the demo takes seconds.
const ENGINES: EngineProfile = EngineProfile {
    prefill_tokens_per_second: 4_000,
    max_running: 2,
    decode_delay_per_token: Duration::from_millis(4),
};

/// The demo's workload size. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DemoOptions {
    /// Chat conversations (default 30). One Responses chain per 10, at least one.
    pub conversations: usize,
    /// Turns of each conversation, chain and stored conversation (default 5).
    pub turns: usize,
    /// Sessions in flight at once (default 10).
    pub concurrency: usize,
    /// Whether the defaults were the quick ones (shown in the progress lines).
    pub quick: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            conversations: 30,
            turns: 5,
            concurrency: 10,
            quick: false,
        }
    }
}

impl DemoOptions {
    /// A small workload that still shows the difference: 6 conversations of 3 turns, 4 at
    /// a time, one chain and one stored conversation.
    pub fn quick() -> Self {
        Self {
            conversations: 6,
            turns: 3,
            concurrency: 4,
            quick: true,
        }
    }

    /// Sets the number of chat conversations.
    #[must_use]
    pub fn conversations(mut self, conversations: usize) -> Self {
        self.conversations = conversations;
        self
    }

    /// Sets the turns of each session.
    #[must_use]
    pub fn turns(mut self, turns: usize) -> Self {
        self.turns = turns;
        self
    }

    /// Sets the sessions in flight at once.
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    fn shape(&self) -> Shape {
        Shape {
            conversations: self.conversations,
            turns: self.turns,
            chains: (self.conversations / 10).max(1),
            stored_conversations: 1,
            shared_prompts: 3,
            shared_prompt_bytes: 9 * 1024,
            private_prompt_bytes: 4 * 1024,
            question_bytes: 400,
            document_bytes: 4 * 1024,
        }
    }
}

/// Runs the demo: the workload with prefix affinity on, then off, each against fresh
/// engines and a fresh gateway. Must run inside a multi-threaded Tokio runtime.
///
/// Failed requests do not fail the run: they are counted in the report
/// ([`RunReport::all_ok`], [`RunReport::failures`]). The error is for a demo that could
/// not start its engines or gateway.
pub async fn run(options: &DemoOptions, progress: Progress) -> Result<DemoReport, DemoError> {
    let workload = Workload::generate(options.shape());
    let shape = workload.shape;
    let chats = shape.conversations;
    progress.phase(&format!(
        "grid-route demo{}: {} sites ({}), one mock engine each ({} prefill tokens/s, {} running at once)",
        if options.quick { " (quick)" } else { "" },
        SITES.len(),
        SITES.join(", "),
        ENGINES.prefill_tokens_per_second,
        ENGINES.max_running,
    ));
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    progress.phase(&format!(
        "workload: {} x {turns} turns ({shared} on {prompts}, {private} private), {} and {} \
         x {turns}; {concurrency} sessions at a time, {requests} requests a run",
        plural(chats, "chat conversation", "chat conversations"),
        plural(shape.chains, "Responses chain", "Responses chains"),
        plural(shape.stored_conversations, "Conversation", "Conversations"),
        turns = shape.turns,
        shared = workload.shared_conversations(),
        prompts = plural(
            shape.shared_prompts.min(chats),
            "shared system prompt",
            "shared system prompts"
        ),
        private = chats - workload.shared_conversations(),
        concurrency = options.concurrency,
        requests = workload.requests(),
    ));
    let affinity_on = run_once(&workload, options, true, progress, "[1/2] affinity on").await?;
    let affinity_off = run_once(&workload, options, false, progress, "[2/2] affinity off").await?;
    Ok(DemoReport {
        affinity_on,
        affinity_off,
    })
}

async fn run_once(
    workload: &Workload,
    options: &DemoOptions,
    affinity: bool,
    progress: Progress,
    label: &str,
) -> Result<RunReport, DemoError> {
    progress.phase(&format!(
        "{label}: starting {} mock engines and the gateway",
        SITES.len()
    ));
    let bed = Testbed::start(ENGINES, affinity).await?;
    let count = RunningCount::start(progress, format!("{label}: replaying"), workload.requests());
    let report = replay::replay(&bed, workload, options.concurrency, &count, affinity).await;
    count.finish().await;
    bed.shutdown().await;
    progress.phase(&format!(
        "{label}: done in {:.1} s, {}/{} requests answered 2xx",
        report.elapsed.as_secs_f64(),
        report.requests_ok,
        report.requests
    ));
    Ok(report)
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// A mock engine could not start.
    #[error("cannot start a mock engine: {0}")]
    Engine(#[source] io::Error),
    /// The gateway could not start.
    #[error("cannot start the gateway: {0}")]
    Gateway(#[from] GatewayError),
}

impl From<ConfigError> for DemoError {
    fn from(error: ConfigError) -> Self {
        Self::Gateway(GatewayError::Config(error))
    }
}
