//! The affinity rule's settings and the prices of its load gate.

use super::prices::PricePriors;
use crate::keying::BLOCK_BYTES;

/// A match this long sticks whatever share of the prompt it covers: 32 blocks, 8 KiB.
pub const STICKY_MATCH_BYTES: u64 = 32 * BLOCK_BYTES as u64;

/// A match of fewer keys never sticks, however much of a short prompt it covers: identical
/// short prompts spread by load instead of piling onto one site.
pub const MIN_STICKY_DEPTH: usize = 4;
/// How many times the load gate counts the prefill a match saves when the queued-request
/// price is learned (`queued_request_seconds: auto`): once for the request, which would
/// wait for that prefill at any other cluster, and seven more times for what moving it
/// costs there after it: the requests that wait for the engine time it took, and the
/// prompts its copy evicts from a cache that held them (a moved conversation is then held
/// twice, and its later turns find it at either holder only while both keep it).
///
/// The learned price is what one more request in a cluster's load delays a new one's
/// first token ([`ClusterPrices`](super::ClusterPrices)): the request's own side of the
/// trade. Weighed against that alone, a match moved whenever its holder was a little
/// busier, and its prefill was paid again at a cluster that had work of its own. Eight is
/// measured, not derived: docs/routing.md, "The bar under other engine speeds", runs 2,
/// 4, 8 and 16 and the gate all but off over 40 draws of each simulated shape (more keeps
/// more cached on batching engines; slot engines do not tell them apart), and
/// BENCHMARKS.md, "The thirty-first sitting (5a1c8b4)", ran 8 on real engines. Eight, not
/// more, so that at learned batching prices a 2,048-token match still gives way to a
/// holder about three requests busier. With a number given for the price the contract's
/// rule holds as written: once.
pub const MOVED_PREFILL_PAYERS: f64 = 8.0;

/// Bytes of canonical prompt per engine token, for pricing a match in prefill time.
pub const BYTES_PER_TOKEN: f64 = 4.0;

/// How long a new conversation may wait, in multiples of its own prefill, behind prompts
/// still being prefilled at a free slot beyond the least any free slot makes it wait,
/// and still be placed there for the room its cluster has (the
/// [module](super)'s rule, step 2). Past that the free slot goes behind the ones that
/// start it sooner.
///
/// A free slot is not a free engine: a llama.cpp engine prefills one pass at a time, and
/// a request given a slot while another prompt is prefilled starts when that pass ends.
/// The prompts still waiting there are also room already taken that the index does not
/// show yet (it learns a prompt at its answer). Both are read in seconds: the prompt
/// bytes this replica sent each cluster that wait for their first token
/// ([`prefill_waiting_bytes`](crate::grid::ClusterLoad::prefill_waiting_bytes)), and the
/// request's own, at the cluster's prefill speed (learned by default). Six is measured:
/// docs/routing.md, "The wait a free slot may cost", has the table that chose it (smaller
/// factors start new conversations sooner on slots sharing one prefill line; on slots
/// that prefill side by side a factor of 2 holds the bar in the fewest draws, and 4 to 8
/// within the noise of eight draws of each other). `f64::INFINITY` is the rule before:
/// room alone.
pub const FREE_SLOT_WAIT_FACTOR: f64 = 6.0;

/// How affinity narrows candidates: validated, so every value is in range.
///
/// Built from [`PrefixAffinityConfig::validate`](crate::config::PrefixAffinityConfig::validate)
/// or [`Default`] (the documented defaults). Copy it freely; swap it at runtime with
/// [`Affinity::set_settings`](super::Affinity::set_settings).
#[derive(Debug, Clone, Copy, PartialEq)]
// Each bool is one independent setting of the config file, not a state machine.
#[allow(clippy::struct_excessive_bools)]
pub struct AffinitySettings {
    enabled: bool,
    threshold: f64,
    exploration: f64,
    prefill_tokens_per_second: f64,
    queued_request_seconds: f64,
    engine_feedback: bool,
    learn_prefill: bool,
    learn_queued: bool,
    session_affinity: bool,
    /// Not in the config file: the simulator sets them to measure what each default is
    /// worth (docs/routing.md, "Streams, the gate's two sides and exploration").
    moved_prefill_payers: f64,
    explore_continuing: bool,
    free_slot_placement: bool,
    free_slots_by_depth: bool,
    free_slot_wait_factor: f64,
}

impl AffinitySettings {
    /// Share of the prompt a match must cover to stick when shorter than
    /// [`STICKY_MATCH_BYTES`] (`prefix_affinity.threshold`).
    pub const DEFAULT_THRESHOLD: f64 = 0.8;
    /// Share of decisions that skip affinity so a second site learns a shared prompt
    /// (`prefix_affinity.exploration`).
    pub const DEFAULT_EXPLORATION: f64 = 0.02;
    /// Prefill speed used to price a match (`prefix_affinity.prefill_tokens_per_second`).
    pub const DEFAULT_PREFILL_TOKENS_PER_SECOND: f64 = 10_000.0;
    /// What one queued request costs in seconds (`prefix_affinity.queued_request_seconds`).
    pub const DEFAULT_QUEUED_REQUEST_SECONDS: f64 = 2.0;

