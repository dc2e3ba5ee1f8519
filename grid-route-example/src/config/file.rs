//! The configuration file's types: plain data that mirrors the YAML one to one, with its
//! defaults ([`Default`] of each section is the value of an omitted section).

use std::path::{Path, PathBuf};

use grid_route_layer::config::PrefixAffinityConfig;
use grid_route_layer::grid::{GridSettings, SiteSpec};
use grid_route_layer::keying::DEFAULT_BODY_LIMIT_BYTES;
use serde::Deserialize;

use super::ConfigError;
use crate::forward_paths::ForwardPathConfig;

/// The queue metric of vLLM: requests waiting for a running slot.
pub const VLLM_QUEUE_METRIC: &str = "vllm:num_requests_waiting";
/// The queue metric of SGLang.
pub const SGLANG_QUEUE_METRIC: &str = "sglang:num_queue_reqs";
/// The queue metric of llama.cpp's server (with `--metrics`).
pub const LLAMACPP_QUEUE_METRIC: &str = "llamacpp:requests_deferred";
/// The waiting-requests gauges an endpoint's `/metrics` is searched for when `queue.metric`
/// is not set, in this order: the first one it serves is its queue signal.
pub const KNOWN_QUEUE_METRICS: [&str; 3] = [
    VLLM_QUEUE_METRIC,
    SGLANG_QUEUE_METRIC,
    LLAMACPP_QUEUE_METRIC,
];

/// The shortest queue poll interval accepted, in milliseconds.
pub const MIN_POLL_INTERVAL_MS: u64 = 10;

/// The whole configuration file, as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// The client-facing address, `IP:PORT`. Default `127.0.0.1:8080`.
    #[serde(default = "defaults::listen")]
    pub listen: String,
    /// The admin address (`/metrics`, `/healthz`), `IP:PORT`. Default `127.0.0.1:9090`.
    #[serde(default = "defaults::admin_listen")]
    pub admin_listen: String,
    /// The site this replica runs at. Default: the first site.
    #[serde(default)]
    pub local_site: Option<String>,
    /// `consumer` (route everything) or `provider` (forward only the allowed paths).
    #[serde(default)]
    pub role: Role,
    /// The exact paths a provider forwards (GET and POST).
    #[serde(default = "defaults::provider_allowed_paths")]
    pub provider_allowed_paths: Vec<String>,
    /// The largest request body buffered and keyed; larger bodies stream through unkeyed.
    /// Default 10 MiB, the library's [`DEFAULT_BODY_LIMIT_BYTES`].
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
    /// The paths (with their methods) the consumer role forwards; replaces the default
    /// list, [`DEFAULT_FORWARD_PATHS`](crate::forward_paths::DEFAULT_FORWARD_PATHS).
    #[serde(default = "ForwardPathConfig::defaults")]
    pub forward_paths: Vec<ForwardPathConfig>,
    /// How long clients and engines may take.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    /// Retries of requests that never reached an engine.
    #[serde(default)]
    pub retries: RetriesConfig,
    /// Outlier ejection of failing endpoints.
    #[serde(default)]
    pub outlier: OutlierConfig,
    /// The queue signal polled from each endpoint.
    #[serde(default)]
    pub queue: QueueConfig,
    /// The sites and their clusters, in the library's own spec type. Required.
    pub sites: Vec<SiteSpec>,
    /// Routing settings.
    #[serde(default)]
    pub grid_site_route: GridSiteRouteConfig,
}

/// `role`: what the gateway forwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Routes every request (the default).
    #[default]
    Consumer,
    /// Forwards only `provider_allowed_paths`, GET and POST: a gateway other sites call,
    /// which must not hand out stored state.
    Provider,
}

/// `queue`: where the load signal comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The Prometheus metric counting waiting requests, summed over its label sets, for
    /// every endpoint. Default: none, and each endpoint's is the first of
    /// [`KNOWN_QUEUE_METRICS`] its page serves.
    pub metric: Option<String>,
    /// How often each endpoint's `/metrics` is read. Default 500 ms.
    pub poll_interval_ms: u64,
    /// How far back the windowed worst queue depth looks. Default 1 s: two polls.
    pub window_secs: u64,
    /// Whether a cluster's load also counts this gateway's requests to it whose answer has
    /// not ended: `queue depth + in flight` instead of `queue depth`. Default `true`.
    pub count_in_flight: bool,
    /// A file holding one key the engines accept (what llama.cpp's, vLLM's or SGLang's
    /// `--api-key` was given; one of them where llama.cpp was given a comma-separated
    /// list), sent as `Authorization: Bearer KEY` with every read of every endpoint's
    /// `/metrics` and `/props`, over the endpoint's own `http://`. llama.cpp's server
    /// started with `--api-key` answers both 401 without it. Default: none, and the reads
    /// carry no credential.
    pub api_key_path: Option<PathBuf>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            metric: None,
            poll_interval_ms: 500,
            window_secs: GridSettings::DEFAULT_QUEUE_WINDOW.as_secs(),
            count_in_flight: GridSettings::DEFAULT_COUNT_IN_FLIGHT,
            api_key_path: None,
        }
    }
}

