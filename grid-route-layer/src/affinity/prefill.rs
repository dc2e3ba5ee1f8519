//! The prefill price learned per cluster (`prefill_tokens_per_second: auto`), as plain code.
//!
//! The load gate prices a match by the prefill it saves, so it needs each cluster's prefill
//! speed. A fixed figure is wrong by orders of magnitude somewhere (10,000 tokens a second
//! is a GPU; one CPU thread does about 100). Every answer tells how many prompt tokens the
//! engine had to prefill (prompt − cached, from its `usage`) and the gateway knows how long
//! the answer took to start: their ratio is a sample of the cluster's prefill speed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::grid::ClusterId;

/// The slowest prefill speed an estimate may reach, tokens a second.
pub const MIN_PREFILL_TOKENS_PER_SECOND: f64 = 10.0;
/// The fastest prefill speed an estimate may reach, tokens a second.
pub const MAX_PREFILL_TOKENS_PER_SECOND: f64 = 10_000_000.0;
/// Answers that prefilled fewer tokens teach nothing: their time is mostly the network,
/// the first decoded token and the engine's own overhead, not prefill.
pub const MIN_SAMPLE_TOKENS: u64 = 64;
/// The weight of each new sample in the moving average: about the last ten answers count.
pub const PREFILL_SMOOTHING: f64 = 0.2;

/// One cluster's prefill speed: an exponentially weighted moving average of the samples
/// *uncached prompt tokens / seconds from dispatch to the answer's start*, starting at a
/// prior and bounded to [[`MIN_PREFILL_TOKENS_PER_SECOND`], [`MAX_PREFILL_TOKENS_PER_SECOND`]].
///
/// Nothing is subtracted from the time: time spent queued at the engine and the network
/// are not known, so they count as prefill time. The estimate is thus a lower bound on the
/// engine's real speed under its real load — the speed a request sent there meets.
///
/// ```
/// use std::time::Duration;
///
/// use grid_route_layer::affinity::PrefillEstimate;
///
/// let mut estimate = PrefillEstimate::new(10_000.0);
/// // A CPU engine: 1,000 uncached tokens took 10 s.
/// for _ in 0..60 {
///     estimate.observe(1_000, Duration::from_secs(10));
/// }
/// assert!((estimate.tokens_per_second() - 100.0).abs() < 1.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillEstimate {
    tokens_per_second: f64,
}

impl PrefillEstimate {
    /// An estimate that starts at `prior` tokens a second (bounded).
    pub fn new(prior: f64) -> Self {
        Self {
            tokens_per_second: bounded(prior),
        }
    }

    /// The estimated prefill speed, tokens a second.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens_per_second
    }

    /// Learns from an answer that prefilled `uncached_tokens` and started `elapsed` after
    /// dispatch. Returns whether it was a sample: fewer than [`MIN_SAMPLE_TOKENS`], or no
    /// time at all, is not.
    pub fn observe(&mut self, uncached_tokens: u64, elapsed: Duration) -> bool {
        let seconds = elapsed.as_secs_f64();
        if uncached_tokens < MIN_SAMPLE_TOKENS || seconds <= 0.0 {
            return false;
        }
        let sample = bounded(uncached_tokens as f64 / seconds);
        self.tokens_per_second += PREFILL_SMOOTHING * (sample - self.tokens_per_second);
        true
    }
}

fn bounded(rate: f64) -> f64 {
    if rate.is_nan() {
        return MIN_PREFILL_TOKENS_PER_SECOND;
    }
    rate.clamp(MIN_PREFILL_TOKENS_PER_SECOND, MAX_PREFILL_TOKENS_PER_SECOND)
}

/// Every cluster's [`PrefillEstimate`], shared by the layers that learn (feedback) and the
/// one that prices (affinity).
#[derive(Debug, Default)]
pub struct PrefillRates {
    // A plain mutex: one short map operation per answer and per decision.
    rates: Mutex<HashMap<ClusterId, PrefillEstimate>>,
}

impl PrefillRates {
    /// `cluster`'s estimated speed; `prior` while it has learned nothing.
    pub fn rate(&self, cluster: &ClusterId, prior: f64) -> f64 {
        self.lock()
            .get(cluster)
            .map_or_else(|| bounded(prior), PrefillEstimate::tokens_per_second)
    }

    /// Learns from one of `cluster`'s answers (see [`PrefillEstimate::observe`]), starting
    /// from `prior`. Returns the new estimate when the answer was a sample.
    pub fn observe(
        &self,
        cluster: &ClusterId,
        prior: f64,
        uncached_tokens: u64,
        elapsed: Duration,
    ) -> Option<f64> {
        let mut rates = self.lock();
        let estimate = rates
            .entry(cluster.clone())
            .or_insert_with(|| PrefillEstimate::new(prior));
        estimate
            .observe(uncached_tokens, elapsed)
            .then(|| estimate.tokens_per_second())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterId, PrefillEstimate>> {
        // A panic while holding the lock leaves a valid map (every write is one insert or
        // one float update), so a poisoned lock is still good to use.
        self.rates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