    /// Values already checked by `config`.
    // One argument per setting, called from one place (`config`), each already checked.
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    pub(crate) fn checked(
        enabled: bool,
        threshold: f64,
        exploration: f64,
        prefill_tokens_per_second: f64,
        queued_request_seconds: f64,
        engine_feedback: bool,
        learn_prefill: bool,
        learn_queued: bool,
        session_affinity: bool,
    ) -> Self {
        Self {
            enabled,
            threshold,
            exploration,
            prefill_tokens_per_second,
            queued_request_seconds,
            engine_feedback,
            learn_prefill,
            learn_queued,
            session_affinity,
            moved_prefill_payers: MOVED_PREFILL_PAYERS,
            explore_continuing: false,
            free_slot_placement: true,
            free_slots_by_depth: false,
            free_slot_wait_factor: FREE_SLOT_WAIT_FACTOR,
        }
    }

    /// These settings with the load gate counting a match's saved prefill `payers` times
    /// at a learned queued-request price (at least once) instead of
    /// [`MOVED_PREFILL_PAYERS`]. Not a config setting: what the simulator measures the
    /// default against.
    #[must_use]
    pub fn with_moved_prefill_payers(mut self, payers: f64) -> Self {
        if payers.is_finite() {
            self.moved_prefill_payers = payers.max(1.0);
        }
        self
    }

    /// These settings with exploration drawing for every prompt, a conversation's later
    /// turns too (`true`), or, the default, not for a prompt that continues one (see
    /// [`Affinity::decide`](super::Affinity::decide)). Not a config setting: what the
    /// simulator measures the default against.
    #[must_use]
    pub fn with_exploring_continuations(mut self, explore: bool) -> Self {
        self.explore_continuing = explore;
        self
    }

    /// These settings with a request that matches nothing on engines with slots placed on
    /// a free slot by the room the clusters have (`true`, the default; see the
    /// [module](super)'s rule, step 2) or, as before, by load first (`false`). Not a
    /// config setting: what the simulator measures the default against.
    #[must_use]
    pub fn with_free_slot_placement(mut self, on: bool) -> Self {
        self.free_slot_placement = on;
        self
    }

    /// These settings with free slots ranked first by how much of the prompt each
    /// cluster holds, a match too short to stick included (`true`, as before), or by room
    /// alone (`false`, the default; see the [module](super)'s rule, step 2). Not a config
    /// setting: what the simulator measures the default against.
    #[must_use]
    pub fn with_free_slots_by_depth(mut self, on: bool) -> Self {
        self.free_slots_by_depth = on;
        self
    }

    /// These settings with a free slot passed over for its room when the prompts waiting
    /// there would hold a new conversation back by more than `factor` times its own
    /// prefill beyond the free slot that starts it soonest, instead of
    /// [`FREE_SLOT_WAIT_FACTOR`]; `f64::INFINITY` ranks free slots by room alone, as
    /// before. A factor under 0 or NaN is taken as 0. Not a config setting: what the
    /// simulator measures the default against.
    #[must_use]
    pub fn with_free_slot_wait_factor(mut self, factor: f64) -> Self {
        self.free_slot_wait_factor = if factor >= 0.0 { factor } else { 0.0 };
        self
    }

    /// The wait a free slot may cost a new conversation for its room, in multiples of
    /// the request's own prefill (see
    /// [`with_free_slot_wait_factor`](Self::with_free_slot_wait_factor)).
    pub fn free_slot_wait_factor(&self) -> f64 {
        self.free_slot_wait_factor
    }

    /// Whether free slots are ranked by depth before room (see
    /// [`with_free_slots_by_depth`](Self::with_free_slots_by_depth)).
    pub fn ranks_free_slots_by_depth(&self) -> bool {
        self.free_slots_by_depth
    }

    /// Whether a request that matches nothing on engines with slots is placed on a free
    /// slot (see [`with_free_slot_placement`](Self::with_free_slot_placement)).
    pub fn places_on_free_slots(&self) -> bool {
        self.free_slot_placement
    }

    /// Whether a prompt that continues a conversation can be explored (see
    /// [`with_exploring_continuations`](Self::with_exploring_continuations)).
    pub fn explores_continuations(&self) -> bool {
        self.explore_continuing
    }

    /// Whether affinity narrows at all (`prefix_affinity.enabled`); when not, requests
    /// route on queue depth alone and no prompt is read.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Share of the prompt that makes a shorter match stick, in (0, 1].
    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// Share of decisions that explore, in [0, 1].
    pub fn exploration(&self) -> f64 {
        self.exploration
    }

