//! The gateway's YAML configuration: parsing, defaults and validation.
//!
//! The file is read into [`GatewayConfig`], plain data that mirrors the YAML one to one:
//! `sites` and `grid_site_route.prefix_affinity` deserialize straight into the library's
//! own [`SiteSpec`] and [`PrefixAffinityConfig`] (its `serde` feature), so their defaults
//! live in the library alone. Unknown fields are refused, naming the field; every field
//! but `sites` has a default (the values of the config reference in the README).
//! [`GatewayConfig::validate`] then checks everything the gateway will rely on — with the
//! library's own validations for the grid and the `prefix_affinity` settings — and reads
//! the tag key file, so that a reload which would break routing is refused before
//! anything changes. Every [`ConfigError`] names the field and the bad value.
//!
//! ```yaml
//! listen: 127.0.0.1:8080
//! admin_listen: 127.0.0.1:9090
//! local_site: east              # default: the first site
//! role: consumer                # consumer | provider
//! provider_allowed_paths: [/v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings]
//! max_body_bytes: 10485760      # largest body buffered and keyed; larger ones stream unkeyed
//! forward_paths:                # consumer role; default: the OpenAI and Anthropic API paths
//!   - { path: /v1/chat/completions, methods: [POST] }
//!   - { path: "/v1/responses/{id}", methods: [GET, DELETE] }
//! timeouts:
//!   client_header_secs: 10      # the whole request head
//!   client_body_idle_secs: 30   # a stalled request body: 408
//!   upstream_connect_ms: 2000
//!   upstream_first_byte_secs: 600   # request sent -> response head: 504
//!   upstream_idle_secs: 120     # between two chunks of an answer: the stream is aborted
//! retries: { max_attempts: 3 }  # only requests that never reached an engine
//! outlier: { consecutive_failures: 5, ejection_secs: 30, stall_min_secs: 5 }
//! queue:                        # default: each endpoint's own waiting-requests gauge, found
//!   poll_interval_ms: 500       #   among vLLM's, SGLang's and llama.cpp's
//!   window_secs: 1
//!   count_in_flight: true       # this gateway's unanswered requests count in the load
//!   # metric: "vllm:num_requests_waiting"   # one gauge for every endpoint instead
//! sites:
//!   - name: east
//!     clusters:
//!       - name: east-a
//!         models: [demo-model]
//!         admit: true           # false: drained
//!         endpoints: [http://127.0.0.1:8001]
//! grid_site_route:
//!   prefix_affinity:
//!     enabled: true
//!     threshold: 0.8
//!     exploration: 0.02
//!     prefill_tokens_per_second: auto   # learned per cluster; a number fixes it
//!     prefill_prior_tokens_per_second: 10000   # with auto, where every cluster starts
//!     queued_request_seconds: auto      # learned per cluster; a number fixes it
//!     queued_request_prior_seconds: 2   # with auto, where every cluster starts
//!     engine_feedback: true   # forget what an engine reports it no longer caches
//!     capacity: 16384
//!     ttl_secs: 600
//!     tag_key_path: /etc/grid/tag.key   # optional; at least 32 bytes
//!     previous_tag_key_path: /etc/grid/tag.prev.key   # optional; the only way an old key verifies
//!     shared_index:                     # optional; needs tag_key_path
//!       redis_url: redis://127.0.0.1:6379/0
//!       key_prefix: grid-route          # the stream is KEY_PREFIX:index-events
//! ```
//!
//! Decisions the design leaves open:
//!
//! - `local_site` defaults to the first site listed. It may name a site that lists no
//!   cluster, or none of the listed sites: an operator takes a site's engines out that
//!   way. The gateway then warns, stores new conversations on the least loaded admitted
//!   cluster anywhere, and answers 404 for ids stored on the clusters that left.
//! - `listen` and `admin_listen` are `IP:PORT` (no host names: the gateway binds them
//!   before it could resolve anything).
//! - Endpoints are `http://` base URLs, optionally with a path prefix that requests are
//!   appended to (`http://10.0.0.7:8000/engine-a` sends `/v1/chat/completions` to
//!   `/engine-a/v1/chat/completions`); no query, no fragment, no TLS.
//! - `queue.metric` must be a valid Prometheus metric name; `queue.poll_interval_ms` from
//!   10 ms to a day and `queue.window_secs` at most a day and at least two polls;
//!   `max_body_bytes` at least 1.
//! - Every `timeouts`, `retries` and `outlier` value is at least 1 and at most a day (in
//!   its own unit: 86,400,000 for `upstream_connect_ms`), 100 attempts, or 10,000
//!   failures in a row: bounds that keep the time arithmetic they feed from overflowing.
//! - `provider_allowed_paths` are exact paths: each starts with `/` and holds no `?` or
//!   `#`.
//! - `prefix_affinity.shared_index` needs `prefix_affinity.tag_key_path`: replicas derive
//!   the keying seed they share from the tag key. Its `redis_url` must be a URL the
//!   `redis` crate accepts (`redis://`, `redis+unix://`); `key_prefix` must not be empty.
//!
//! ```
//! use grid_route_example::config::GatewayConfig;
//!
//! let yaml = "
//! sites:
//!   - name: east
//!     clusters:
//!       - { name: east-a, models: [demo-model], endpoints: [http://127.0.0.1:8001] }
//! ";
//! let config = GatewayConfig::from_yaml(yaml).unwrap();
//! assert_eq!(config.listen, "127.0.0.1:8080");
//! let checked = config.validate().unwrap();
//! assert_eq!(checked.grid_settings.local_site.as_deref(), Some("east"));
//!
//! let bad = GatewayConfig::from_yaml(&yaml.replace("east-a,", "east-a, modles: [x],"));
//! assert!(bad.unwrap_err().to_string().contains("unknown field `modles`"));
//! ```

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use grid_route_layer::config::{PrefixAffinity, PrefixAffinityConfig};
use grid_route_layer::grid::{Grid, GridError, GridSettings, GridSpec, SiteSpec};
use grid_route_layer::keying::DEFAULT_BODY_LIMIT_BYTES;
use grid_route_layer::pin::{TagKey, TagKeyError, TagKeys};
use serde::Deserialize;

