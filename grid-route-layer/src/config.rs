//! The `prefix_affinity` settings as configured, and their validation.
//!
//! A gateway reads its config file however it likes and fills [`PrefixAffinityConfig`],
//! plain data whose [`Default`] is the documented defaults; with the `serde` feature it
//! deserializes straight from the file's `prefix_affinity` section (the example gateway's
//! YAML does). [`PrefixAffinityConfig::validate`] turns it into the typed settings the
//! layers take, or a [`PrefixAffinityError`] that names the field and the bad value, so a reload
//! that would break routing is refused before anything changes.
//!
//! ```
//! use grid_route_layer::config::PrefixAffinityConfig;
//!
//! let settings = PrefixAffinityConfig::default().validate().unwrap();
//! assert_eq!(settings.affinity.threshold(), 0.8);
//! assert_eq!(settings.index.capacity(), 16_384);
//!
//! let bad = PrefixAffinityConfig::default().with_threshold(1.5);
//! assert_eq!(
//!     bad.validate().unwrap_err().to_string(),
//!     "prefix_affinity.threshold must be in (0, 1], got 1.5"
//! );
//! ```
//!
//! The grid's own settings (`sites`, `local_site`, `queue.window_secs`) are validated by
//! [`Grid::new`](crate::grid::Grid::new).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::affinity::AffinitySettings;
use crate::index::{IndexSettings, IndexSettingsError};
use crate::keying::DEFAULT_SESSION_HEADERS;

/// `grid_site_route.prefix_affinity` as written in the config file.
///
/// Build it from [`Default`] with the `with_*` methods (it is `#[non_exhaustive]`, so that
/// a new setting is not a breaking change), or deserialize it with the `serde` feature:
/// every field is optional and an unknown one is refused.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct PrefixAffinityConfig {
    /// `enabled`: `false` routes on queue depth alone and reads no prompt.
    pub enabled: bool,
    /// `threshold`: share of the prompt a match shorter than 8 KiB must cover to stick,
    /// in (0, 1].
    pub threshold: f64,
    /// `exploration`: share of decisions that skip affinity, in [0, 1].
    pub exploration: f64,
    /// `prefill_tokens_per_second`: the prefill speed that prices a match (finite, > 0),
    /// or `auto` (the default) to learn each cluster's from its answers.
    #[cfg_attr(feature = "serde", serde(deserialize_with = "prefill_price"))]
    pub prefill_tokens_per_second: Price,
    /// `prefill_prior_tokens_per_second`: with `prefill_tokens_per_second: auto`, the
    /// speed every cluster starts from; finite, > 0.
    pub prefill_prior_tokens_per_second: f64,
    /// `queued_request_seconds`: what one more request in a cluster's load costs a new
    /// one, seconds (finite, > 0), or `auto` (the default) to learn each cluster's from
    /// its answers.
    #[cfg_attr(feature = "serde", serde(deserialize_with = "queued_price"))]
    pub queued_request_seconds: Price,
    /// `queued_request_prior_seconds`: with `queued_request_seconds: auto`, the price
    /// every cluster starts from; finite, > 0.
    pub queued_request_prior_seconds: f64,
    /// `engine_feedback`: when an engine reports far less of a sticky prompt cached than
    /// the index predicted, the index forgets what it recorded at that cluster before that
    /// prompt (the engine evicted it too).
    pub engine_feedback: bool,
    /// `session_affinity`: a request whose prefix match does not stick but whose session
    /// (`prompt_cache_key`, Anthropic `metadata.user_id`, a `session_headers` header) was
    /// answered at a cluster goes back there, through the load gate. `false` ignores
    /// sessions and reads no session header.
    pub session_affinity: bool,
    /// `session_headers`: headers that carry a session id, the first present wins; read
    /// when the body names none. Default `[x-session-id]`; `[]` reads none.
    pub session_headers: Vec<String>,
    /// `capacity`: index entries per cluster, at least 1.
    pub capacity: usize,
    /// `ttl_secs`: how long a confirmation counts, at least 1.
    pub ttl_secs: u64,
    /// `tag_key_path`: the key that signs tagged ids (at least 32 bytes); none leaves the
    /// tags' mac empty. Read by the pinning layer.
    pub tag_key_path: Option<PathBuf>,
    /// `previous_tag_key_path`: the key before `tag_key_path`, still verifying the ids it
    /// signed (never signing new ones) for as long as it is named; needs `tag_key_path`.
    pub previous_tag_key_path: Option<PathBuf>,
}

