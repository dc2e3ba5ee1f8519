//! The gateway's YAML configuration: parsing, defaults and validation.
//!
//! The file is read into [`GatewayConfig`], plain data that mirrors the YAML one to one.
//! Unknown fields are refused, naming the field; every field but `sites` has a default
//! (the values `DESIGN.md` shows). [`GatewayConfig::validate`] then checks everything the
//! gateway will rely on — with the library's own validations for the grid and the
//! `prefix_affinity` settings — and reads the tag key file, so that a reload which would
//! break routing is refused before anything changes. Every [`ConfigError`] names the field
//! and the bad value.
//!
//! ```yaml
//! listen: 127.0.0.1:8080
//! admin_listen: 127.0.0.1:9090
//! local_site: east              # default: the first site
//! role: consumer                # consumer | provider
//! provider_allowed_paths: [/v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings]
//! max_body_bytes: 10485760      # largest body buffered and keyed; larger ones stream unkeyed
//! queue: { metric: "vllm:num_requests_waiting", poll_interval_ms: 500, window_secs: 10,
//!          count_in_flight: false }
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
//!     prefill_tokens_per_second: 10000
//!     queued_request_seconds: 2
//!     capacity: 16384
//!     ttl_secs: 600
//!     tag_key_path: /etc/grid/tag.key   # optional; at least 32 bytes
//! ```
//!
//! Decisions the design leaves open:
//!
//! - `local_site` defaults to the first site listed.
//! - `listen` and `admin_listen` are `IP:PORT` (no host names: the gateway binds them
//!   before it could resolve anything).
//! - Endpoints are `http://` base URLs, optionally with a path prefix that requests are
//!   appended to (`http://10.0.0.7:8000/engine-a` sends `/v1/chat/completions` to
//!   `/engine-a/v1/chat/completions`); no query, no fragment, no TLS.
//! - `queue.metric` must be a valid Prometheus metric name; `queue.poll_interval_ms` at
//!   least 10; `max_body_bytes` at least 1.
//! - `provider_allowed_paths` are exact paths: each starts with `/` and holds no `?` or
//!   `#`.
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
use grid_route_layer::grid::{ClusterSpec, Grid, GridError, GridSettings, GridSpec, SiteSpec};
use grid_route_layer::pin::{TagKey, TagKeyError};
use serde::Deserialize;

/// The queue metric of vLLM (the default): requests waiting for a running slot.
pub const VLLM_QUEUE_METRIC: &str = "vllm:num_requests_waiting";
/// The queue metric of SGLang.
pub const SGLANG_QUEUE_METRIC: &str = "sglang:num_queue_reqs";
/// The queue metric of llama.cpp's server (with `--metrics`).
pub const LLAMACPP_QUEUE_METRIC: &str = "llamacpp:requests_deferred";

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
    /// Default 10 MiB.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
    /// The queue signal polled from each endpoint.
    #[serde(default)]
    pub queue: QueueConfig,
    /// The sites and their clusters. Required.
    pub sites: Vec<SiteConfig>,
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
    /// The Prometheus metric counting waiting requests, summed over its label sets:
    /// [`VLLM_QUEUE_METRIC`] (default), [`SGLANG_QUEUE_METRIC`], [`LLAMACPP_QUEUE_METRIC`].
    pub metric: String,
    /// How often each endpoint's `/metrics` is read. Default 500 ms.
    pub poll_interval_ms: u64,
    /// How far back the windowed worst queue depth looks. Default 10 s.
    pub window_secs: u64,
    /// Whether a cluster's load also counts this gateway's requests to it that have not
    /// answered yet: `queue depth + in flight` instead of `queue depth`. Default `false`.
    pub count_in_flight: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            metric: VLLM_QUEUE_METRIC.to_owned(),
            poll_interval_ms: 500,
            window_secs: GridSettings::DEFAULT_QUEUE_WINDOW.as_secs(),
            count_in_flight: false,
        }
    }
}

/// One entry of `sites`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SiteConfig {
    /// A DNS-1123 label.
    pub name: String,
    /// The site's backend clusters.
    pub clusters: Vec<ClusterConfig>,
}

