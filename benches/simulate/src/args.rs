//! The `simulate` command's arguments: the run, the engine model and the gateway's
//! settings, each default shown in `--help` and taken from where the simulator, the
//! library or the gateway's config defines it.

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use clap::builder::RangedU64ValueParser;
use grid_route_layer::affinity::{AffinitySettings, FREE_SLOT_WAIT_FACTOR, MOVED_PREFILL_PAYERS};
use grid_route_layer::config::{PrefixAffinityConfig, Price};
use grid_route_layer::grid::GridSettings;

use super::engine::{EngineKind, EngineModel};
use super::policy::Policy;
use super::trace::{MIN_BLOCK_TOKENS, TRACE_BLOCK_TOKENS};

/// Sites, when `--sites` is not given.
const DEFAULT_SITES: usize = 4;
/// Engines at each site, when `--engines-per-site` is not given.
const DEFAULT_ENGINES_PER_SITE: usize = 1;
/// Gateway replicas, when `--replicas` is not given.
const DEFAULT_REPLICAS: usize = 1;
/// The seed, when `--seed` is not given.
const DEFAULT_SEED: u64 = 1;
/// The gateway's `queue.poll_interval_ms` default (the example gateway's config, which this
/// crate does not link: `tests/simulate_cli.rs` checks the two agree).
pub const GATEWAY_POLL_INTERVAL_MS: u64 = 500;

/// What the clients send of their conversations. Mooncake traces carry no conversation id,
/// so conversations are derived: a request whose blocks begin with an earlier request's
/// whole prompt continues it, each request continued at most once, and none continues a
/// request ending at a block an earlier request went past (a head many share).
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct ClientArgs {
    /// Requests carry their conversation's session id, as a client sending
    /// `prompt_cache_key` would
    #[arg(long)]
    pub sessions: bool,
    /// Requests name no earlier prompt they follow (`PrefixKeys::follows`), as from a client
    /// that rewrites its history at each turn: measures what a gateway's threads are worth.
    /// Without it, a request that continues an earlier one follows that request's thread,
    /// as the gateway keys it from a history sent back as it was
    #[arg(long)]
    pub no_threads: bool,
    /// Replays closed-loop, as N clients like scripts/arena's: each sends one conversation's
    /// turns in order, each as soon as the answer to the one before has ended, then starts
    /// the next conversation not yet begun, in trace order. The trace's times then place
    /// only the first N conversations' first turns. Without it every request is sent at its
    /// trace time, whatever the engines did before (open-loop)
    #[arg(long, value_name = "N", value_parser = at_least_one())]
    pub closed_loop: Option<usize>,
}

/// The arguments of `grid-route-simulate`: the trace, the deployment and the
/// policies compared.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct SimulateArgs {
    /// The trace: Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids of
    /// 512-token blocks)
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Tokens each of the trace's hash_ids stands for: 512 in Mooncake's traces, less in a
    /// finer one (scripts/arena writes 64); a multiple of 64 (one 256-byte keying block)
    #[arg(
        long,
        value_name = "N",
        default_value_t = TRACE_BLOCK_TOKENS,
        value_parser = block_tokens,
    )]
    pub block_tokens: u64,
    /// Sites
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SITES, value_parser = at_least_one())]
    pub sites: usize,
    /// Engines at each site
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_ENGINES_PER_SITE,
        value_parser = at_least_one(),
    )]
    pub engines_per_site: usize,
    /// Gateway replicas behind an L4 balancer
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REPLICAS, value_parser = at_least_one())]
    pub replicas: usize,
    /// grid-route's replicas share one prefix index
    #[arg(long)]
    pub shared_index: bool,
    /// What the clients send of their conversations.
    #[command(flatten)]
    pub clients: ClientArgs,
    /// The policies compared, comma-separated, in this order
    #[arg(
        long,
        value_name = "LIST",
        value_enum,
        value_delimiter = ',',
        default_values_t = Policy::ALL,
    )]
    pub policies: Vec<Policy>,
    /// Seed of every random draw: the same seed repeats a run byte for byte
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Share of requests an engine refuses with a 503 on arrival (grid-route drops their
    /// keys), in [0, 1)
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = 0.0,
        value_parser = failure_share,
    )]
    pub fail_share: f64,
    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,
    /// Also write each policy's TTFT CDF as SVG to this file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The engine model.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The gateway's settings.
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

