//! The load gate's two prices learned per cluster (`prefill_tokens_per_second: auto`,
//! `queued_request_seconds: auto`), as plain code.
//!
//! The load gate weighs a match's saved prefill against the extra load at its holder, so
//! it needs two numbers per cluster: how fast its engines prefill, and what one more
//! request in its load costs a new one. Fixed figures are wrong by orders of magnitude
//! somewhere: 10,000 tokens a second is a GPU and one CPU thread does about 100; one more
//! request costs a batching vLLM engine a fraction of a second and a two-slot llama.cpp
//! engine the whole length of an answer.
//!
//! Every answer tells both. Its usage says how many prompt tokens the engine had to
//! prefill (prompt − cached), the gateway knows the cluster's load when it sent the
//! request and how long the answer took to start. The answer's time to first token is
//! read as the sum of a queueing part and a prefill part:
//!
//! ```text
//! time to first token ≈ load at dispatch × queued_request_seconds
//!                     + uncached tokens / prefill_tokens_per_second
//! ```
//!
//! and the two prices are the least-squares fit of that line over the cluster's recent
//! answers ([`ClusterPrices`]). A price given as a number is not learned and is held at
//! its figure in the fit. With only the prefill speed learned (a fixed queued-request
//! price), the estimate is what it has always been: uncached tokens over the whole time
//! to first token ([`PrefillEstimate`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::grid::ClusterId;

/// The slowest prefill speed an estimate may reach, tokens a second.
pub const MIN_PREFILL_TOKENS_PER_SECOND: f64 = 10.0;
/// The fastest prefill speed an estimate may reach, tokens a second.
pub const MAX_PREFILL_TOKENS_PER_SECOND: f64 = 10_000_000.0;
/// The cheapest a queued request may be learned to cost, seconds: an engine that batches
/// every request it is sent still pays something for each.
pub const MIN_QUEUED_REQUEST_SECONDS: f64 = 0.001;
/// The dearest a queued request may be learned to cost, seconds.
pub const MAX_QUEUED_REQUEST_SECONDS: f64 = 3_600.0;
/// With only the prefill speed learned, answers that prefilled fewer tokens teach nothing:
/// their time is mostly the network, the first decoded token and the engine's own
/// overhead, not prefill. (The fit of both prices takes every answer: one that prefilled
/// nothing still tells what its load cost.)
pub const MIN_SAMPLE_TOKENS: u64 = 64;
/// The weight of each new sample in the prefill-only moving average: about the last ten
/// answers count.
pub const PREFILL_SMOOTHING: f64 = 0.2;

/// One cluster's prefill speed when it is the only price learned: an exponentially weighted
/// moving average of the samples *uncached prompt tokens / seconds from dispatch to the
/// answer's start*, starting at a prior and bounded to
/// [[`MIN_PREFILL_TOKENS_PER_SECOND`], [`MAX_PREFILL_TOKENS_PER_SECOND`]].
///
/// The time queued at the engine, the network and the engine's own overhead are not
/// known, so they count as prefill time: the estimate is a lower bound on the engine's real
/// speed under its real load — the speed a request sent there meets.
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
            tokens_per_second: bounded_rate(prior),
        }
    }

    /// The estimated prefill speed, tokens a second.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens_per_second
    }

    /// Learns from an answer that prefilled `uncached_tokens` and started `prefill` after
    /// dispatch. Returns whether it was a sample: fewer than [`MIN_SAMPLE_TOKENS`] is not;
    /// nor is no time at all.
    pub fn observe(&mut self, uncached_tokens: u64, prefill: Duration) -> bool {
        self.observe_seconds(uncached_tokens, prefill.as_secs_f64())
    }

    fn observe_seconds(&mut self, uncached_tokens: u64, seconds: f64) -> bool {
        if uncached_tokens < MIN_SAMPLE_TOKENS || seconds.is_nan() || seconds <= 0.0 {
            return false;
        }
        let sample = bounded_rate(uncached_tokens as f64 / seconds);
        self.tokens_per_second += PREFILL_SMOOTHING * (sample - self.tokens_per_second);
        true
    }
}