/// `timeouts`: how long clients and engines may take, each in the unit its name says.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TimeoutsConfig {
    /// A client must send its whole request head within this. Default 10 s.
    pub client_header_secs: u64,
    /// A request body that sends nothing for this long is answered 408. Default 30 s.
    pub client_body_idle_secs: u64,
    /// Connecting to an engine. Default 2000 ms.
    pub upstream_connect_ms: u64,
    /// From sending a request to the engine's response head (a long prompt's prefill
    /// can take minutes). Default 600 s.
    pub upstream_first_byte_secs: u64,
    /// Between two chunks of an engine's answer. Default 120 s.
    pub upstream_idle_secs: u64,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self {
            client_header_secs: 10,
            client_body_idle_secs: 30,
            upstream_connect_ms: 2000,
            upstream_first_byte_secs: 600,
            upstream_idle_secs: 120,
        }
    }
}

/// `retries`: requests that never reached an engine are tried on the next candidate.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RetriesConfig {
    /// Attempts in all, the first included (1: no retry). Default 3.
    pub max_attempts: u32,
}

impl Default for RetriesConfig {
    fn default() -> Self {
        Self { max_attempts: 3 }
    }
}

/// `outlier`: endpoints that keep failing are taken out of rotation for a while.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct OutlierConfig {
    /// Failures in a row (5xx, failed connects, timeouts) that eject an endpoint.
    /// Default 5.
    pub consecutive_failures: u32,
    /// How long a first ejection lasts; each repeat doubles it, up to 10×. Default 30 s.
    /// A 429's `Retry-After` holds an endpoint out for at most the longest ejection.
    pub ejection_secs: u64,
    /// The least time a request may wait for its answer's head before its endpoint counts
    /// as wedged and is ejected; the whole rule is in `gateway/outlier.rs`. Default 5 s.
    pub stall_min_secs: u64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            ejection_secs: 30,
            stall_min_secs: 5,
        }
    }
}

/// `grid_site_route`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct GridSiteRouteConfig {
    /// `prefix_affinity`.
    pub prefix_affinity: GatewayPrefixAffinityConfig,
}

/// `grid_site_route.prefix_affinity`: the library's settings, and where replicas share
/// their index.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GatewayPrefixAffinityConfig {
    /// Every other field of the section, read by the library, which validates it and holds
    /// its defaults.
    ///
    /// Flattened, so a value of the wrong type in one of these fields is reported at the
    /// section (`grid_site_route.prefix_affinity: invalid type: ...`), not at the field:
    /// serde buffers a flattened struct's fields before reading them.
    #[serde(flatten)]
    pub settings: PrefixAffinityConfig,
    /// Share confirmations and drops with the other replicas through Redis; none keeps the
    /// index per replica. Not the library's: it carries no index events itself.
    #[serde(default)]
    pub shared_index: Option<SharedIndexConfig>,
}

/// `grid_site_route.prefix_affinity.shared_index`: where replicas share their index.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SharedIndexConfig {
    /// The Redis to share through, `redis://[user:password@]host:port/db`.
    pub redis_url: String,
    /// The prefix of the Redis keys used. Default `grid-route`.
    #[serde(default = "defaults::key_prefix")]
    pub key_prefix: String,
}

mod defaults {
    pub(super) fn listen() -> String {
        "127.0.0.1:8080".to_owned()
    }
    pub(super) fn admin_listen() -> String {
        "127.0.0.1:9090".to_owned()
    }
    pub(super) fn provider_allowed_paths() -> Vec<String> {
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/v1/embeddings",
        ]
        .map(str::to_owned)
        .to_vec()
    }
    pub(super) fn max_body_bytes() -> usize {
        super::DEFAULT_BODY_LIMIT_BYTES
    }
    pub(super) fn key_prefix() -> String {
        "grid-route".to_owned()
    }
}

impl GatewayConfig {
    /// Parses YAML text. Unknown fields and values of the wrong type are refused, naming
    /// the field.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        serde_norway::from_str(text).map_err(ConfigError::Parse)
    }

    /// Reads and parses the file at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }
}