impl SimulateArgs {
    /// The defaults, reading `trace`: what `simulate --trace TRACE` runs.
    pub fn new(trace: impl Into<PathBuf>) -> Self {
        Self {
            trace: trace.into(),
            block_tokens: TRACE_BLOCK_TOKENS,
            sites: DEFAULT_SITES,
            engines_per_site: DEFAULT_ENGINES_PER_SITE,
            replicas: DEFAULT_REPLICAS,
            shared_index: false,
            clients: ClientArgs::default(),
            policies: Policy::ALL.to_vec(),
            seed: DEFAULT_SEED,
            fail_share: 0.0,
            json: false,
            plot: None,
            engine: EngineArgs::from(EngineModel::default()),
            gateway: GatewayArgs::default(),
        }
    }
}

/// The engine model's flags, in the units a reader thinks in (milliseconds of overhead);
/// the defaults are [`EngineModel::default`]'s.
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
#[command(
    next_help_heading = "Engine model (defaults: Llama-3.1-8B on one H100 under vLLM; see docs/routing.md)"
)]
pub struct EngineArgs {
    /// The engine: batching (vLLM, SGLang: continuous batching over a block prefix cache)
    /// or slots (llama.cpp --parallel N: N slots, each holding one prompt's cache)
    #[arg(long, value_name = "KIND", value_enum, default_value_t = EngineModel::default().kind)]
    pub engine: EngineKind,
    /// Slots of each slot engine (llama.cpp --parallel)
    #[arg(
        long,
        value_name = "N",
        default_value_t = EngineModel::default().slots,
        value_parser = at_least_one(),
    )]
    pub slots: usize,
    /// Tokens of each slot engine's host prompt cache (llama.cpp --cache-ram); 0: none
    #[arg(long, value_name = "N", default_value_t = EngineModel::default().host_cache_tokens)]
    pub host_cache_tokens: u64,
    /// A slot engine prefills one prompt at a time, first come first served, and
    /// `--prefill-tps` is the engine's, shared by its slots: llama.cpp's server fills
    /// each pass with prompt tokens from every slot that has some, so a request arriving
    /// during a pass waits for it. Without it each slot prefills on its own at
    /// `--prefill-tps`
    #[arg(long)]
    pub one_prefill_at_a_time: bool,
    /// A slot engine uses its host prompt cache as llama.cpp's server does: every idle
    /// slot's prompt is saved to it when a request starts (`--cache-idle-slots`), and a
    /// request looks in it only when the slot it takes (the idle one sharing the longest
    /// prefix, if that is over a tenth of its prompt, else the least recently used) keeps
    /// under half of what it held; what it finds there beats the slot's own or the slot
    /// starts empty. Without it a request is restored from the host cache whenever a
    /// saved prompt holds more of it than the slot it takes
    #[arg(long)]
    pub llama_cpp_host_cache: bool,
    /// KV cache tokens
    #[arg(
        long,
        value_name = "N",
        default_value_t = EngineModel::default().kv_tokens,
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    pub kv_tokens: u64,
    /// Requests running at once
    #[arg(
        long,
        value_name = "N",
        default_value_t = EngineModel::default().max_running,
        value_parser = at_least_one(),
    )]
    pub max_running: usize,
    /// Uncached prompt tokens prefilled a second
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = EngineModel::default().prefill_tps,
        value_parser = rate,
    )]
    pub prefill_tps: f64,
    /// Fixed time per prefill, milliseconds
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = EngineModel::default().prefill_overhead_s * 1000.0,
        value_parser = non_negative,
    )]
    pub prefill_overhead_ms: f64,
    /// Tokens a second per running request
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = EngineModel::default().decode_tps,
        value_parser = rate,
    )]
    pub decode_tps: f64,
    /// Whether a turn that continues an earlier one finds that turn's partial last block
    /// and answer at the engine that served it, as real engines keep them. false: only
    /// whole trace blocks hit, as the trace's ids say (the tables of docs/routing.md)
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        default_value_t = EngineModel::default().answers_cached,
    )]
    pub answers_cached: bool,
}