fn bounded_rate(rate: f64) -> f64 {
    if rate.is_nan() {
        return MIN_PREFILL_TOKENS_PER_SECOND;
    }
    rate.clamp(MIN_PREFILL_TOKENS_PER_SECOND, MAX_PREFILL_TOKENS_PER_SECOND)
}

fn bounded_queued(seconds: f64) -> f64 {
    if seconds.is_nan() {
        return MAX_QUEUED_REQUEST_SECONDS;
    }
    seconds.clamp(MIN_QUEUED_REQUEST_SECONDS, MAX_QUEUED_REQUEST_SECONDS)
}

/// What one answer says about its cluster: the tokens it prefilled, the cluster's load
/// when it was sent (`f64::INFINITY` when unmeasured), and how long it took to start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnswerTiming {
    /// Prompt tokens the engine did not find cached.
    pub uncached_tokens: u64,
    /// The cluster's [`routing_load`](crate::grid::ClusterLoad::routing_load) at dispatch,
    /// before this request counted in it.
    pub load: f64,
    /// From dispatch to the answer's start.
    pub started: Duration,
    /// Whether the start is the first generated token (an event stream's first data), not
    /// the whole answer (a JSON answer's head, which an engine sends once it has generated
    /// everything). Only first tokens teach the fit of both prices: a whole answer's time
    /// is mostly decoding.
    pub first_token: bool,
}

/// Which of the two prices a cluster learns, and where each starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PricePriors {
    /// Prefill speed, tokens a second: the prior when learned, else the fixed price.
    pub prefill_tokens_per_second: f64,
    /// Whether the prefill speed is learned.
    pub learn_prefill: bool,
    /// One queued request, seconds: the prior when learned, else the fixed price.
    pub queued_request_seconds: f64,
    /// Whether the queued-request price is learned.
    pub learn_queued: bool,
}

/// The two prices the load gate weighs a match with at one cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatePrices {
    /// Prefill speed, tokens a second.
    pub prefill_tokens_per_second: f64,
    /// What one more request in the cluster's load costs a new one, seconds.
    pub queued_request_seconds: f64,
}

/// The estimates one answer changed: each `Some` is the new value of a learned price.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Learned {
    /// The new prefill speed, tokens a second.
    pub prefill_tokens_per_second: Option<f64>,
    /// The new queued-request price, seconds.
    pub queued_request_seconds: Option<f64>,
}

/// The weight each answer loses in [`ClusterPrices`]' least-squares fit as a new one comes:
/// about the last twenty answers count.
pub const FIT_DECAY: f64 = 0.05;
/// How far a fit the answers cannot decide leans towards the priors, in relative terms: a
/// ridge on `q / q0 - 1` and `s / s0 - 1` of this share of the data's own weight. Such a
/// fit (a single answer, or loads in proportion to uncached tokens: see
/// [`FIT_COLLINEAR`]) then lands near the point of the answers' line nearest the priors in
/// ratio, so neither price runs to a bound because the other was credited with all the
/// time. A fit the answers decide leans a billionth of its weight, which only keeps a price
/// no answer speaks to (no answer ever sent under load) at its prior.
pub const FIT_RIDGE: f64 = 1e-3;
/// When the answers cannot decide the fit: the squared (uncentred) correlation of their
/// loads and uncached tokens is at least this, so what they tell is one mix of the two
/// prices, not each.
pub const FIT_COLLINEAR: f64 = 0.99;

/// One cluster's two learned estimates.
///
/// With only the prefill speed learned it is a [`PrefillEstimate`], which reads the whole
/// time to first token as prefill. With the queued-request price learned too, both come
/// from a least-squares fit through the origin of every answer's time to first token `t`
/// on its load at dispatch `L` and its uncached tokens `u`:
///
/// ```text
/// t ≈ L × queued_request_seconds + u × seconds_per_token      seconds_per_token = 1 / prefill speed
/// ```
///
/// weighted so that each answer counts [`FIT_DECAY`] less than the next, and leaning
/// [`FIT_RIDGE`] towards the priors. A price that is not learned is held at its figure in
/// the fit. Each price stays within its bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterPrices {
    prefill: PrefillEstimate,
    queued_seconds: f64,
    fit: TimingFit,
}