/// One entry of a site's `clusters`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Unique within its site.
    pub name: String,
    /// The models its engines serve.
    pub models: Vec<String>,
    /// `false` drains the cluster. Default `true`.
    #[serde(default = "defaults::admit")]
    pub admit: bool,
    /// The engines' base URLs, `http://HOST:PORT[/prefix]`.
    pub endpoints: Vec<String>,
}

/// `grid_site_route`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct GridSiteRouteConfig {
    /// `prefix_affinity`.
    pub prefix_affinity: PrefixAffinityYaml,
}

/// `grid_site_route.prefix_affinity`, as the YAML spells it; the library's
/// [`PrefixAffinityConfig`] validates it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct PrefixAffinityYaml {
    /// `false` routes on queue depth alone and reads no prompt.
    pub enabled: bool,
    /// Share of the prompt a match shorter than 8 KiB must cover to stick.
    pub threshold: f64,
    /// Share of decisions that skip affinity.
    pub exploration: f64,
    /// Prefill speed that prices a match.
    pub prefill_tokens_per_second: f64,
    /// What one queued request costs, in seconds.
    pub queued_request_seconds: f64,
    /// Index entries per cluster.
    pub capacity: usize,
    /// How long a confirmation counts.
    pub ttl_secs: u64,
    /// The key that signs tagged ids (at least 32 bytes); none leaves macs empty.
    pub tag_key_path: Option<PathBuf>,
}