impl EngineArgs {
    /// The engine model these flags describe.
    pub fn model(&self) -> EngineModel {
        EngineModel {
            kind: self.engine,
            slots: self.slots,
            host_cache_tokens: self.host_cache_tokens,
            one_prefill_at_a_time: self.one_prefill_at_a_time,
            llama_cpp_host_cache: self.llama_cpp_host_cache,
            // The trace's, set from `--block-tokens` by `simulate`.
            block_tokens: TRACE_BLOCK_TOKENS,
            kv_tokens: self.kv_tokens,
            max_running: self.max_running,
            prefill_tps: self.prefill_tps,
            prefill_overhead_s: self.prefill_overhead_ms / 1000.0,
            decode_tps: self.decode_tps,
            answers_cached: self.answers_cached,
        }
    }
}

impl From<EngineModel> for EngineArgs {
    fn from(model: EngineModel) -> Self {
        Self {
            engine: model.kind,
            slots: model.slots,
            host_cache_tokens: model.host_cache_tokens,
            one_prefill_at_a_time: model.one_prefill_at_a_time,
            llama_cpp_host_cache: model.llama_cpp_host_cache,
            kv_tokens: model.kv_tokens,
            max_running: model.max_running,
            prefill_tps: model.prefill_tps,
            prefill_overhead_ms: model.prefill_overhead_s * 1000.0,
            decode_tps: model.decode_tps,
            answers_cached: model.answers_cached,
        }
    }
}