/// The decayed sums of the least-squares fit: `L²`, `L·u`, `u²`, `L·t`, `u·t`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct TimingFit {
    ll: f64,
    lu: f64,
    uu: f64,
    lt: f64,
    ut: f64,
}

impl TimingFit {
    fn add(&mut self, load: f64, uncached: f64, started: f64) {
        let keep = 1.0 - FIT_DECAY;
        self.ll = keep * self.ll + load * load;
        self.lu = keep * self.lu + load * uncached;
        self.uu = keep * self.uu + uncached * uncached;
        self.lt = keep * self.lt + load * started;
        self.ut = keep * self.ut + uncached * started;
    }

    /// The fit's `(queued_request_seconds, seconds_per_token)`, from priors `(q0, s0)`;
    /// `learn_prefill: false` holds `s` at `s0`.
    fn solve(&self, q0: f64, s0: f64, learn_prefill: bool) -> (f64, f64) {
        // The ridge, as weights on (q - q0)^2 and (s - s0)^2. Undecidable answers: FIT_RIDGE
        // of the data's weight in units of the priors, lambda / q0^2 and lambda / s0^2.
        // Otherwise a billionth of each column's own weight, and a floor so that a column
        // with no data at all keeps its prior.
        let collinear = self.ll > 0.0
            && self.uu > 0.0
            && self.lu * self.lu >= FIT_COLLINEAR * self.ll * self.uu;
        let (rq, rs) = if collinear {
            let lambda = FIT_RIDGE * (self.ll * q0 * q0 + self.uu * s0 * s0);
            (lambda / (q0 * q0), lambda / (s0 * s0))
        } else {
            (1e-9 * self.ll + 1e-12, 1e-9 * self.uu + 1e-12)
        };
        let (s_min, s_max) = (
            1.0 / MAX_PREFILL_TOKENS_PER_SECOND,
            1.0 / MIN_PREFILL_TOKENS_PER_SECOND,
        );
        // Each price's best value with the other held.
        let q_alone = |per_token: f64| {
            ((self.lt - self.lu * per_token + rq * q0) / (self.ll + rq))
                .clamp(MIN_QUEUED_REQUEST_SECONDS, MAX_QUEUED_REQUEST_SECONDS)
        };
        let s_alone = |queued: f64| {
            ((self.ut - self.lu * queued + rs * s0) / (self.uu + rs)).clamp(s_min, s_max)
        };
        if !learn_prefill {
            return (q_alone(s0), s0);
        }
        // The 2×2 normal equations [ll' lu; lu uu'] (q, s) = (lt', ut'), then each price
        // within its bounds: a solution outside them is replaced by the best one with
        // that price at its bound.
        let (ll, lu, uu) = (self.ll + rq, self.lu, self.uu + rs);
        let (lt, ut) = (self.lt + rq * q0, self.ut + rs * s0);
        let det = ll * uu - lu * lu;
        let queued = (lt * uu - lu * ut) / det;
        let per_token = (ll * ut - lu * lt) / det;
        let queued_in = (MIN_QUEUED_REQUEST_SECONDS..=MAX_QUEUED_REQUEST_SECONDS).contains(&queued);
        let per_token_in = (s_min..=s_max).contains(&per_token);
        match (queued_in && det.is_finite() && det > 0.0, per_token_in) {
            (true, true) => (queued, per_token),
            (false, _) => {
                let queued = if queued.is_nan() {
                    q0
                } else {
                    queued.clamp(MIN_QUEUED_REQUEST_SECONDS, MAX_QUEUED_REQUEST_SECONDS)
                };
                (queued, s_alone(queued))
            }
            (true, false) => {
                let per_token = per_token.clamp(s_min, s_max);
                (q_alone(per_token), per_token)
            }
        }
    }
}