/// The name this type had when only the prefill speed could be learned.
#[deprecated(note = "renamed `Price`: `queued_request_seconds` takes one too")]
pub type PrefillPrice = Price;

/// A price of the load gate (`prefix_affinity.prefill_tokens_per_second`,
/// `prefix_affinity.queued_request_seconds`): a number, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Price {
    /// This figure, for every cluster.
    Fixed(f64),
    /// Learned per cluster from its answers, starting from the field's prior
    /// (`prefill_prior_tokens_per_second`, `queued_request_prior_seconds`).
    Auto,
}

impl Default for PrefixAffinityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: AffinitySettings::DEFAULT_THRESHOLD,
            exploration: AffinitySettings::DEFAULT_EXPLORATION,
            prefill_tokens_per_second: Price::Auto,
            prefill_prior_tokens_per_second: AffinitySettings::DEFAULT_PREFILL_TOKENS_PER_SECOND,
            queued_request_seconds: Price::Auto,
            queued_request_prior_seconds: AffinitySettings::DEFAULT_QUEUED_REQUEST_SECONDS,
            engine_feedback: true,
            session_affinity: true,
            session_headers: DEFAULT_SESSION_HEADERS.map(String::from).to_vec(),
            capacity: IndexSettings::DEFAULT_CAPACITY,
            ttl_secs: IndexSettings::DEFAULT_TTL.as_secs(),
            tag_key_path: None,
            previous_tag_key_path: None,
        }
    }
}

/// Builders in tower-http's style: `PrefixAffinityConfig::default().with_threshold(0.5)`.
/// Each sets the field of the same name and checks nothing; [`validate`] does.
///
/// [`validate`]: PrefixAffinityConfig::validate
impl PrefixAffinityConfig {
    /// Sets [`enabled`](Self::enabled).
    #[must_use]
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Sets [`threshold`](Self::threshold).
    #[must_use]
    pub fn with_threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold;
        self
    }

    /// Sets [`exploration`](Self::exploration).
    #[must_use]
    pub fn with_exploration(mut self, exploration: f64) -> Self {
        self.exploration = exploration;
        self
    }

    /// Sets [`prefill_tokens_per_second`](Self::prefill_tokens_per_second).
    #[must_use]
    pub fn with_prefill_tokens_per_second(mut self, price: Price) -> Self {
        self.prefill_tokens_per_second = price;
        self
    }

    /// Sets [`prefill_prior_tokens_per_second`](Self::prefill_prior_tokens_per_second).
    #[must_use]
    pub fn with_prefill_prior_tokens_per_second(mut self, tokens_per_second: f64) -> Self {
        self.prefill_prior_tokens_per_second = tokens_per_second;
        self
    }

    /// Sets [`queued_request_seconds`](Self::queued_request_seconds).
    #[must_use]
    pub fn with_queued_request_seconds(mut self, price: Price) -> Self {
        self.queued_request_seconds = price;
        self
    }

    /// Sets [`queued_request_prior_seconds`](Self::queued_request_prior_seconds).
    #[must_use]
    pub fn with_queued_request_prior_seconds(mut self, seconds: f64) -> Self {
        self.queued_request_prior_seconds = seconds;
        self
    }

    /// Sets [`engine_feedback`](Self::engine_feedback).
    #[must_use]
    pub fn with_engine_feedback(mut self, engine_feedback: bool) -> Self {
        self.engine_feedback = engine_feedback;
        self
    }

    /// Sets [`session_affinity`](Self::session_affinity).
    #[must_use]
    pub fn with_session_affinity(mut self, session_affinity: bool) -> Self {
        self.session_affinity = session_affinity;
        self
    }

    /// Sets [`session_headers`](Self::session_headers).
    #[must_use]
    pub fn with_session_headers<S: Into<String>>(
        mut self,
        headers: impl IntoIterator<Item = S>,
    ) -> Self {
        self.session_headers = headers.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`capacity`](Self::capacity).
    #[must_use]
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets [`ttl_secs`](Self::ttl_secs).
    #[must_use]
    pub fn with_ttl_secs(mut self, ttl_secs: u64) -> Self {
        self.ttl_secs = ttl_secs;
        self
    }

    /// Sets [`tag_key_path`](Self::tag_key_path).
    #[must_use]
    pub fn with_tag_key_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.tag_key_path = Some(path.into());
        self
    }

    /// Sets [`previous_tag_key_path`](Self::previous_tag_key_path).
    #[must_use]
    pub fn with_previous_tag_key_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.previous_tag_key_path = Some(path.into());
        self
    }
}