/// The gateway's settings that grid-route and least-queue run with; the defaults are the
/// gateway's (`queue`) and the library's (`prefix_affinity`).
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
#[command(next_help_heading = "Gateway (grid-route and least-queue; the gateway's defaults)")]
// Each bool is one independent flag of the command line, not a state machine.
#[allow(clippy::struct_excessive_bools)]
pub struct GatewayArgs {
    /// Queue poll interval, milliseconds
    #[arg(
        long,
        value_name = "N",
        default_value_t = GATEWAY_POLL_INTERVAL_MS,
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    pub poll_interval_ms: u64,
    /// Queue window, seconds
    #[arg(
        long,
        value_name = "N",
        default_value_t = GridSettings::DEFAULT_QUEUE_WINDOW.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    pub queue_window_secs: u64,
    /// queue.count_in_flight: a cluster's load is its queue plus this replica's requests
    /// whose answer has not ended, a stream (past its first token) at half
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        default_value_t = GridSettings::DEFAULT_COUNT_IN_FLIGHT,
    )]
    pub count_in_flight: bool,
    /// prefix_affinity.threshold
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = PrefixAffinityConfig::default().threshold,
        value_parser = |value: &str| affinity_setting(value, |config, x| config.threshold = x),
    )]
    pub threshold: f64,
    /// prefix_affinity.capacity: the index's prefix keys a cluster (the contract's 16,384)
    #[arg(
        long,
        value_name = "N",
        default_value_t = PrefixAffinityConfig::default().capacity,
        value_parser = |value: &str| whole(value, |config, n| config.capacity = n),
    )]
    pub capacity: usize,
    /// prefix_affinity.ttl_secs: how long the index keeps a key (the contract's 600 s)
    #[arg(
        long,
        value_name = "N",
        default_value_t = PrefixAffinityConfig::default().ttl_secs,
        value_parser = |value: &str| whole(value, |config, n| config.ttl_secs = n),
    )]
    pub ttl_secs: u64,
    /// prefix_affinity.exploration
    #[arg(
        long,
        value_name = "X",
        allow_negative_numbers = true,
        default_value_t = PrefixAffinityConfig::default().exploration,
        value_parser = |value: &str| affinity_setting(value, |config, x| config.exploration = x),
    )]
    pub exploration: f64,
    /// prefix_affinity.prefill_tokens_per_second: a number, or auto (learned per site from
    /// prefix_affinity's prior, 10000)
    #[arg(
        long,
        value_name = "X|auto",
        allow_negative_numbers = true,
        default_value = "auto",
        value_parser = |value: &str| {
            price(value, |config, price| config.prefill_tokens_per_second = price)
        },
    )]
    pub prefill_price: Price,
    /// prefix_affinity.queued_request_seconds: what one more request in a site's load costs
    /// a new one, a number or auto (learned per site from prefix_affinity's prior, 2)
    #[arg(
        long,
        value_name = "X|auto",
        allow_negative_numbers = true,
        default_value = "auto",
        value_parser = |value: &str| {
            price(value, |config, price| config.queued_request_seconds = price)
        },
    )]
    pub queued_request_seconds: Price,
    /// prefix_affinity.engine_feedback: an engine's reported miss makes the index forget
    /// what it no longer holds
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        default_value_t = PrefixAffinityConfig::default().engine_feedback,
    )]
    pub engine_feedback: bool,
    /// A request in flight counts whole until its answer ends, as before streams counted
    /// at STREAM_WEIGHT (what the default is measured against)
    #[arg(long)]
    pub streams_count_whole: bool,
    /// The gateway does not know slot engines' slots, as before it read them from
    /// llama.cpp's `/props`: their streams count at STREAM_WEIGHT even with every slot
    /// busy (what the default is measured against)
    #[arg(long)]
    pub slots_unknown: bool,
    /// How many times the load gate counts a match's saved prefill at a learned
    /// queued-request price (what MOVED_PREFILL_PAYERS, the default, is measured against)
    #[arg(
        long,
        value_name = "X",
        default_value_t = MOVED_PREFILL_PAYERS,
        value_parser = payers,
    )]
    pub moved_prefill_payers: f64,
    /// Exploration draws for a conversation's later turns too, as before it skipped them
    /// (what the default is measured against)
    #[arg(long)]
    pub explore_continuations: bool,
    /// A request that matches nothing on slot engines goes to the least loaded engine, as
    /// before it took a free slot where the index holds least (what the default is
    /// measured against)
    #[arg(long)]
    pub misses_by_load: bool,
    /// On slot engines free slots are ranked first by how much of a request's prompt
    /// each engine holds, a shared head too short to stick included, as before room
    /// alone ranked them (what the default is measured against)
    #[arg(long)]
    pub free_slots_by_depth: bool,
    /// On slot engines a free slot is taken for its room only while the prompts waiting
    /// there hold a new conversation back by at most this many times its own prefill
    /// beyond the free slot that starts it soonest; `inf` ranks free slots by room alone,
    /// as before (what FREE_SLOT_WAIT_FACTOR, the default, is measured against)
    #[arg(
        long,
        value_name = "X",
        default_value_t = FREE_SLOT_WAIT_FACTOR,
        value_parser = wait_factor,
    )]
    pub free_slot_wait_factor: f64,
}

/// `--free-slot-wait-factor`: a number of at least 0, or `inf`.
fn wait_factor(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(x) if x >= 0.0 => Ok(x),
        _ => Err(format!(
            "must be a number of at least 0 or inf, got {value}"
        )),
    }
}

/// `--moved-prefill-payers`: a finite number, at least 1.
fn payers(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x.is_finite() && x >= 1.0 {
        Ok(x)
    } else {
        Err(format!("must be a number of at least 1, got {value}"))
    }
}

impl Default for GatewayArgs {
    fn default() -> Self {
        let affinity = PrefixAffinityConfig::default();
        Self {
            poll_interval_ms: GATEWAY_POLL_INTERVAL_MS,
            queue_window_secs: GridSettings::DEFAULT_QUEUE_WINDOW.as_secs(),
            count_in_flight: GridSettings::DEFAULT_COUNT_IN_FLIGHT,
            threshold: affinity.threshold,
            exploration: affinity.exploration,
            capacity: affinity.capacity,
            ttl_secs: affinity.ttl_secs,
            prefill_price: affinity.prefill_tokens_per_second,
            queued_request_seconds: affinity.queued_request_seconds,
            engine_feedback: affinity.engine_feedback,
            streams_count_whole: false,
            slots_unknown: false,
            moved_prefill_payers: MOVED_PREFILL_PAYERS,
            explore_continuations: false,
            misses_by_load: false,
            free_slots_by_depth: false,
            free_slot_wait_factor: FREE_SLOT_WAIT_FACTOR,
        }
    }
}

