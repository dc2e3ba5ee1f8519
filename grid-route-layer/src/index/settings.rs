//! The index's two settings and their validation.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

/// How much a [`PrefixIndex`](super::PrefixIndex) remembers and for how long.
///
/// Built only through [`IndexSettings::new`] (or [`Default`]), so a value of this type is
/// always valid: the index never has to handle a zero capacity or a TTL the clock cannot
/// represent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSettings {
    capacity: NonZeroUsize,
    ttl: Duration,
}

impl IndexSettings {
    /// Entries per cluster when not configured (`prefix_affinity.capacity`).
    pub const DEFAULT_CAPACITY: usize = 16_384;
    /// How long a confirmation counts when not configured (`prefix_affinity.ttl_secs`).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
    /// The shortest TTL accepted; deadlines are kept in whole seconds.
    pub const MIN_TTL: Duration = Duration::from_secs(1);

    /// Validates `capacity` (entries per cluster, at least 1) and `ttl` (at least one second,
    /// and representable on the monotonic clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use grid_route_layer::index::IndexSettings;
    ///
    /// let err = IndexSettings::new(0, Duration::from_secs(600)).unwrap_err();
    /// assert_eq!(err.to_string(), "prefix_affinity.capacity must be at least 1, got 0");
    /// ```
    pub fn new(capacity: usize, ttl: Duration) -> Result<Self, IndexSettingsError> {
        let capacity =
            NonZeroUsize::new(capacity).ok_or(IndexSettingsError::CapacityTooSmall { capacity })?;
        if ttl < Self::MIN_TTL {
            return Err(IndexSettingsError::TtlTooShort { ttl });
        }
        // Deadlines are `now + ttl` on the monotonic clock; a TTL it cannot add to the
        // current instant would overflow there, so it is refused here, once, at load.
        if Instant::now().checked_add(ttl).is_none() {
            return Err(IndexSettingsError::TtlUnrepresentable { ttl });
        }
        Ok(Self { capacity, ttl })
    }

    /// Entries each cluster's LRU holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    pub(crate) fn capacity_nonzero(&self) -> NonZeroUsize {
        self.capacity
    }

    /// How long a confirmed key counts after its latest confirmation.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl Default for IndexSettings {
    fn default() -> Self {
        Self {
            // Checked at compile time: the default is not zero.
            capacity: const {
                match NonZeroUsize::new(Self::DEFAULT_CAPACITY) {
                    Some(capacity) => capacity,
                    None => panic!("DEFAULT_CAPACITY is zero"),
                }
            },
            ttl: Self::DEFAULT_TTL,
        }
    }
}

/// Index settings that were refused; the message names the config field and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexSettingsError {
    /// `prefix_affinity.capacity` was 0.
    CapacityTooSmall {
        /// The refused capacity.
        capacity: usize,
    },
    /// `prefix_affinity.ttl_secs` was under one second.
    TtlTooShort {
        /// The refused TTL.
        ttl: Duration,
    },
    /// `prefix_affinity.ttl_secs` is too large for the monotonic clock to add to now.
    TtlUnrepresentable {
        /// The refused TTL.
        ttl: Duration,
    },
}

/// Writes a TTL in the unit of its config field: whole seconds when it is whole.
struct TtlSecs(Duration);

impl fmt::Display for TtlSecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}", self.0.as_secs())
        } else {
            write!(f, "{}", self.0.as_secs_f64())
        }
    }
}

impl fmt::Display for IndexSettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CapacityTooSmall { capacity } => {
                write!(
                    f,
                    "prefix_affinity.capacity must be at least 1, got {capacity}"
                )
            }
            Self::TtlTooShort { ttl } => write!(
                f,
                "prefix_affinity.ttl_secs must be at least 1, got {}",
                TtlSecs(*ttl)
            ),
            Self::TtlUnrepresentable { ttl } => write!(
                f,
                "prefix_affinity.ttl_secs cannot be represented, got {}",
                TtlSecs(*ttl)
            ),
        }
    }
}

impl std::error::Error for IndexSettingsError {}