/// Validated `prefix_affinity` settings, split by the part that uses them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PrefixAffinity {
    /// For [`Affinity`](crate::affinity::Affinity).
    pub affinity: AffinitySettings,
    /// For [`PrefixIndex`](crate::index::PrefixIndex).
    pub index: IndexSettings,
    /// For [`KeyingLayer::session_headers`](crate::keying::KeyingLayer::session_headers),
    /// which reads none while `session_affinity` is off; a gateway marks them sensitive
    /// either way, since clients may send them.
    pub session_headers: Vec<http::HeaderName>,
    /// For the pinning layer.
    pub tag_key_path: Option<PathBuf>,
    /// For the pinning layer; set only beside `tag_key_path`.
    pub previous_tag_key_path: Option<PathBuf>,
}

impl PrefixAffinityConfig {
    /// Checks every field; the first bad one is the error.
    pub fn validate(&self) -> Result<PrefixAffinity, PrefixAffinityError> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(PrefixAffinityError::Threshold(self.threshold));
        }
        if !(0.0..=1.0).contains(&self.exploration) {
            return Err(PrefixAffinityError::Exploration(self.exploration));
        }
        let (prefill_tokens_per_second, learn_prefill) = match self.prefill_tokens_per_second {
            Price::Fixed(price) if is_positive(price) => (price, false),
            Price::Fixed(price) => return Err(PrefixAffinityError::PrefillTokensPerSecond(price)),
            Price::Auto if is_positive(self.prefill_prior_tokens_per_second) => {
                (self.prefill_prior_tokens_per_second, true)
            }
            Price::Auto => {
                return Err(PrefixAffinityError::PrefillPriorTokensPerSecond(
                    self.prefill_prior_tokens_per_second,
                ));
            }
        };
        let (queued_request_seconds, learn_queued) = match self.queued_request_seconds {
            Price::Fixed(price) if is_positive(price) => (price, false),
            Price::Fixed(price) => return Err(PrefixAffinityError::QueuedRequestSeconds(price)),
            Price::Auto if is_positive(self.queued_request_prior_seconds) => {
                (self.queued_request_prior_seconds, true)
            }
            Price::Auto => {
                return Err(PrefixAffinityError::QueuedRequestPriorSeconds(
                    self.queued_request_prior_seconds,
                ));
            }
        };
        let index = IndexSettings::new(self.capacity, Duration::from_secs(self.ttl_secs))
            .map_err(PrefixAffinityError::Index)?;
        if let (None, Some(previous)) = (&self.tag_key_path, &self.previous_tag_key_path) {
            return Err(PrefixAffinityError::PreviousTagKeyAlone(previous.clone()));
        }
        let session_headers = self
            .session_headers
            .iter()
            .map(|name| {
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| PrefixAffinityError::SessionHeader(name.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PrefixAffinity {
            affinity: AffinitySettings::checked(
                self.enabled,
                self.threshold,
                self.exploration,
                prefill_tokens_per_second,
                queued_request_seconds,
                self.engine_feedback,
                learn_prefill,
                learn_queued,
                self.session_affinity,
            ),
            index,
            session_headers,
            tag_key_path: self.tag_key_path.clone(),
            previous_tag_key_path: self.previous_tag_key_path.clone(),
        })
    }
}

