//! The `prefix_affinity` settings as configured, and their validation.
//!
//! A gateway reads its config file however it likes (the example gateway uses YAML) and
//! fills [`PrefixAffinityConfig`], plain data whose [`Default`] is the documented
//! defaults. [`PrefixAffinityConfig::validate`] turns it into the typed settings the
//! layers take, or a [`ConfigError`] that names the field and the bad value, so a reload
//! that would break routing is refused before anything changes.
//!
//! ```
//! use grid_route_layer::config::PrefixAffinityConfig;
//!
//! let settings = PrefixAffinityConfig::default().validate().unwrap();
//! assert_eq!(settings.affinity.threshold(), 0.8);
//! assert_eq!(settings.index.capacity(), 16_384);
//!
//! let bad = PrefixAffinityConfig { threshold: 1.5, ..PrefixAffinityConfig::default() };
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

/// `grid_site_route.prefix_affinity` as written in the config file.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAffinityConfig {
    /// `enabled`: `false` routes on queue depth alone and reads no prompt.
    pub enabled: bool,
    /// `threshold`: share of the prompt a match shorter than 8 KiB must cover to stick,
    /// in (0, 1].
    pub threshold: f64,
    /// `exploration`: share of decisions that skip affinity, in [0, 1].
    pub exploration: f64,
    /// `prefill_tokens_per_second`: the prefill speed that prices a match; finite, > 0.
    pub prefill_tokens_per_second: f64,
    /// `prefill_tokens_per_second: auto`: learn each cluster's prefill speed from its
    /// answers, starting from `prefill_tokens_per_second` (then the prior).
    pub learn_prefill: bool,
    /// `queued_request_seconds`: what one queued request costs; finite, > 0.
    pub queued_request_seconds: f64,
    /// `engine_feedback`: when an engine reports far less of a sticky prompt cached than
    /// the index predicted, the index forgets what it recorded at that cluster before that
    /// prompt (the engine evicted it too).
    pub engine_feedback: bool,
    /// `capacity`: index entries per cluster, at least 1.
    pub capacity: usize,
    /// `ttl_secs`: how long a confirmation counts, at least 1.
    pub ttl_secs: u64,
    /// `tag_key_path`: the key that signs tagged ids (at least 32 bytes); none leaves the
    /// tags' mac empty. Read by the pinning layer.
    pub tag_key_path: Option<PathBuf>,
}

impl Default for PrefixAffinityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: AffinitySettings::DEFAULT_THRESHOLD,
            exploration: AffinitySettings::DEFAULT_EXPLORATION,
            prefill_tokens_per_second: AffinitySettings::DEFAULT_PREFILL_TOKENS_PER_SECOND,
            learn_prefill: false,
            queued_request_seconds: AffinitySettings::DEFAULT_QUEUED_REQUEST_SECONDS,
            engine_feedback: true,
            capacity: IndexSettings::DEFAULT_CAPACITY,
            ttl_secs: IndexSettings::DEFAULT_TTL.as_secs(),
            tag_key_path: None,
        }
    }
}

/// Validated `prefix_affinity` settings, split by the part that uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAffinity {
    /// For [`Affinity`](crate::affinity::Affinity).
    pub affinity: AffinitySettings,
    /// For [`PrefixIndex`](crate::index::PrefixIndex).
    pub index: IndexSettings,
    /// For the pinning layer.
    pub tag_key_path: Option<PathBuf>,
}

impl PrefixAffinityConfig {
    /// Checks every field; the first bad one is the error.
    pub fn validate(&self) -> Result<PrefixAffinity, ConfigError> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(ConfigError::Threshold(self.threshold));
        }
        if !(0.0..=1.0).contains(&self.exploration) {
            return Err(ConfigError::Exploration(self.exploration));
        }
        if !(self.prefill_tokens_per_second.is_finite() && self.prefill_tokens_per_second > 0.0) {
            return Err(ConfigError::PrefillTokensPerSecond(
                self.prefill_tokens_per_second,
            ));
        }
        if !(self.queued_request_seconds.is_finite() && self.queued_request_seconds > 0.0) {
            return Err(ConfigError::QueuedRequestSeconds(
                self.queued_request_seconds,
            ));
        }
        let index = IndexSettings::new(self.capacity, Duration::from_secs(self.ttl_secs))
            .map_err(ConfigError::Index)?;
        Ok(PrefixAffinity {
            affinity: AffinitySettings::checked(
                self.enabled,
                self.threshold,
                self.exploration,
                self.prefill_tokens_per_second,
                self.queued_request_seconds,
                self.engine_feedback,
                self.learn_prefill,
            ),
            index,
            tag_key_path: self.tag_key_path.clone(),
        })
    }
}

