//! The gateway's YAML configuration: the file's types and their defaults (`file.rs`:
//! [`GatewayConfig`] and its sections, `*Config`), the checked config the gateway runs on
//! (`checked.rs`: [`CheckedConfig`], `*Settings`) and why a config is refused (`error.rs`:
//! [`ConfigError`]).
//!
//! The file is read into [`GatewayConfig`], plain data that mirrors the YAML one to one:
//! `sites` and `grid_site_route.prefix_affinity` deserialize straight into the library's
//! own [`SiteSpec`](grid_route_layer::grid::SiteSpec) and [`PrefixAffinityConfig`](grid_route_layer::config::PrefixAffinityConfig) (its `serde` feature), so their defaults
//! live in the library alone. Unknown fields are refused, naming the field; every field
//! but `sites` has a default (the values of docs/configuration.md).
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
//!   # api_key_path: /etc/grid/engine.key   # engines started with --api-key: sent on every read
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

mod checked;
mod error;
mod file;

pub use checked::{CheckedConfig, OutlierSettings, PollCredential, TimeoutSettings};
pub use error::ConfigError;
pub use file::{
    GatewayConfig, GatewayPrefixAffinityConfig, GridSiteRouteConfig, KNOWN_QUEUE_METRICS,
    LLAMACPP_QUEUE_METRIC, MIN_POLL_INTERVAL_MS, OutlierConfig, QueueConfig, RetriesConfig, Role,
    SGLANG_QUEUE_METRIC, SharedIndexConfig, TimeoutsConfig, VLLM_QUEUE_METRIC,
};

#[cfg(test)]
// Tests compare values that are parsed and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests;