/// A finite number above 0.
fn is_positive(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

/// Reads a [`Price`]: a number, or the word `auto`. Hand-written because serde's derives
/// have no "a number or this one word" shape short of `untagged`, whose error ("did not
/// match any variant") would not say what is expected.
#[cfg(feature = "serde")]
struct PriceVisitor(&'static str);

#[cfg(feature = "serde")]
impl serde::de::Visitor<'_> for PriceVisitor {
    type Value = Price;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The field is named here too: a format that buffers the section (serde's
        // `flatten`) reports the error without the field's path.
        write!(f, "{} as a number, or `auto`", self.0)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Price, E> {
        Ok(Price::Fixed(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Price, E> {
        Ok(Price::Fixed(v as f64))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Price, E> {
        Ok(Price::Fixed(v as f64))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Price, E> {
        if v == "auto" {
            Ok(Price::Auto)
        } else {
            Err(E::invalid_value(serde::de::Unexpected::Str(v), &self))
        }
    }
}

#[cfg(feature = "serde")]
fn prefill_price<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Price, D::Error> {
    deserializer.deserialize_any(PriceVisitor("prefill_tokens_per_second (tokens a second)"))
}

#[cfg(feature = "serde")]
fn queued_price<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Price, D::Error> {
    deserializer.deserialize_any(PriceVisitor("queued_request_seconds (seconds)"))
}

/// A refused `prefix_affinity` setting; the message names the field and the value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PrefixAffinityError {
    /// `threshold` is not in (0, 1].
    Threshold(f64),
    /// `exploration` is not in [0, 1].
    Exploration(f64),
    /// `prefill_tokens_per_second` is not a finite number above 0.
    PrefillTokensPerSecond(f64),
    /// With `prefill_tokens_per_second: auto`, `prefill_prior_tokens_per_second` is not a
    /// finite number above 0.
    PrefillPriorTokensPerSecond(f64),
    /// `queued_request_seconds` is not a finite number above 0.
    QueuedRequestSeconds(f64),
    /// With `queued_request_seconds: auto`, `queued_request_prior_seconds` is not a finite
    /// number above 0.
    QueuedRequestPriorSeconds(f64),
    /// `capacity` or `ttl_secs` was refused by the index.
    Index(IndexSettingsError),
    /// `previous_tag_key_path` is set without `tag_key_path`.
    PreviousTagKeyAlone(PathBuf),
    /// A `session_headers` entry is not a valid header name.
    SessionHeader(String),
}

impl fmt::Display for PrefixAffinityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Threshold(got) => {
                write!(f, "prefix_affinity.threshold must be in (0, 1], got {got}")
            }
            Self::Exploration(got) => {
                write!(
                    f,
                    "prefix_affinity.exploration must be in [0, 1], got {got}"
                )
            }
            Self::PrefillTokensPerSecond(got) => write!(
                f,
                "prefix_affinity.prefill_tokens_per_second must be a finite number greater \
                 than 0, got {got}"
            ),
            Self::PrefillPriorTokensPerSecond(got) => write!(
                f,
                "prefix_affinity.prefill_prior_tokens_per_second must be a finite number \
                 greater than 0, got {got}"
            ),
            Self::QueuedRequestSeconds(got) => write!(
                f,
                "prefix_affinity.queued_request_seconds must be a finite number greater \
                 than 0, got {got}"
            ),
            Self::QueuedRequestPriorSeconds(got) => write!(
                f,
                "prefix_affinity.queued_request_prior_seconds must be a finite number greater \
                 than 0, got {got}"
            ),
            Self::Index(err) => err.fmt(f),
            Self::PreviousTagKeyAlone(path) => write!(
                f,
                "prefix_affinity.previous_tag_key_path needs tag_key_path: a previous key only \
                 verifies beside a current one, got {:?}",
                path.display().to_string()
            ),
            Self::SessionHeader(name) => write!(
                f,
                "prefix_affinity.session_headers: {name:?} is not a valid header name"
            ),
        }
    }
}

impl std::error::Error for PrefixAffinityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Index(err) => Some(err),
            _ => None,
        }
    }
}