impl ClusterPrices {
    /// Both prices at their priors.
    pub fn new(priors: PricePriors) -> Self {
        Self {
            prefill: PrefillEstimate::new(priors.prefill_tokens_per_second),
            queued_seconds: bounded_queued(priors.queued_request_seconds),
            fit: TimingFit::default(),
        }
    }

    /// The prefill speed, tokens a second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prefill.tokens_per_second()
    }

    /// The queued-request price, seconds.
    pub fn queued_request_seconds(&self) -> f64 {
        self.queued_seconds
    }

    /// Learns from one answer the prices `priors` says to learn (see the type's docs).
    /// With the queued price learned, an answer teaches only when its start is its first
    /// token and its cluster's load at dispatch is known (measured, and recorded by the
    /// balancer: [`Served::with_load`](crate::route::Served::with_load)); with only the
    /// prefill speed learned, every answer does, as [`PrefillEstimate`] reads it.
    pub fn observe(&mut self, priors: PricePriors, answer: AnswerTiming) -> Learned {
        let mut learned = Learned::default();
        if !priors.learn_queued {
            if priors.learn_prefill && self.prefill.observe(answer.uncached_tokens, answer.started)
            {
                learned.prefill_tokens_per_second = Some(self.prefill.tokens_per_second());
            }
            return learned;
        }
        let started = answer.started.as_secs_f64();
        if !(answer.first_token
            && answer.load.is_finite()
            && answer.load >= 0.0
            && started.is_finite())
        {
            return learned;
        }
        let uncached = answer.uncached_tokens as f64;
        self.fit.add(answer.load, uncached, started);
        let (q, s) = self.fit.solve(
            bounded_queued(priors.queued_request_seconds),
            1.0 / PrefillEstimate::new(priors.prefill_tokens_per_second).tokens_per_second(),
            priors.learn_prefill,
        );
        self.queued_seconds = bounded_queued(q);
        learned.queued_request_seconds = Some(self.queued_seconds);
        if priors.learn_prefill {
            self.prefill = PrefillEstimate::new(1.0 / s);
            learned.prefill_tokens_per_second = Some(self.prefill.tokens_per_second());
        }
        learned
    }
}

/// Every cluster's [`ClusterPrices`], shared by the layers that learn (feedback) and the
/// one that prices (affinity).
#[derive(Debug, Default)]
pub struct LearnedPrices {
    // A plain mutex: one short map operation per answer and per decision.
    prices: Mutex<HashMap<ClusterId, ClusterPrices>>,
}

impl LearnedPrices {
    /// `cluster`'s prices; the priors while it has learned nothing.
    pub fn prices(&self, cluster: &ClusterId, priors: PricePriors) -> ClusterPrices {
        self.lock()
            .get(cluster)
            .copied()
            .unwrap_or_else(|| ClusterPrices::new(priors))
    }

    /// Learns from one of `cluster`'s answers (see [`ClusterPrices::observe`]), starting
    /// from `priors`, when `known` says the cluster is still configured.
    ///
    /// `known` is asked under the lock that [`retain`](Self::retain) takes: a reload that
    /// stops knowing a cluster, then retains the prices of the known ones, either drops
    /// what this call learned or is seen by it, never neither.
    pub fn observe(
        &self,
        cluster: &ClusterId,
        priors: PricePriors,
        answer: AnswerTiming,
        known: impl FnOnce(&ClusterId) -> bool,
    ) -> Learned {
        let mut prices = self.lock();
        if !known(cluster) {
            return Learned::default();
        }
        prices
            .entry(cluster.clone())
            .or_insert_with(|| ClusterPrices::new(priors))
            .observe(priors, answer)
    }

    /// Keeps the prices of the clusters `keep` says yes to.
    pub fn retain(&self, mut keep: impl FnMut(&ClusterId) -> bool) {
        self.lock().retain(|cluster, _| keep(cluster));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterId, ClusterPrices>> {
        // A panic while holding the lock leaves a valid map (every write is one insert or
        // one float update), so a poisoned lock is still good to use.
        self.prices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