/// A refused `prefix_affinity` setting; the message names the field and the value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `threshold` is not in (0, 1].
    Threshold(f64),
    /// `exploration` is not in [0, 1].
    Exploration(f64),
    /// `prefill_tokens_per_second` is not a finite number above 0.
    PrefillTokensPerSecond(f64),
    /// `queued_request_seconds` is not a finite number above 0.
    QueuedRequestSeconds(f64),
    /// `capacity` or `ttl_secs` was refused by the index.
    Index(IndexSettingsError),
}

impl fmt::Display for ConfigError {
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
            Self::QueuedRequestSeconds(got) => write!(
                f,
                "prefix_affinity.queued_request_seconds must be a finite number greater \
                 than 0, got {got}"
            ),
            Self::Index(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Index(err) => Some(err),
            _ => None,
        }
    }
}

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
    }

    #[test]
    fn settings_errors_name_the_field_and_the_value() {
        let base = PrefixAffinityConfig::default;
        let cases = [
            (
                PrefixAffinityConfig {
                    threshold: 1.5,
                    ..base()
                },
                "prefix_affinity.threshold must be in (0, 1], got 1.5",
            ),
            (
                PrefixAffinityConfig {
                    threshold: 0.0,
                    ..base()
                },
                "prefix_affinity.threshold must be in (0, 1], got 0",
            ),
            (
                PrefixAffinityConfig {
                    threshold: f64::NAN,
                    ..base()
                },
                "prefix_affinity.threshold must be in (0, 1], got NaN",
            ),
            (
                PrefixAffinityConfig {
                    exploration: -0.1,
                    ..base()
                },
                "prefix_affinity.exploration must be in [0, 1], got -0.1",
            ),
            (
                PrefixAffinityConfig {
                    exploration: 1.01,
                    ..base()
                },
                "prefix_affinity.exploration must be in [0, 1], got 1.01",
            ),
            (
                PrefixAffinityConfig {
                    prefill_tokens_per_second: 0.0,
                    ..base()
                },
                "prefix_affinity.prefill_tokens_per_second must be a finite number greater \
                 than 0, got 0",
            ),
            (
                PrefixAffinityConfig {
                    prefill_tokens_per_second: f64::INFINITY,
                    ..base()
                },
                "prefix_affinity.prefill_tokens_per_second must be a finite number greater \
                 than 0, got inf",
            ),
            (
                PrefixAffinityConfig {
                    queued_request_seconds: -2.0,
                    ..base()
                },
                "prefix_affinity.queued_request_seconds must be a finite number greater \
                 than 0, got -2",
            ),
            (
                PrefixAffinityConfig {
                    capacity: 0,
                    ..base()
                },
                "prefix_affinity.capacity must be at least 1, got 0",
            ),
            (
                PrefixAffinityConfig {
                    ttl_secs: 0,
                    ..base()
                },
                "prefix_affinity.ttl_secs must be at least 1, got 0",
            ),
            (
                PrefixAffinityConfig {
                    ttl_secs: u64::MAX,
                    ..base()
                },
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
        let config = PrefixAffinityConfig {
            threshold: 1.0,
            exploration: 0.0,
            ..PrefixAffinityConfig::default()
        };
        assert!(config.validate().is_ok());
        let config = PrefixAffinityConfig {
            exploration: 1.0,
            enabled: false,
            ..PrefixAffinityConfig::default()
        };
        assert!(!config.validate().unwrap().affinity.enabled());
    }
}
