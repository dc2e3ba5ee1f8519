//! The checked configuration: [`GatewayConfig::validate`] checks every field the gateway
//! will rely on (with the library's own validations for the grid and `prefix_affinity`)
//! and reads the tag key files, into [`CheckedConfig`], what the gateway runs on.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use grid_route_layer::config::PrefixAffinity;
use grid_route_layer::grid::{Grid, GridSettings, GridSpec};
use grid_route_layer::pin::{TagKey, TagKeys};
use http::HeaderValue;

use super::ConfigError;
use super::error::{invalid, invalid_number};
use super::file::{
    GatewayConfig, MIN_POLL_INTERVAL_MS, OutlierConfig, Role, SharedIndexConfig, TimeoutsConfig,
};
use crate::forward_paths::ForwardPaths;

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
    pub timeouts: TimeoutSettings,
    /// Attempts in all for a request that never reached an engine (at least 1).
    pub max_attempts: u32,
    /// Outlier ejection settings.
    pub outlier: OutlierSettings,
    /// The queue metric's name; `None` finds each endpoint's among
    /// [`KNOWN_QUEUE_METRICS`](super::KNOWN_QUEUE_METRICS).
    pub queue_metric: Option<Arc<str>>,
    /// How often endpoints are polled.
    pub poll_interval: Duration,
    /// The credential the poller's reads carry, read from `queue.api_key_path`.
    pub poll_credential: Option<PollCredential>,
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
    /// Where replicas share their index, when set (then `tag_key` is set too), as the file
    /// says it once checked.
    pub shared_index: Option<SharedIndexConfig>,
}

impl CheckedConfig {
    /// The keys the pin layer signs and checks ids with.
    pub fn tag_keys(&self) -> TagKeys {
        TagKeys::new(self.tag_key.clone()).with_previous(self.previous_tag_key.clone())
    }
}

/// The `Authorization` header the poller's reads of `/metrics` and `/props` carry:
/// `Bearer` and the key `queue.api_key_path` holds. Marked sensitive, and its `Debug`
/// shows no part of the key.
#[derive(Clone, PartialEq, Eq)]
pub struct PollCredential(HeaderValue);

impl PollCredential {
    /// Reads the key from `path`: its text, without the line break or spaces around it.
    /// Refused when the file cannot be read, is empty, or holds a character a header
    /// cannot carry (a line break inside, a control character); the message never shows
    /// the key.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let refused = |why: &str| {
            invalid(
                "queue.api_key_path",
                &path.display().to_string(),
                &format!("must name a file holding the engines' API key on one line ({why})"),
            )
        };
        let text = std::fs::read(path).map_err(|e| refused(&e.to_string()))?;
        let key = text.trim_ascii();
        if key.is_empty() {
            return Err(refused("the file is empty"));
        }
        // Visible ASCII only: what `--api-key` takes on a command line, and no byte a
        // header would carry differently from what the engine compares.
        if !key.iter().all(u8::is_ascii_graphic) {
            return Err(refused(
                "the key holds a space, a line break or a character outside visible ASCII",
            ));
        }
        let mut value = HeaderValue::from_bytes(&[b"Bearer ", key].concat())
            .map_err(|_| refused("the key cannot be sent in a header"))?;
        value.set_sensitive(true);
        Ok(Self(value))
    }

    /// The header's value, `Bearer KEY`, marked sensitive.
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Debug for PollCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PollCredential(..)")
    }
}

/// `timeouts`, as durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimeoutSettings {
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

impl Default for TimeoutSettings {
    fn default() -> Self {
        TimeoutsConfig::default().durations()
    }
}

impl TimeoutsConfig {
    fn durations(&self) -> TimeoutSettings {
        TimeoutSettings {
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
        let poll_credential = match &self.queue.api_key_path {
            Some(path) => Some(PollCredential::from_file(path)?),
            None => None,
        };
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
            poll_credential,
            grid_spec,
            grid_settings,
            prefix_affinity,
            tag_key,
            previous_tag_key,
            shared_index,
        })
    }

    fn shared_index(&self, has_tag_key: bool) -> Result<Option<SharedIndexConfig>, ConfigError> {
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
        Ok(Some(shared.clone()))
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
pub(super) fn is_metric_name(name: &str) -> bool {
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