/// The name [`PrefixAffinityError`] had (the example gateway's config has a `ConfigError`
/// of its own, for the whole file).
#[deprecated(note = "renamed `PrefixAffinityError`")]
pub type ConfigError = PrefixAffinityError;

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn refused(config: &PrefixAffinityConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let settings = PrefixAffinityConfig::default().validate().unwrap();
        let a = settings.affinity;
        assert!(a.enabled());
        assert_eq!(a.threshold(), 0.8);
        assert_eq!(a.exploration(), 0.02);
        assert_eq!(a.prefill_tokens_per_second(), 10_000.0);
        assert_eq!(a.queued_request_seconds(), 2.0);
        assert_eq!(a, AffinitySettings::default());
        assert_eq!(settings.index, IndexSettings::default());
        assert_eq!(settings.index.ttl(), Duration::from_secs(600));
        assert_eq!(settings.tag_key_path, None);
        // Both prices are learned, from the contract's figures.
        assert!(a.learns_prefill());
        assert!(a.learns_queued());
        // Sessions are read, from the body and from `x-session-id`.
        assert!(a.session_affinity());
        assert_eq!(settings.session_headers, ["x-session-id"]);
    }

    #[test]
    fn session_headers_are_checked_and_kept_whether_sessions_are_on_or_off() {
        let two = PrefixAffinityConfig::default()
            .with_session_headers(["X-Session-Affinity", "x-session-id"])
            .validate()
            .unwrap();
        // Header names are case-insensitive: kept lower-case, in order.
        assert_eq!(two.session_headers, ["x-session-affinity", "x-session-id"]);
        let bad = PrefixAffinityConfig::default().with_session_headers(["x session"]);
        assert_eq!(
            refused(&bad),
            r#"prefix_affinity.session_headers: "x session" is not a valid header name"#
        );
        let off = PrefixAffinityConfig::default()
            .with_session_affinity(false)
            .validate()
            .unwrap();
        assert!(!off.affinity.session_affinity());
        // Still named, for a gateway to keep out of its logs; keying reads none.
        assert_eq!(off.session_headers, ["x-session-id"]);
        let none = PrefixAffinityConfig::default()
            .with_session_headers(Vec::<String>::new())
            .validate()
            .unwrap();
        assert!(none.session_headers.is_empty() && none.affinity.session_affinity());
    }

    #[test]
    fn settings_errors_name_the_field_and_the_value() {
        let base = PrefixAffinityConfig::default;
        let cases = [
            (
                base().with_threshold(1.5),
                "prefix_affinity.threshold must be in (0, 1], got 1.5",
            ),
            (
                base().with_threshold(0.0),
                "prefix_affinity.threshold must be in (0, 1], got 0",
            ),
            (
                base().with_threshold(f64::NAN),
                "prefix_affinity.threshold must be in (0, 1], got NaN",
            ),
            (
                base().with_exploration(-0.1),
                "prefix_affinity.exploration must be in [0, 1], got -0.1",
            ),
            (
                base().with_exploration(1.01),
                "prefix_affinity.exploration must be in [0, 1], got 1.01",
            ),
            (
                base().with_prefill_tokens_per_second(Price::Fixed(0.0)),
                "prefix_affinity.prefill_tokens_per_second must be a finite number greater \
                 than 0, got 0",
            ),
            (
                base().with_prefill_tokens_per_second(Price::Fixed(f64::INFINITY)),
                "prefix_affinity.prefill_tokens_per_second must be a finite number greater \
                 than 0, got inf",
            ),
            (
                base()
                    .with_prefill_tokens_per_second(Price::Auto)
                    .with_prefill_prior_tokens_per_second(-1.0),
                "prefix_affinity.prefill_prior_tokens_per_second must be a finite number \
                 greater than 0, got -1",
            ),
            (
                base().with_previous_tag_key_path("/etc/grid/old.key"),
                "prefix_affinity.previous_tag_key_path needs tag_key_path: a previous key \
                 only verifies beside a current one, got \"/etc/grid/old.key\"",
            ),
            (
                base().with_queued_request_seconds(Price::Fixed(-2.0)),
                "prefix_affinity.queued_request_seconds must be a finite number greater \
                 than 0, got -2",
            ),
            (
                base()
                    .with_queued_request_seconds(Price::Auto)
                    .with_queued_request_prior_seconds(f64::NAN),
                "prefix_affinity.queued_request_prior_seconds must be a finite number \
                 greater than 0, got NaN",
            ),
            (
                base().with_capacity(0),
                "prefix_affinity.capacity must be at least 1, got 0",
            ),
            (
                base().with_ttl_secs(0),
                "prefix_affinity.ttl_secs must be at least 1, got 0",
            ),
            (
                base().with_ttl_secs(u64::MAX),
                &format!(
                    "prefix_affinity.ttl_secs cannot be represented, got {}",
                    u64::MAX
                ),
            ),
        ];
        for (config, message) in cases {
            assert_eq!(refused(&config), message);
        }
    }

    #[test]
    fn the_edges_of_each_range_are_accepted() {
        let config = PrefixAffinityConfig::default()
            .with_threshold(1.0)
            .with_exploration(0.0);
        assert!(config.validate().is_ok());
        let config = PrefixAffinityConfig::default()
            .with_exploration(1.0)
            .with_enabled(false);
        assert!(!config.validate().unwrap().affinity.enabled());
    }

    #[test]
    fn numbers_for_both_prices_restore_the_fixed_rule_and_its_worked_example() {
        let settings = PrefixAffinityConfig::default()
            .with_prefill_tokens_per_second(Price::Fixed(10_000.0))
            .with_queued_request_seconds(Price::Fixed(2.0))
            .validate()
            .unwrap()
            .affinity;
        assert!(!settings.learns_prefill());
        assert!(!settings.learns_queued());
        assert!(!settings.learns_prices());
        // 40 blocks of 256 bytes ≈ 2,560 tokens ≈ 0.26 s ≈ 0.13 of a queued request; 400 ≈ 1.3.
        let worth = |blocks: u64| settings.match_worth(blocks * 256);
        assert!((worth(40) - 0.128).abs() < 1e-9, "{}", worth(40));
        assert!((worth(400) - 1.28).abs() < 1e-9, "{}", worth(400));
    }

    #[test]
    fn auto_queued_pricing_starts_from_its_prior_and_a_fixed_one_ignores_it() {
        let learned = PrefixAffinityConfig::default()
            .with_queued_request_prior_seconds(7.0)
            .validate()
            .unwrap()
            .affinity;
        assert!(learned.learns_queued());
        assert_eq!(learned.queued_request_seconds(), 7.0);
        let fixed = PrefixAffinityConfig::default()
            .with_queued_request_seconds(Price::Fixed(0.5))
            .with_queued_request_prior_seconds(-1.0)
            .validate()
            .unwrap()
            .affinity;
        assert!(!fixed.learns_queued());
        assert_eq!(fixed.queued_request_seconds(), 0.5);
    }

    #[test]
    fn auto_pricing_learns_from_the_prior_and_ignores_the_fixed_default() {
        let settings = PrefixAffinityConfig::default()
            .with_prefill_tokens_per_second(Price::Auto)
            .with_prefill_prior_tokens_per_second(150.0)
            .validate()
            .unwrap();
        assert!(settings.affinity.learns_prefill());
        assert_eq!(settings.affinity.prefill_tokens_per_second(), 150.0);
        // A fixed price does not read the prior, so an unused bad prior is no error.
        let fixed = PrefixAffinityConfig::default()
            .with_prefill_tokens_per_second(Price::Fixed(500.0))
            .with_prefill_prior_tokens_per_second(0.0)
            .validate()
            .unwrap();
        assert!(!fixed.affinity.learns_prefill());
        assert_eq!(fixed.affinity.prefill_tokens_per_second(), 500.0);
    }

    #[test]
    fn both_tag_key_paths_reach_the_pinning_settings() {
        let settings = PrefixAffinityConfig::default()
            .with_tag_key_path("/etc/grid/tag.key")
            .with_previous_tag_key_path("/etc/grid/old.key")
            .validate()
            .unwrap();
        assert_eq!(
            settings.tag_key_path.as_deref(),
            Some(std::path::Path::new("/etc/grid/tag.key"))
        );
        assert_eq!(
            settings.previous_tag_key_path.as_deref(),
            Some(std::path::Path::new("/etc/grid/old.key"))
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_deserialized_section_defaults_what_it_leaves_out_and_refuses_unknown_fields() {
        let read = |json: &str| serde_json::from_str::<PrefixAffinityConfig>(json);
        assert_eq!(read("{}").unwrap(), PrefixAffinityConfig::default());
        assert_eq!(
            read(r#"{"prefill_tokens_per_second": "auto", "capacity": 8}"#).unwrap(),
            PrefixAffinityConfig::default()
                .with_prefill_tokens_per_second(Price::Auto)
                .with_capacity(8)
        );
        assert_eq!(
            read(r#"{"prefill_tokens_per_second": 2500}"#)
                .unwrap()
                .prefill_tokens_per_second,
            Price::Fixed(2500.0)
        );
        assert_eq!(
            read(r#"{"queued_request_seconds": 7, "queued_request_prior_seconds": 3}"#).unwrap(),
            PrefixAffinityConfig::default()
                .with_queued_request_seconds(Price::Fixed(7.0))
                .with_queued_request_prior_seconds(3.0)
        );
        let slow = read(r#"{"queued_request_seconds": "slow"}"#)
            .unwrap_err()
            .to_string();
        assert!(slow.contains("queued_request_seconds (seconds)"), "{slow}");
        assert!(slow.contains("or `auto`"), "{slow}");
        let fast = read(r#"{"prefill_tokens_per_second": "fast"}"#)
            .unwrap_err()
            .to_string();
        assert!(fast.contains("prefill_tokens_per_second"), "{fast}");
        assert!(fast.contains("or `auto`"), "{fast}");
        let typo = read(r#"{"treshold": 0.5}"#).unwrap_err().to_string();
        assert!(typo.contains("unknown field `treshold`"), "{typo}");
        assert_eq!(
            read(r#"{"session_affinity": false, "session_headers": ["x-a"]}"#).unwrap(),
            PrefixAffinityConfig::default()
                .with_session_affinity(false)
                .with_session_headers(["x-a"])
        );
    }
}