impl GatewayArgs {
    /// `prefix_affinity` as these flags set it, the rest at the library's defaults.
    // Field by field rather than a struct literal: the library's config structs may become
    // `#[non_exhaustive]`, which forbids literals outside the library.
    #[allow(clippy::field_reassign_with_default)]
    pub fn prefix_affinity(&self) -> PrefixAffinityConfig {
        let mut config = PrefixAffinityConfig::default();
        config.threshold = self.threshold;
        config.exploration = self.exploration;
        config.prefill_tokens_per_second = self.prefill_price;
        config.queued_request_seconds = self.queued_request_seconds;
        config.engine_feedback = self.engine_feedback;
        config.capacity = self.capacity;
        config.ttl_secs = self.ttl_secs;
        config
    }

    /// The affinity settings these flags set beyond the config file's: the gate's count of
    /// a moved prefill, whether a conversation's later turns are explored, and where a
    /// request that matches nothing goes on slot engines and how free slots rank.
    pub fn affinity(&self, settings: AffinitySettings) -> AffinitySettings {
        settings
            .with_moved_prefill_payers(self.moved_prefill_payers)
            .with_exploring_continuations(self.explore_continuations)
            .with_free_slot_placement(!self.misses_by_load)
            .with_free_slots_by_depth(self.free_slots_by_depth)
            .with_free_slot_wait_factor(self.free_slot_wait_factor)
    }

    /// How often the queues are polled.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    /// How far back the windowed queue depth looks.
    pub fn queue_window(&self) -> Duration {
        Duration::from_secs(self.queue_window_secs)
    }
}

/// A `prefix_affinity` number that `set` writes into the library's default config, checked
/// by the library's own `validate`: the flag obeys the config file's rules, and its error
/// names the setting.
fn affinity_setting(
    value: &str,
    set: impl FnOnce(&mut PrefixAffinityConfig, f64),
) -> Result<f64, String> {
    checked(number(value)?, set)
}

/// A whole number for one `prefix_affinity` setting, checked as [`affinity_setting`]
/// checks a number.
fn whole<T: std::str::FromStr + Copy>(
    value: &str,
    set: impl FnOnce(&mut PrefixAffinityConfig, T),
) -> Result<T, String> {
    let n = value
        .parse::<T>()
        .map_err(|_| format!("expected a whole number, got {value:?}"))?;
    checked(n, set)
}

/// A price flag: `auto`, or a number checked as [`affinity_setting`] checks one.
fn price(value: &str, set: impl FnOnce(&mut PrefixAffinityConfig, Price)) -> Result<Price, String> {
    let price = if value == "auto" {
        Price::Auto
    } else {
        Price::Fixed(number(value)?)
    };
    checked(price, set)
}

/// `value` once the default `prefix_affinity` config with it `set` passes validation.
fn checked<T: Copy>(value: T, set: impl FnOnce(&mut PrefixAffinityConfig, T)) -> Result<T, String> {
    let mut config = PrefixAffinityConfig::default();
    set(&mut config, value);
    config.validate().map_err(|error| error.to_string())?;
    Ok(value)
}

/// `--block-tokens`: a positive multiple of [`MIN_BLOCK_TOKENS`].
fn block_tokens(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n > 0 && n % MIN_BLOCK_TOKENS == 0 => Ok(n),
        _ => Err(format!(
            "must be a positive multiple of {MIN_BLOCK_TOKENS} (one keying block), got {value:?}"
        )),
    }
}

/// A count of at least 1.
fn at_least_one() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

fn number(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("expected a number, got {value:?}"))
}

/// A rate: a finite number above 0.
fn rate(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err(format!("must be a number above 0, got {value:?}"))
    }
}

/// A duration: a finite number of 0 or more.
fn non_negative(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("must be 0 or more, got {value:?}"))
    }
}

/// `--fail-share`: in [0, 1).
fn failure_share(value: &str) -> Result<f64, String> {
    let x = number(value)?;
    if (0.0..1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("must be in [0, 1), got {value:?}"))
    }
}