use crate::forward_paths::{ForwardPathConfig, ForwardPaths};

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
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            metric: None,
            poll_interval_ms: 500,
            window_secs: GridSettings::DEFAULT_QUEUE_WINDOW.as_secs(),
            count_in_flight: GridSettings::DEFAULT_COUNT_IN_FLIGHT,
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
    pub prefix_affinity: PrefixAffinitySection,
}

/// `grid_site_route.prefix_affinity`: the library's settings, and where replicas share
/// their index.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PrefixAffinitySection {
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
    pub shared_index: Option<SharedIndexYaml>,
}

/// `grid_site_route.prefix_affinity.shared_index`: where replicas share their index.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SharedIndexYaml {
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

/// A configuration checked whole: what the gateway runs on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CheckedConfig {
    /// The client-facing address.
    pub listen: SocketAddr,
    /// The admin address.
    pub admin_listen: SocketAddr,
    /// What the gateway forwards.
    pub role: Role,
    /// The exact paths a provider forwards.
    pub provider_allowed_paths: Arc<[String]>,
    /// The keying body limit.
    pub max_body_bytes: usize,
    /// What the consumer role forwards.
    pub forward_paths: Arc<ForwardPaths>,
    /// Client and engine timeouts.
    pub timeouts: Timeouts,
    /// Attempts in all for a request that never reached an engine (at least 1).
    pub max_attempts: u32,
    /// Outlier ejection settings.
    pub outlier: OutlierSettings,
    /// The queue metric's name; `None` finds each endpoint's among
    /// [`KNOWN_QUEUE_METRICS`].
    pub queue_metric: Option<Arc<str>>,
    /// How often endpoints are polled.
    pub poll_interval: Duration,
    /// The sites and clusters, for [`Grid`].
    pub grid_spec: GridSpec,
    /// `local_site` (resolved) and the queue window, for [`Grid`].
    pub grid_settings: GridSettings,
    /// Affinity, index and tag key path settings.
    pub prefix_affinity: PrefixAffinity,
    /// The tag key read from `tag_key_path`, when set.
    pub tag_key: Option<TagKey>,
    /// The previous tag key read from `previous_tag_key_path`, when set.
    pub previous_tag_key: Option<TagKey>,
    /// Where replicas share their index, when set (then `tag_key` is set too).
    pub shared_index: Option<SharedIndexSettings>,
}

/// A checked `shared_index`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedIndexSettings {
    /// The Redis URL, as configured (it may hold a password: never log it whole).
    pub redis_url: String,
    /// The prefix of the Redis keys used.
    pub key_prefix: String,
}

impl CheckedConfig {
    /// The keys the pin layer signs and checks ids with.
    pub fn tag_keys(&self) -> TagKeys {
        TagKeys::new(self.tag_key.clone()).with_previous(self.previous_tag_key.clone())
    }
}

/// `timeouts`, as durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeouts {
    /// `client_header_secs`.
    pub client_header: Duration,
    /// `client_body_idle_secs`.
    pub client_body_idle: Duration,
    /// `upstream_connect_ms`.
    pub upstream_connect: Duration,
    /// `upstream_first_byte_secs`.
    pub upstream_first_byte: Duration,
    /// `upstream_idle_secs`.
    pub upstream_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        TimeoutsConfig::default().durations()
    }
}