impl Default for PrefixAffinityYaml {
    fn default() -> Self {
        let d = PrefixAffinityConfig::default();
        Self {
            enabled: d.enabled,
            threshold: d.threshold,
            exploration: d.exploration,
            prefill_tokens_per_second: d.prefill_tokens_per_second,
            queued_request_seconds: d.queued_request_seconds,
            capacity: d.capacity,
            ttl_secs: d.ttl_secs,
            tag_key_path: d.tag_key_path,
        }
    }
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
        10 * 1024 * 1024
    }
    pub(super) fn admit() -> bool {
        true
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
    /// The queue metric's name.
    pub queue_metric: Arc<str>,
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
        if !is_metric_name(&self.queue.metric) {
            return Err(invalid(
                "queue.metric",
                &self.queue.metric,
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
        let grid_spec = self.grid_spec();
        let grid_settings = GridSettings {
            local_site: self
                .local_site
                .clone()
                .or_else(|| self.sites.first().map(|site| site.name.clone())),
            queue_window: Duration::from_secs(self.queue.window_secs),
            count_in_flight: self.queue.count_in_flight,
        };
        // The grid validates itself; building a throwaway one checks without applying.
        Grid::new(&grid_spec, grid_settings.clone()).map_err(ConfigError::Grid)?;
        self.check_endpoint_urls()?;
        let prefix_affinity = self
            .prefix_affinity()
            .validate()
            .map_err(ConfigError::PrefixAffinity)?;
        let tag_key = match &prefix_affinity.tag_key_path {
            Some(path) => Some(TagKey::from_file(path).map_err(ConfigError::TagKey)?),
            None => None,
        };
        Ok(CheckedConfig {
            listen,
            admin_listen,
            role: self.role,
            provider_allowed_paths: self.provider_allowed_paths.clone().into(),
            max_body_bytes: self.max_body_bytes,
            queue_metric: self.queue.metric.as_str().into(),
            poll_interval: Duration::from_millis(self.queue.poll_interval_ms),
            grid_spec,
            grid_settings,
            prefix_affinity,
            tag_key,
        })
    }

    fn grid_spec(&self) -> GridSpec {
        GridSpec {
            sites: self
                .sites
                .iter()
                .map(|site| SiteSpec {
                    name: site.name.clone(),
                    clusters: site
                        .clusters
                        .iter()
                        .map(|cluster| ClusterSpec {
                            name: cluster.name.clone(),
                            models: cluster.models.clone(),
                            admit: cluster.admit,
                            endpoints: cluster.endpoints.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn prefix_affinity(&self) -> PrefixAffinityConfig {
        let p = &self.grid_site_route.prefix_affinity;
        PrefixAffinityConfig {
            enabled: p.enabled,
            threshold: p.threshold,
            exploration: p.exploration,
            prefill_tokens_per_second: p.prefill_tokens_per_second,
            queued_request_seconds: p.queued_request_seconds,
            capacity: p.capacity,
            ttl_secs: p.ttl_secs,
            tag_key_path: p.tag_key_path.clone(),
        }
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
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The path that was read.
        path: PathBuf,
        /// Why reading failed.
        source: io::Error,
    },
    /// The YAML is malformed, has an unknown field, misses `sites`, or holds a value of
    /// the wrong type; the message names the field and its place in the file.
    Parse(serde_norway::Error),
    /// `sites`, `local_site` or `queue.window_secs`, refused by the grid.
    Grid(GridError),
    /// `grid_site_route.prefix_affinity`, refused by the library.
    PrefixAffinity(grid_route_layer::config::ConfigError),
    /// `grid_site_route.prefix_affinity.tag_key_path` could not be used.
    TagKey(TagKeyError),
    /// Another field holds a value the gateway cannot use.
    Invalid {
        /// The field, as a path in the file (`queue.metric`).
        field: String,
        /// The value it holds, as shown in the message (text quoted).
        value: String,
        /// What it must be.
        expected: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => {
                write!(f, "cannot read config file {}: {source}", path.display())
            }
            Self::Parse(error) => write!(f, "invalid config: {error}"),
            Self::Grid(error) => error.fmt(f),
            // The library names `prefix_affinity.*`; the file nests it one level deeper.
            Self::PrefixAffinity(error) => write!(f, "grid_site_route.{error}"),
            Self::TagKey(error) => {
                write!(f, "grid_site_route.prefix_affinity.tag_key_path: {error}")
            }
            Self::Invalid {
                field,
                value,
                expected,
            } => write!(f, "{field} {expected}, got {value}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            Self::Parse(error) => Some(error),
            Self::Grid(error) => Some(error),
            Self::PrefixAffinity(error) => Some(error),
            Self::TagKey(error) => Some(error),
            Self::Invalid { .. } => None,
        }
    }
}

#[cfg(test)]
// Tests compare values that are parsed and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests {
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
        assert_eq!(config.queue.metric, "vllm:num_requests_waiting");
        assert_eq!(config.queue.poll_interval_ms, 500);
        assert_eq!(config.queue.window_secs, 10);
        assert!(!config.queue.count_in_flight);
        assert!(config.sites[0].clusters[0].admit);
        let p = &config.grid_site_route.prefix_affinity;
        assert!(p.enabled);
        assert_eq!(p.threshold, 0.8);
        assert_eq!(p.exploration, 0.02);
        assert_eq!(p.prefill_tokens_per_second, 10_000.0);
        assert_eq!(p.queued_request_seconds, 2.0);
        assert_eq!(p.capacity, 16_384);
        assert_eq!(p.ttl_secs, 600);
        assert_eq!(p.tag_key_path, None);
        let checked = config.validate().unwrap();
        assert_eq!(checked.grid_settings.local_site.as_deref(), Some("east"));
        assert_eq!(checked.poll_interval, Duration::from_millis(500));
        assert!(checked.tag_key.is_none());
        assert!(!checked.grid_settings.count_in_flight);
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
    capacity: 16384
    ttl_secs: 600
"#;
        let config = GatewayConfig::from_yaml(yaml).unwrap();
        // Every value it writes is the default, and the default local site is the first.
        let mut defaults = GatewayConfig::from_yaml(MINIMAL).unwrap();
        defaults.local_site = Some("east".to_owned());
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
                format!("{MINIMAL}queue: {{ metric: \"vllm num\" }}\n"),
                r#"queue.metric must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), got "vllm num""#.to_owned(),
            ),
            (
                format!("{MINIMAL}queue: {{ window_secs: 0 }}\n"),
                "queue.window_secs must be greater than 0, got 0".to_owned(),
            ),
            (
                format!("{MINIMAL}local_site: north\n"),
                r#"local_site "north" is not one of the configured sites"#.to_owned(),
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
        ];
        for (yaml, message) in cases {
            assert_eq!(refused(&yaml), message);
        }
    }

    #[test]
    fn a_tag_key_file_that_is_missing_or_short_is_refused() {
        let dir = std::env::temp_dir().join(format!("grid-route-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        std::fs::remove_dir_all(&dir).unwrap();
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