    /// Prefill speed that prices a match, tokens a second; with
    /// [`learns_prefill`](Self::learns_prefill), the prior of every cluster's estimate.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prefill_tokens_per_second
    }

    /// Whether each cluster's prefill speed is learned from its answers
    /// (`prefill_tokens_per_second: auto`) rather than fixed.
    pub fn learns_prefill(&self) -> bool {
        self.learn_prefill
    }

    /// Whether each cluster's price of a queued request is learned from its answers
    /// (`queued_request_seconds: auto`) rather than fixed.
    pub fn learns_queued(&self) -> bool {
        self.learn_queued
    }

    /// Whether a request goes back to where its session was answered when its prefix match
    /// does not stick (`prefix_affinity.session_affinity`).
    pub fn session_affinity(&self) -> bool {
        self.session_affinity
    }

    /// These settings with [`session_affinity`](Self::session_affinity) set.
    #[must_use]
    pub fn with_session_affinity(mut self, session_affinity: bool) -> Self {
        self.session_affinity = session_affinity;
        self
    }

    /// Whether either price is learned.
    pub fn learns_prices(&self) -> bool {
        self.learn_prefill || self.learn_queued
    }

    /// The two prices as priors (or fixed prices) for [`LearnedPrices`](super::LearnedPrices).
    pub fn price_priors(&self) -> PricePriors {
        PricePriors {
            prefill_tokens_per_second: self.prefill_tokens_per_second,
            learn_prefill: self.learn_prefill,
            queued_request_seconds: self.queued_request_seconds,
            learn_queued: self.learn_queued,
        }
    }

    /// These settings with a match priced at `tokens_per_second` of prefill and
    /// `queued_request_seconds` a queued request (learned prices).
    #[must_use]
    pub fn priced_at(mut self, tokens_per_second: f64, queued_request_seconds: f64) -> Self {
        self.prefill_tokens_per_second = tokens_per_second;
        self.queued_request_seconds = queued_request_seconds;
        self
    }

    /// Seconds one queued request costs; with [`learns_queued`](Self::learns_queued), the
    /// prior of every cluster's estimate.
    pub fn queued_request_seconds(&self) -> f64 {
        self.queued_request_seconds
    }

    /// Whether an engine reporting far less cached than the index predicted makes the
    /// index forget what the engine no longer holds (`prefix_affinity.engine_feedback`,
    /// read by [`FeedbackLayer`](crate::feedback::FeedbackLayer)).
    pub fn engine_feedback(&self) -> bool {
        self.engine_feedback
    }

    /// Prefill seconds a match covering `covered_bytes` saves.
    pub fn saved_seconds(&self, covered_bytes: u64) -> f64 {
        covered_bytes as f64 / BYTES_PER_TOKEN / self.prefill_tokens_per_second
    }

    /// What a match covering `covered_bytes` is worth, in queued requests: the load gate
    /// lets the holder's queue exceed the lightest other candidate's by this much. Its
    /// saved prefill counts [`MOVED_PREFILL_PAYERS`] times when the queued-request price is
    /// learned, once when it is a number.
    ///
    /// ```
    /// use grid_route_layer::affinity::AffinitySettings;
    /// use grid_route_layer::config::{Price, PrefixAffinityConfig};
    ///
    /// let fixed = PrefixAffinityConfig::default()
    ///     .with_prefill_tokens_per_second(Price::Fixed(10_000.0))
    ///     .with_queued_request_seconds(Price::Fixed(2.0))
    ///     .validate()
    ///     .unwrap()
    ///     .affinity;
    /// // The contract's worked example: 40 blocks of 256 bytes, 2,560 tokens, 0.256 s.
    /// assert!((fixed.match_worth(40 * 256) - 0.128).abs() < 1e-9);
    /// // Learned prices at the same figures count the saved prefill eight times.
    /// let learned = AffinitySettings::default().priced_at(10_000.0, 2.0);
    /// assert!((learned.match_worth(40 * 256) - 1.024).abs() < 1e-9);
    /// ```
    pub fn match_worth(&self, covered_bytes: u64) -> f64 {
        let payers = if self.learn_queued {
            self.moved_prefill_payers
        } else {
            1.0
        };
        payers * self.saved_seconds(covered_bytes) / self.queued_request_seconds
    }
}

impl Default for AffinitySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: Self::DEFAULT_THRESHOLD,
            exploration: Self::DEFAULT_EXPLORATION,
            prefill_tokens_per_second: Self::DEFAULT_PREFILL_TOKENS_PER_SECOND,
            queued_request_seconds: Self::DEFAULT_QUEUED_REQUEST_SECONDS,
            engine_feedback: true,
            learn_prefill: true,
            learn_queued: true,
            session_affinity: true,
            moved_prefill_payers: MOVED_PREFILL_PAYERS,
            explore_continuing: false,
            free_slot_placement: true,
            free_slots_by_depth: false,
            free_slot_wait_factor: FREE_SLOT_WAIT_FACTOR,
        }
    }
}