impl TimeoutsConfig {
    fn durations(&self) -> Timeouts {
        Timeouts {
            client_header: Duration::from_secs(self.client_header_secs),
            client_body_idle: Duration::from_secs(self.client_body_idle_secs),
            upstream_connect: Duration::from_millis(self.upstream_connect_ms),
            upstream_first_byte: Duration::from_secs(self.upstream_first_byte_secs),
            upstream_idle: Duration::from_secs(self.upstream_idle_secs),
        }
    }
}

/// `outlier`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutlierSettings {
    /// Failures in a row that eject an endpoint (at least 1).
    pub consecutive_failures: u32,
    /// The first ejection's length.
    pub ejection: Duration,
    /// `stall_min_secs`.
    pub stall_min: Duration,
}

impl From<&OutlierConfig> for OutlierSettings {
    fn from(config: &OutlierConfig) -> Self {
        Self {
            consecutive_failures: config.consecutive_failures,
            ejection: Duration::from_secs(config.ejection_secs),
            stall_min: Duration::from_secs(config.stall_min_secs),
        }
    }
}

impl Default for OutlierSettings {
    fn default() -> Self {
        Self::from(&OutlierConfig::default())
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

    /// Checks every field (the first bad one is the error) and reads the tag key.
    pub fn validate(&self) -> Result<CheckedConfig, ConfigError> {
        let listen = socket_addr("listen", &self.listen)?;
        let admin_listen = socket_addr("admin_listen", &self.admin_listen)?;
        if listen == admin_listen && listen.port() != 0 {
            return Err(invalid(
                "admin_listen",
                &self.admin_listen,
                "must differ from listen",
            ));
        }
        for (i, path) in self.provider_allowed_paths.iter().enumerate() {
            if !path.starts_with('/') || path.contains(['?', '#']) {
                return Err(invalid(
                    format!("provider_allowed_paths[{i}]"),
                    path,
                    "must be an exact path starting with '/' (no query or fragment)",
                ));
            }
        }
        if self.max_body_bytes == 0 {
            return Err(invalid_number("max_body_bytes", 0, "must be at least 1"));
        }
        let forward_paths = self.forward_paths()?;
        self.check_failure_handling()?;
        let timeouts = self.timeouts.durations();
        self.check_queue()?;
        let grid_spec = GridSpec::new(self.sites.iter().cloned());
        let mut grid_settings = GridSettings::default()
            .with_queue_window(Duration::from_secs(self.queue.window_secs))
            .with_count_in_flight(self.queue.count_in_flight);
        grid_settings.local_site = self
            .local_site
            .clone()
            .or_else(|| self.sites.first().map(|site| site.name.clone()));
        // The grid validates itself; building a throwaway one checks without applying.
        Grid::new(&grid_spec, grid_settings.clone()).map_err(ConfigError::Grid)?;
        self.check_endpoint_urls()?;
        let prefix_affinity = self
            .grid_site_route
            .prefix_affinity
            .settings
            .validate()
            .map_err(ConfigError::PrefixAffinity)?;
        let tag_key = match &prefix_affinity.tag_key_path {
            Some(path) => Some(TagKey::from_file(path).map_err(ConfigError::TagKey)?),
            None => None,
        };
        // The library refused a previous key without a current one.
        let previous_tag_key = match &prefix_affinity.previous_tag_key_path {
            Some(path) => Some(TagKey::from_file(path).map_err(ConfigError::PreviousTagKey)?),
            None => None,
        };
        let shared_index = self.shared_index(tag_key.is_some())?;
        Ok(CheckedConfig {
            listen,
            admin_listen,
            role: self.role,
            provider_allowed_paths: self.provider_allowed_paths.clone().into(),
            max_body_bytes: self.max_body_bytes,
            forward_paths: Arc::new(forward_paths),
            timeouts,
            max_attempts: self.retries.max_attempts,
            outlier: OutlierSettings::from(&self.outlier),
            queue_metric: self.queue.metric.as_deref().map(Arc::from),
            poll_interval: Duration::from_millis(self.queue.poll_interval_ms),
            grid_spec,
            grid_settings,
            prefix_affinity,
            tag_key,
            previous_tag_key,
            shared_index,
        })
    }

    fn shared_index(&self, has_tag_key: bool) -> Result<Option<SharedIndexSettings>, ConfigError> {
        let Some(shared) = &self.grid_site_route.prefix_affinity.shared_index else {
            return Ok(None);
        };
        if !has_tag_key {
            return Err(ConfigError::Invalid {
                field: "grid_site_route.prefix_affinity.tag_key_path".to_owned(),
                value: "none".to_owned(),
                expected: "must be set when grid_site_route.prefix_affinity.shared_index is \
                           (replicas derive the keying seed they share from the tag key)"
                    .to_owned(),
            });
        }
        if redis::Client::open(shared.redis_url.as_str()).is_err() {
            // The URL itself may hold a password: the message shows its scheme only.
            let scheme = shared.redis_url.split(':').next().unwrap_or_default();
            return Err(invalid(
                "grid_site_route.prefix_affinity.shared_index.redis_url",
                &format!("{scheme}:..."),
                "must be a Redis URL (redis://HOST:PORT/DB)",
            ));
        }
        if shared.key_prefix.is_empty() {
            return Err(invalid(
                "grid_site_route.prefix_affinity.shared_index.key_prefix",
                "",
                "must not be empty",
            ));
        }
        Ok(Some(SharedIndexSettings {
            redis_url: shared.redis_url.clone(),
            key_prefix: shared.key_prefix.clone(),
        }))
    }

    /// `forward_paths`, checked.
    fn forward_paths(&self) -> Result<ForwardPaths, ConfigError> {
        ForwardPaths::parse(&self.forward_paths).map_err(|error| ConfigError::Invalid {
            field: error.field,
            value: format!("{:?}", error.value),
            expected: error.expected.to_owned(),
        })
    }

    /// `queue`: a metric name, a poll interval and a window in range.
    fn check_queue(&self) -> Result<(), ConfigError> {
        if let Some(metric) = &self.queue.metric
            && !is_metric_name(metric)
        {
            return Err(invalid(
                "queue.metric",
                metric,
                "must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
            ));
        }
        if self.queue.poll_interval_ms < MIN_POLL_INTERVAL_MS {
            return Err(invalid_number(
                "queue.poll_interval_ms",
                self.queue.poll_interval_ms,
                "must be at least 10",
            ));
        }
        // The poller adds the interval to the clock, and the grid the window: a day is
        // more than anyone means and far from overflowing either.
        if self.queue.poll_interval_ms > 86_400_000 {
            return Err(invalid_number(
                "queue.poll_interval_ms",
                self.queue.poll_interval_ms,
                "must be at most 86400000 (a day)",
            ));
        }
        if self.queue.window_secs > 86_400 {
            return Err(invalid_number(
                "queue.window_secs",
                self.queue.window_secs,
                "must be at most 86400 (a day)",
            ));
        }
        // A window shorter than two polls empties between them whenever a read is a little
        // late, and its endpoints flap to unmeasured. (A zero window is the grid's error.)
        let two_polls_ms = 2 * self.queue.poll_interval_ms;
        if self.queue.window_secs > 0 && self.queue.window_secs * 1000 < two_polls_ms {
            return Err(invalid_number(
                "queue.window_secs",
                self.queue.window_secs,
                &format!(
                    "must cover two polls of queue.poll_interval_ms ({} ms): at least {}",
                    self.queue.poll_interval_ms,
                    two_polls_ms.div_ceil(1000)
                ),
            ));
        }
        Ok(())
    }

    /// `timeouts`, `retries` and `outlier`: every value in its range. The upper bounds
    /// keep the time arithmetic they feed far from overflow (the longest ejection is
    /// [`MAX_EJECTION_FACTOR`](crate::gateway::MAX_EJECTION_FACTOR) × a day) and refuse
    /// values no operator means (a timeout of more than a day, a thousand attempts).
    fn check_failure_handling(&self) -> Result<(), ConfigError> {
        const DAY_SECS: u64 = 86_400;
        let t = &self.timeouts;
        let o = &self.outlier;
        for (field, value, max) in [
            (
                "timeouts.client_header_secs",
                t.client_header_secs,
                DAY_SECS,
            ),
            (
                "timeouts.client_body_idle_secs",
                t.client_body_idle_secs,
                DAY_SECS,
            ),
            (
                "timeouts.upstream_connect_ms",
                t.upstream_connect_ms,
                DAY_SECS * 1000,
            ),
            (
                "timeouts.upstream_first_byte_secs",
                t.upstream_first_byte_secs,
                DAY_SECS,
            ),
            (
                "timeouts.upstream_idle_secs",
                t.upstream_idle_secs,
                DAY_SECS,
            ),
            (
                "retries.max_attempts",
                u64::from(self.retries.max_attempts),
                100,
            ),
            (
                "outlier.consecutive_failures",
                u64::from(o.consecutive_failures),
                10_000,
            ),
            ("outlier.ejection_secs", o.ejection_secs, DAY_SECS),
            ("outlier.stall_min_secs", o.stall_min_secs, DAY_SECS),
        ] {
            if !(1..=max).contains(&value) {
                return Err(invalid_number(
                    field,
                    value,
                    &format!("must be from 1 to {max}"),
                ));
            }
        }
        Ok(())
    }

    fn check_endpoint_urls(&self) -> Result<(), ConfigError> {
        for (s, site) in self.sites.iter().enumerate() {
            for (c, cluster) in site.clusters.iter().enumerate() {
                for (e, url) in cluster.endpoints.iter().enumerate() {
                    if !is_endpoint_url(url) {
                        return Err(invalid(
                            format!("sites[{s}].clusters[{c}].endpoints[{e}]"),
                            url,
                            "must be an http:// base URL (http://HOST:PORT[/prefix], no query)",
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

fn socket_addr(field: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .parse()
        .map_err(|_| invalid(field, value, "must be IP:PORT"))
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the Prometheus metric name syntax.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_endpoint_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    uri.scheme_str() == Some("http")
        && uri.authority().is_some_and(|a| !a.host().is_empty())
        && uri.query().is_none()
        && !url.contains('#')
}

/// A refused text value: shown quoted.
fn invalid(field: impl Into<String>, value: &str, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        value: format!("{value:?}"),
        expected: expected.to_owned(),
    }
}

/// A refused number: shown as is.
fn invalid_number(field: &str, value: impl fmt::Display, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        value: value.to_string(),
        expected: expected.to_owned(),
    }
}

/// A configuration that was refused; the message names the field and the bad value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The path that was read.
        path: PathBuf,
        /// Why reading failed.
        source: io::Error,
    },
    /// The YAML is malformed, has an unknown field, misses `sites`, or holds a value of
    /// the wrong type; the message names the field and its place in the file.
    #[error("invalid config: {0}")]
    Parse(#[source] serde_norway::Error),
    /// `sites`, `local_site` or `queue.window_secs`, refused by the grid.
    #[error("{0}")]
    Grid(#[source] GridError),
    /// `grid_site_route.prefix_affinity`, refused by the library.
    // The library names `prefix_affinity.*`; the file nests it one level deeper.
    #[error("grid_site_route.{0}")]
    PrefixAffinity(#[source] grid_route_layer::config::ConfigError),
    /// `grid_site_route.prefix_affinity.tag_key_path` could not be used.
    #[error("grid_site_route.prefix_affinity.tag_key_path: {0}")]
    TagKey(#[source] TagKeyError),
    /// `grid_site_route.prefix_affinity.previous_tag_key_path` could not be used.
    #[error("grid_site_route.prefix_affinity.previous_tag_key_path: {0}")]
    PreviousTagKey(#[source] TagKeyError),
    /// Another field holds a value the gateway cannot use.
    #[error("{field} {expected}, got {value}")]
    Invalid {
        /// The field, as a path in the file (`queue.metric`).
        field: String,
        /// The value it holds, as shown in the message (text quoted).
        value: String,
        /// What it must be.
        expected: String,
    },
}

#[cfg(test)]
// Tests compare values that are parsed and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests {
    use grid_route_layer::config::Price;
    use grid_route_layer::grid::ClusterSpec;

    use super::*;

    const MINIMAL: &str = "
sites:
  - name: east
    clusters:
      - name: east-a
        models: [demo-model]
        endpoints: [http://127.0.0.1:8001]
";

    fn refused(yaml: &str) -> String {
        match GatewayConfig::from_yaml(yaml).and_then(|c| c.validate()) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn every_field_but_sites_has_the_designs_default() {
        let config = GatewayConfig::from_yaml(MINIMAL).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8080");
        assert_eq!(config.admin_listen, "127.0.0.1:9090");
        assert_eq!(config.role, Role::Consumer);
        assert_eq!(
            config.provider_allowed_paths,
            [
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/models",
                "/v1/embeddings"
            ]
        );
        assert_eq!(config.max_body_bytes, 10_485_760);
        assert_eq!(config.forward_paths, ForwardPathConfig::defaults());
        assert_eq!(config.timeouts.client_header_secs, 10);
        assert_eq!(config.timeouts.client_body_idle_secs, 30);
        assert_eq!(config.timeouts.upstream_connect_ms, 2000);
        assert_eq!(config.timeouts.upstream_first_byte_secs, 600);
        assert_eq!(config.timeouts.upstream_idle_secs, 120);
        assert_eq!(config.retries.max_attempts, 3);
        assert_eq!(config.outlier.consecutive_failures, 5);
        assert_eq!(config.outlier.ejection_secs, 30);
        assert_eq!(config.outlier.stall_min_secs, 5);
        // Each endpoint's own gauge, a 1 s window, in-flight requests counted.
        assert_eq!(config.queue.metric, None);
        assert_eq!(config.queue.poll_interval_ms, 500);
        assert_eq!(config.queue.window_secs, 1);
        assert!(config.queue.count_in_flight);
        assert!(config.sites[0].clusters[0].admit);
        let p = &config.grid_site_route.prefix_affinity.settings;
        assert!(p.enabled);
        assert_eq!(p.threshold, 0.8);
        assert_eq!(p.exploration, 0.02);
        // Both prices learned per cluster, from the contract's figures.
        assert_eq!(p.prefill_tokens_per_second, Price::Auto);
        assert_eq!(p.prefill_prior_tokens_per_second, 10_000.0);
        assert!(checked_affinity(&config).learns_prefill());
        assert_eq!(p.queued_request_seconds, Price::Auto);
        assert_eq!(p.queued_request_prior_seconds, 2.0);
        assert!(checked_affinity(&config).learns_queued());
        assert_eq!(p.capacity, 16_384);
        assert_eq!(p.ttl_secs, 600);
        assert_eq!(p.tag_key_path, None);
        let checked = config.validate().unwrap();
        assert_eq!(checked.grid_settings.local_site.as_deref(), Some("east"));
        assert_eq!(checked.poll_interval, Duration::from_millis(500));
        assert!(checked.tag_key.is_none());
        assert!(checked.grid_settings.count_in_flight);
        assert_eq!(checked.queue_metric, None);
    }

    #[test]
    fn an_empty_section_gives_the_library_defaults() {
        let empty = GatewayConfig::from_yaml(&format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{}} }}\n"
        ))
        .unwrap();
        let absent = GatewayConfig::from_yaml(MINIMAL).unwrap();
        for config in [&empty, &absent] {
            let section = &config.grid_site_route.prefix_affinity;
            assert_eq!(section.settings, PrefixAffinityConfig::default());
            assert_eq!(section.shared_index, None);
        }
        // A cluster that leaves out `admit` is the library's default cluster.
        assert_eq!(
            empty.sites[0].clusters[0],
            ClusterSpec::new("east-a")
                .with_models(["demo-model"])
                .with_endpoints(["http://127.0.0.1:8001"])
        );
        assert_eq!(empty.max_body_bytes, DEFAULT_BODY_LIMIT_BYTES);
    }

    #[test]
    fn prefill_auto_learns_from_the_prior_and_a_bad_price_is_refused() {
        let auto = GatewayConfig::from_yaml(&format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: \
             {{ prefill_tokens_per_second: auto, prefill_prior_tokens_per_second: 150 }} }}\n"
        ))
        .unwrap();
        let settings = checked_affinity(&auto);
        assert!(settings.learns_prefill());
        assert_eq!(settings.prefill_tokens_per_second(), 150.0);
        let bad = GatewayConfig::from_yaml(&format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ prefill_tokens_per_second: fast }} }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(bad.contains("prefill_tokens_per_second"), "{bad}");
        assert!(bad.contains("or `auto`"), "{bad}");
    }

    fn checked_affinity(config: &GatewayConfig) -> grid_route_layer::affinity::AffinitySettings {
        config.validate().unwrap().prefix_affinity.affinity
    }

    #[test]
    fn count_in_flight_reaches_the_grid_settings() {
        let config =
            GatewayConfig::from_yaml(&format!("{MINIMAL}queue: {{ count_in_flight: true }}\n"))
                .unwrap();
        assert!(config.queue.count_in_flight);
        assert!(config.validate().unwrap().grid_settings.count_in_flight);
    }

    #[test]
    fn the_designs_example_parses_as_written() {
        let yaml = r#"
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
local_site: east
role: consumer              # consumer | provider
provider_allowed_paths: [/v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings]
max_body_bytes: 10485760
queue: { metric: "vllm:num_requests_waiting", poll_interval_ms: 500, window_secs: 10 }
sites:
  - name: east
    clusters:
      - name: east-a
        models: [demo-model]
        admit: true         # false: drained
        endpoints: [http://127.0.0.1:8001]
grid_site_route:
  prefix_affinity:
    enabled: true
    threshold: 0.8
    exploration: 0.02
    prefill_tokens_per_second: 10000
    queued_request_seconds: 2
    engine_feedback: true
    capacity: 16384
    ttl_secs: 600
"#;
        let config = GatewayConfig::from_yaml(yaml).unwrap();
        // Every value it writes is the default, and the default local site is the first,
        // except where the defaults now learn: the design fixes vLLM's gauge, a 10 s window
        // and both prices (its numbers restore the fixed rule).
        let mut defaults = GatewayConfig::from_yaml(MINIMAL).unwrap();
        defaults.local_site = Some("east".to_owned());
        defaults.queue.metric = Some(VLLM_QUEUE_METRIC.to_owned());
        defaults.queue.window_secs = 10;
        let p = &mut defaults.grid_site_route.prefix_affinity.settings;
        p.prefill_tokens_per_second = Price::Fixed(10_000.0);
        p.queued_request_seconds = Price::Fixed(2.0);
        assert_eq!(config, defaults);
        config.validate().unwrap();
    }

    #[test]
    fn an_unknown_field_is_refused_naming_it() {
        let message = refused(&format!("{MINIMAL}lisen: 127.0.0.1:1\n"));
        assert!(message.contains("unknown field `lisen`"), "{message}");
        let message = refused(&MINIMAL.replace("models:", "modles: [x]\n        models:"));
        assert!(message.contains("unknown field `modles`"), "{message}");
        assert!(message.contains("sites[0].clusters[0]"), "{message}");
        let message = refused(&format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ treshold: 0.5 }} }}\n"
        ));
        assert!(message.contains("unknown field `treshold`"), "{message}");
        let message = refused(&format!("{MINIMAL}queue: {{ metrc: x }}\n"));
        assert!(message.contains("unknown field `metrc`"), "{message}");
        let message = refused(&format!("{MINIMAL}timeouts: {{ client_header: 1 }}\n"));
        assert!(
            message.contains("unknown field `client_header`"),
            "{message}"
        );
        let message = refused(&format!("{MINIMAL}outlier: {{ ejection: 1 }}\n"));
        assert!(message.contains("unknown field `ejection`"), "{message}");
    }

    #[test]
    fn sites_is_required() {
        let message = refused("listen: 127.0.0.1:8080\n");
        assert!(message.contains("missing field `sites`"), "{message}");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_field() {
        let message = refused(&format!("{MINIMAL}max_body_bytes: lots\n"));
        assert!(message.contains("max_body_bytes"), "{message}");
        // The library's fields are read flattened, so their type errors name the section.
        let message = refused(&format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ capacity: lots }} }}\n"
        ));
        assert!(
            message.contains("grid_site_route.prefix_affinity") && message.contains("lots"),
            "{message}"
        );
        let message = refused(&format!("{MINIMAL}role: broker\n"));
        assert!(
            message.contains("role") && message.contains("broker"),
            "{message}"
        );
    }

    #[test]
    fn validation_errors_name_the_field_and_the_value() {
        let cases = [
            (
                format!("{MINIMAL}listen: localhost:80\n"),
                r#"listen must be IP:PORT, got "localhost:80""#.to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 5 }}\n"),
                "queue.poll_interval_ms must be at least 10, got 5".to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 18446744073709551615 }}\n"),
                "queue.poll_interval_ms must be at most 86400000 (a day), got 18446744073709551615"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ window_secs: 86401 }}\n"),
                "queue.window_secs must be at most 86400 (a day), got 86401".to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ poll_interval_ms: 1000 }}\n"),
                "queue.window_secs must cover two polls of queue.poll_interval_ms (1000 ms): \
                 at least 2, got 1"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ metric: \"vllm num\" }}\n"),
                r#"queue.metric must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), got "vllm num""#.to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ window_secs: 0 }}\n"),
                "queue.window_secs must be greater than 0, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}local_site: North\n"),
                r#"local_site "North" is not a DNS-1123 label: it may hold only lowercase letters, digits and '-'"#.to_owned(),
            ),
            (
                MINIMAL.replace("name: east\n", "name: East\n"),
                r#"sites[0].name "East" is not a DNS-1123 label: it may hold only lowercase letters, digits and '-'"#.to_owned(),
            ),
            (
                MINIMAL.replace("http://127.0.0.1:8001", "https://engine:8001"),
                r#"sites[0].clusters[0].endpoints[0] must be an http:// base URL (http://HOST:PORT[/prefix], no query), got "https://engine:8001""#.to_owned(),
            ),
            (
                format!("{MINIMAL}grid_site_route: {{ prefix_affinity: {{ threshold: 1.5 }} }}\n"),
                "grid_site_route.prefix_affinity.threshold must be in (0, 1], got 1.5".to_owned(),
            ),
            (
                format!("{MINIMAL}provider_allowed_paths: [v1/models]\n"),
                r#"provider_allowed_paths[0] must be an exact path starting with '/' (no query or fragment), got "v1/models""#.to_owned(),
            ),
            (
                format!("{MINIMAL}max_body_bytes: 0\n"),
                "max_body_bytes must be at least 1, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}forward_paths: [{{ path: v1/x, methods: [GET] }}]\n"),
                r#"forward_paths[0].path must be a path starting with '/' whose segments are text or a whole {name} placeholder (no query, fragment, empty or dot segment), got "v1/x""#.to_owned(),
            ),
            (
                format!("{MINIMAL}forward_paths: [{{ path: /v1/x, methods: [get] }}]\n"),
                r#"forward_paths[0].methods[0] must be an HTTP method in upper case (GET, POST, DELETE, ...), got "get""#.to_owned(),
            ),
            (
                format!("{MINIMAL}timeouts: {{ upstream_idle_secs: 0 }}\n"),
                "timeouts.upstream_idle_secs must be from 1 to 86400, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}retries: {{ max_attempts: 0 }}\n"),
                "retries.max_attempts must be from 1 to 100, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ consecutive_failures: 0 }}\n"),
                "outlier.consecutive_failures must be from 1 to 10000, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ ejection_secs: 18446744073709551615 }}\n"),
                "outlier.ejection_secs must be from 1 to 86400, got 18446744073709551615"
                    .to_owned(),
            ),
            (
                format!("{MINIMAL}outlier: {{ stall_min_secs: 0 }}\n"),
                "outlier.stall_min_secs must be from 1 to 86400, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}timeouts: {{ upstream_first_byte_secs: 86401 }}\n"),
                "timeouts.upstream_first_byte_secs must be from 1 to 86400, got 86401"
                    .to_owned(),
            ),
        ];
        for (yaml, message) in cases {
            assert_eq!(refused(&yaml), message);
        }
    }

    #[test]
    fn a_tag_key_file_that_is_missing_or_short_is_refused() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let short = dir.join("short.key");
        std::fs::write(&short, b"too short").unwrap();
        let yaml = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {} }} }}\n",
            short.display()
        );
        let message = refused(&yaml);
        assert!(
            message.starts_with("grid_site_route.prefix_affinity.tag_key_path: tag key file"),
            "{message}"
        );
        let good = dir.join("good.key");
        std::fs::write(&good, [7u8; 32]).unwrap();
        let yaml = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {} }} }}\n",
            good.display()
        );
        let checked = GatewayConfig::from_yaml(&yaml).unwrap().validate().unwrap();
        assert!(checked.tag_key.is_some());
    }

    #[test]
    fn a_previous_tag_key_needs_a_current_one_and_a_readable_file() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let good = dir.join("good.key");
        std::fs::write(&good, [7u8; 32]).unwrap();
        let short = dir.join("short.key");
        std::fs::write(&short, b"too short").unwrap();
        let alone = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ previous_tag_key_path: {} }} }}\n",
            good.display()
        );
        assert!(
            refused(&alone).starts_with(
                "grid_site_route.prefix_affinity.previous_tag_key_path needs tag_key_path"
            ),
            "{}",
            refused(&alone)
        );
        let bad = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, previous_tag_key_path: {} }} }}\n",
            good.display(),
            short.display()
        );
        assert!(
            refused(&bad)
                .starts_with("grid_site_route.prefix_affinity.previous_tag_key_path: tag key file"),
            "{}",
            refused(&bad)
        );
        let both = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, previous_tag_key_path: {} }} }}\n",
            good.display(),
            good.display()
        );
        let checked = GatewayConfig::from_yaml(&both).unwrap().validate().unwrap();
        assert!(checked.previous_tag_key.is_some());
    }

    #[test]
    fn a_shared_index_without_a_tag_key_is_refused_naming_both_fields() {
        let yaml = format!(
            "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ shared_index: {{ redis_url: \"redis://127.0.0.1:6379/0\" }} }} }}\n"
        );
        assert_eq!(
            refused(&yaml),
            "grid_site_route.prefix_affinity.tag_key_path must be set when \
             grid_site_route.prefix_affinity.shared_index is (replicas derive the keying seed \
             they share from the tag key), got none"
        );
    }

    #[test]
    fn a_shared_index_defaults_its_key_prefix_and_checks_its_url() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let key = dir.join("tag.key");
        std::fs::write(&key, [9u8; 32]).unwrap();
        let with = |shared: &str| {
            format!(
                "{MINIMAL}grid_site_route: {{ prefix_affinity: {{ tag_key_path: {}, shared_index: {shared} }} }}\n",
                key.display()
            )
        };
        let checked =
            GatewayConfig::from_yaml(&with("{ redis_url: \"redis://127.0.0.1:6379/0\" }"))
                .unwrap()
                .validate()
                .unwrap();
        let shared = checked.shared_index.unwrap();
        assert_eq!(shared.redis_url, "redis://127.0.0.1:6379/0");
        assert_eq!(shared.key_prefix, "grid-route");
        let message = refused(&with("{ redis_url: \"http://secret@host\" }"));
        assert_eq!(
            message,
            r#"grid_site_route.prefix_affinity.shared_index.redis_url must be a Redis URL (redis://HOST:PORT/DB), got "http:...""#
        );
        let message = refused(&with("{ redis_url: \"redis://h\", key_prefix: \"\" }"));
        assert!(
            message.contains("key_prefix must not be empty"),
            "{message}"
        );
        let message = refused(&with("{ redis_uri: \"redis://h\" }"));
        assert!(message.contains("unknown field `redis_uri`"), "{message}");
    }

    #[test]
    fn metric_names_follow_the_prometheus_syntax() {
        for good in [
            VLLM_QUEUE_METRIC,
            SGLANG_QUEUE_METRIC,
            LLAMACPP_QUEUE_METRIC,
            "_x1",
        ] {
            assert!(is_metric_name(good), "{good}");
        }
        for bad in ["", "1abc", "a-b", "a b", "é"] {
            assert!(!is_metric_name(bad), "{bad}");
        }
    }
}
