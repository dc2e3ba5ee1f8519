//! The affinity rule as plain code: depths and queues in, the sticky set (or not) out.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::heads::{HeadVerdict, SharedHeads};
use super::prices::{AnswerTiming, GatePrices, Learned, LearnedPrices};
use super::room::RecentPlacements;
use super::settings::{AffinitySettings, MIN_STICKY_DEPTH, STICKY_MATCH_BYTES};
use crate::grid::{Cluster, ClusterId};
use crate::index::PrefixIndex;
use crate::keying::{PrefixKeys, SessionKey};
use crate::route::{Placed, PredictedMatch};
use crate::select::{count_in_flight, least_loaded, load_rank, prefill_bytes};

/// What affinity decided for a request, the `outcome` label of
/// `grid_route_prefix_affinity_total`.
///
/// `#[non_exhaustive]`: a new reason to keep or narrow candidates is a new outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The deepest holders of the prompt are the only candidates.
    Sticky,
    /// No candidate holds enough of the prompt: every candidate stays.
    NoMatch,
    /// A holder's queue outweighs what its match saves: every candidate stays.
    LoadOverride,
    /// The random exploration share: affinity skipped, every candidate stays.
    Exploration,
    /// The request has no keys (unreadable, token ids, stored state, ...): every
    /// candidate stays.
    NotApplicable,
    /// The prefix match does not stick, but the request's session was answered at a
    /// cluster whose load the gate lets it wait for: that cluster is the only candidate.
    Session,
}

impl Outcome {
    /// Every outcome, in the order of the metric's documentation.
    pub const ALL: [Outcome; 6] = [
        Outcome::Sticky,
        Outcome::NoMatch,
        Outcome::LoadOverride,
        Outcome::Exploration,
        Outcome::NotApplicable,
        Outcome::Session,
    ];

    /// The metric label value: `sticky`, `no_match`, `load_override`, `exploration`,
    /// `not_applicable`, `session`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Sticky => "sticky",
            Outcome::NoMatch => "no_match",
            Outcome::LoadOverride => "load_override",
            Outcome::Exploration => "exploration",
            Outcome::NotApplicable => "not_applicable",
            Outcome::Session => "session",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of [`narrow`]: the outcome and the deepest match it was decided on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Narrowing {
    outcome: Outcome,
    deepest: usize,
    holder_busier: bool,
}

impl Narrowing {
    /// [`Outcome::Sticky`], [`Outcome::NoMatch`] or [`Outcome::LoadOverride`].
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The largest depth among the candidates.
    pub fn deepest(&self) -> usize {
        self.deepest
    }

    /// Whether the least loaded deepest holder is busier than the least loaded other
    /// candidate (`false` when the match was too short to weigh, or every candidate holds
    /// it).
    pub fn holder_busier(&self) -> bool {
        self.holder_busier
    }

    /// Whether a candidate with `depth` stays a candidate: every one does, unless the
    /// outcome is sticky, when only the deepest holders do.
    pub fn keeps(&self, depth: usize) -> bool {
        self.outcome != Outcome::Sticky || depth == self.deepest
    }
}

/// Steps 2 to 4 of the affinity rule for a keyed request with at least two candidates:
/// `depths[i]` is candidate `i`'s depth for `keys`, `queue(i)` its load in queued requests
/// (read only when the load gate needs it; [`Affinity::decide`] passes the cluster's
/// [`routing_load`](crate::grid::ClusterLoad::routing_load)).
///
/// - `deepest` is the largest depth. It is a match worth sticking to when it covers at
///   least [`STICKY_MATCH_BYTES`] or at least `threshold` of the bytes the keys cover —
///   never when `deepest < MIN_STICKY_DEPTH`. Otherwise [`Outcome::NoMatch`].
/// - The load gate: with `gap` = the least queue among the deepest holders minus the least
///   among the others, [`Outcome::LoadOverride`] when `gap` exceeds
///   [`AffinitySettings::match_worth`] of the covered bytes. An unmeasured (`+inf`) holder
///   thus gives way to a measured other; two unmeasured ones give `inf - inf = NaN`, which
///   exceeds nothing, so the match holds. When every candidate is a deepest holder there
///   is nothing to weigh.
/// - Otherwise [`Outcome::Sticky`].
pub fn narrow(
    settings: &AffinitySettings,
    keys: &PrefixKeys,
    depths: &[usize],
    mut queue: impl FnMut(usize) -> f64,
) -> Narrowing {
    let deepest = depths.iter().copied().max().unwrap_or(0);
    let decided = |outcome| Narrowing {
        outcome,
        deepest,
        holder_busier: false,
    };
    let covered = keys.covered_bytes(deepest);
    let long_enough = covered >= STICKY_MATCH_BYTES
        || covered as f64 >= settings.threshold() * keys.total_covered_bytes() as f64;
    if deepest < MIN_STICKY_DEPTH || !long_enough {
        return decided(Outcome::NoMatch);
    }
    let (mut holders, mut others) = (f64::INFINITY, None::<f64>);
    for (i, &depth) in depths.iter().enumerate() {
        let q = queue(i);
        if depth == deepest {
            holders = holders.min(q);
        } else {
            others = Some(others.map_or(q, |o| o.min(q)));
        }
    }
    let (outcome, holder_busier) = match others {
        Some(others) if holders - others > settings.match_worth(covered) => {
            (Outcome::LoadOverride, true)
        }
        Some(others) => (Outcome::Sticky, holders > others),
        None => (Outcome::Sticky, false),
    };
    Narrowing {
        outcome,
        deepest,
        holder_busier,
    }
}

/// The affinity core: the shared prefix index and the settings in force, swappable at
/// runtime. Clones share both, so the gateway keeps one to reload settings.
#[derive(Clone)]
pub struct Affinity {
    index: Arc<PrefixIndex>,
    settings: Arc<ArcSwap<AffinitySettings>>,
    prices: Arc<LearnedPrices>,
    placed: Arc<RecentPlacements>,
    heads: Arc<SharedHeads>,
    /// Whether other replicas write into the index too ([`Affinity::set_index_shared`]).
    index_shared: Arc<AtomicBool>,
}

impl Affinity {
    /// Affinity over `index` with `settings`.
    pub fn new(index: Arc<PrefixIndex>, settings: AffinitySettings) -> Self {
        Self {
            index,
            settings: Arc::new(ArcSwap::from_pointee(settings)),
            prices: Arc::default(),
            placed: Arc::default(),
            heads: Arc::default(),
            index_shared: Arc::default(),
        }
    }

    /// Tells affinity whether other replicas write into its index (a shared index), which
    /// changes how a request that matches nothing is placed on engines with slots: by
    /// the fewest live index entries on an index of this replica's own, by the fewest
    /// bytes of new prompt this replica sent lately on a shared one (the [module](super)'s
    /// rule, step 2). Off until set; the gateway sets it while it shares the index.
    pub fn set_index_shared(&self, shared: bool) {
        self.index_shared.store(shared, Ordering::Relaxed);
    }

    /// Whether the index is shared with other replicas
    /// ([`set_index_shared`](Self::set_index_shared)).
    pub fn index_shared(&self) -> bool {
        self.index_shared.load(Ordering::Relaxed)
    }

    /// The two prices of the load gate at `cluster`: its learned estimates where
    /// [`AffinitySettings`] says to learn (the configured priors until it has learned),
    /// the configured figures otherwise.
    pub fn prices(&self, cluster: &ClusterId) -> GatePrices {
        self.prices_under(&self.settings(), cluster)
    }

    fn prices_under(&self, settings: &AffinitySettings, cluster: &ClusterId) -> GatePrices {
        let priors = settings.price_priors();
        let mut prices = GatePrices {
            prefill_tokens_per_second: priors.prefill_tokens_per_second,
            queued_request_seconds: priors.queued_request_seconds,
        };
        if priors.learn_prefill || priors.learn_queued {
            let learned = self.prices.prices(cluster, priors);
            if priors.learn_prefill {
                prices.prefill_tokens_per_second = learned.prefill_tokens_per_second();
            }
            if priors.learn_queued {
                prices.queued_request_seconds = learned.queued_request_seconds();
            }
        }
        prices
    }

    /// The prefill speed that prices a match held by `cluster`, tokens a second (see
    /// [`prices`](Self::prices)).
    pub fn prefill_rate(&self, cluster: &ClusterId) -> f64 {
        self.prices(cluster).prefill_tokens_per_second
    }

    /// What one more request in `cluster`'s load costs a new one, seconds (see
    /// [`prices`](Self::prices)).
    pub fn queued_request_seconds(&self, cluster: &ClusterId) -> f64 {
        self.prices(cluster).queued_request_seconds
    }

    /// `cluster`'s prices that the settings say to learn, as learned so far (the priors
    /// while nothing is); `None` for a price given as a number.
    pub fn learned_prices(&self, cluster: &ClusterId) -> Learned {
        let priors = self.settings().price_priors();
        let prices = self.prices(cluster);
        Learned {
            prefill_tokens_per_second: priors
                .learn_prefill
                .then_some(prices.prefill_tokens_per_second),
            queued_request_seconds: priors.learn_queued.then_some(prices.queued_request_seconds),
        }
    }

    /// Learns `cluster`'s prices from one of its answers, those the settings say to learn
    /// ([`ClusterPrices::observe`](super::ClusterPrices::observe)). Returns the estimates it changed.
    ///
    /// A cluster the index does not know learns nothing: an answer that ends after a reload
    /// removed its cluster ([`forget_removed_clusters`](Self::forget_removed_clusters)) would
    /// otherwise bring its prices back, and the cluster, added again, would start from them
    /// instead of the priors. The index ignores such an answer's confirmation for the same
    /// reason. (Both read the index under the prices' lock, so a reload running beside
    /// this cannot be missed.) An answer whose cluster was removed and added again while it
    /// ran still teaches it: it came from that cluster's engines.
    pub fn learn(&self, cluster: &ClusterId, answer: AnswerTiming) -> Learned {
        let priors = self.settings().price_priors();
        if !(priors.learn_prefill || priors.learn_queued) {
            return Learned::default();
        }
        self.prices
            .observe(cluster, priors, answer, |cluster| self.index.knows(cluster))
    }

    /// The prefix index it reads (and confirmation writes).
    pub fn index(&self) -> &Arc<PrefixIndex> {
        &self.index
    }

    /// The settings in force.
    pub fn settings(&self) -> AffinitySettings {
        **self.settings.load()
    }

    /// Replaces the settings for every later decision (a config reload). The index's own
    /// settings are reloaded with [`PrefixIndex::reconfigure`].
    pub fn set_settings(&self, settings: AffinitySettings) {
        self.settings.store(Arc::new(settings));
    }

    /// Forgets the learned prices and the recent placements of every cluster the index no
    /// longer knows: call it after [`PrefixIndex::reconfigure`] removed some (a config
    /// reload), which dropped their entries. A cluster added again later starts from the
    /// priors and from nothing placed, like one never seen. The index is the one list of
    /// configured clusters that both keeping and [`learn`](Self::learn)ing prices read.
    pub fn forget_removed_clusters(&self) {
        self.prices.retain(|cluster| self.index.knows(cluster));
        self.placed.retain(|cluster| self.index.knows(cluster));
        self.heads.retain(|cluster| self.index.knows(cluster));
    }

    /// Counts an answer to a conversation's first turn that asked `cluster` for a short
    /// shared head ([`Decision::asks_shared_head`]): whether the engine `found` it cached.
    /// Returns the cluster's verdict before and after. A cluster the index does not know
    /// (a reload removed it while the answer ran) counts nothing and keeps nothing.
    ///
    /// Where heads are kept, a new conversation may join a busier holder of its head that
    /// has a free slot ([`decide`](Self::decide); why: the `heads` module).
    pub fn count_shared_head(&self, cluster: &ClusterId, found: bool) -> Option<HeadVerdict> {
        self.index
            .knows(cluster)
            .then(|| self.heads.count(cluster, found))
    }

    /// Whether `cluster`'s engines are believed to keep a head other conversations share
    /// while they serve others (a host prompt cache): learned from
    /// [`count_shared_head`](Self::count_shared_head), `false` until an answer says so.
    pub fn keeps_shared_heads(&self, cluster: &ClusterId) -> bool {
        self.heads.kept(cluster)
    }

    /// Whether a new request sent to `cluster` now may take a live conversation's slot
    /// and push its prompt out for good: a slot there just went idle
    /// ([`ClusterLoad::slot_just_freed`](crate::grid::ClusterLoad::slot_just_freed)),
    /// and its engines are not learned to keep shared heads (the `heads` module: with a
    /// host cache the pushed-out prompt comes back, and the slot is worth taking).
    fn just_freed(&self, cluster: &Cluster, now: Instant) -> bool {
        cluster.load().slot_just_freed(now) && !self.heads.kept(cluster.id())
    }

    /// Whether a conversation's later turn ([`PrefixKeys::continues_conversation`]) moved
    /// to `cluster` by the load gate would push another live conversation's prompt out for
    /// good to save its own wait: the one slot free there [just went
    /// idle](Self::just_freed), so the engine has no other to give it, and the
    /// conversation that slot answered likely sends its next turn now. That one then takes
    /// another's slot, and so on: in the arena one such move (a second turn whose own
    /// history was a 46-token question, at a holder one request busier) cost four later
    /// turns their prompts, 4.3 points of the run's cached share (BENCHMARKS.md, "The
    /// thirty-third sitting (19ca706)"). Its own cluster, with a slot free, only makes it
    /// wait for the prefill there; the gate and the move pass such a place over only then
    /// (with no slot free there, staying means waiting for whichever slot frees first,
    /// likely another live conversation's, and in the simulator's replays of the arena
    /// passing over then cost two runs of six 1.4 and 4.5 points). With more slots free the
    /// engine gives a prompt that shares no slot's prefix the least recently used, not the
    /// one just freed. A newcomer has its own rules (step 2, and
    /// [`first_turn`](Self::first_turn)).
    fn lands_on_freed_slot(&self, cluster: &Cluster, keys: &PrefixKeys, now: Instant) -> bool {
        let load = cluster.load();
        keys.continues_conversation()
            && self.just_freed(cluster, now)
            && load.slots() == Some(load.in_flight() + 1)
    }

    /// Whether the freed-slot rule for a later turn the gate moves
    /// ([`lands_on_freed_slot`](Self::lands_on_freed_slot)) applies: the request continues
    /// a conversation and one of `left`, the clusters it would leave, has a slot free. A
    /// first turn's decision reads no slot for it.
    fn slot_free_where_it_is<'a>(
        keys: &PrefixKeys,
        mut left: impl Iterator<Item = &'a Arc<Cluster>>,
        now: Instant,
    ) -> bool {
        keys.continues_conversation() && left.any(|c| c.load().free_slot(now) == Some(true))
    }

    /// [`narrow`] on the candidates' loads, but where a later turn moved off its holder
    /// could land only by taking a live conversation's slot
    /// ([`lands_on_freed_slot`](Self::lands_on_freed_slot)) while a holder has a slot
    /// free: no place to move it to, so the gate does not weigh it (an infinite load).
    /// With the narrowing, those places [passed over](Decision::passed_over) when leaving
    /// them out kept the turn at its holder (the gate would have moved it); none
    /// otherwise.
    fn narrow_at(
        &self,
        settings: &AffinitySettings,
        candidates: &[Arc<Cluster>],
        keys: &PrefixKeys,
        depths: &[usize],
        now: Instant,
    ) -> (Narrowing, Vec<Arc<Cluster>>) {
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let holders = candidates
            .iter()
            .zip(depths)
            .filter(|&(_, &depth)| depth == deepest);
        let stays_free = Self::slot_free_where_it_is(keys, holders.map(|(c, _)| c), now);
        let mut spared = Vec::new();
        let narrowing = narrow(settings, keys, depths, |i| {
            if stays_free
                && depths[i] != deepest
                && self.lands_on_freed_slot(&candidates[i], keys, now)
            {
                spared.push(Arc::clone(&candidates[i]));
                f64::INFINITY
            } else {
                candidates[i].load().routing_load(now)
            }
        });
        // Whether the rule changed anything: weighed again with every load, only when it
        // left a place out (rare: a later turn, a freed slot, a free one at the holder).
        if !spared.is_empty()
            && narrow(settings, keys, depths, |i| {
                candidates[i].load().routing_load(now)
            })
            .outcome
                == narrowing.outcome
        {
            spared.clear();
        }
        (narrowing, spared)
    }

    /// `candidates` (at `depths`) split for a later turn the gate moves: the places it may
    /// go, with their depths, and those it [would land on a freed slot
    /// at](Self::lands_on_freed_slot), which the gate did not weigh either (none unless a
    /// cluster it moves from has a slot free). Those it moves from (the session's cluster,
    /// `moved_from`, else the prefix's holders by `narrowing`) are not places it moves to,
    /// and stay.
    fn spare_freed_landings(
        &self,
        candidates: Vec<Arc<Cluster>>,
        depths: Vec<usize>,
        keys: &PrefixKeys,
        narrowing: &Narrowing,
        moved_from: Option<usize>,
        now: Instant,
    ) -> (Vec<Arc<Cluster>>, Vec<usize>, Vec<Arc<Cluster>>) {
        let left_from = |i: usize, depth: usize| {
            moved_from == Some(i)
                || (narrowing.outcome != Outcome::NoMatch && depth == narrowing.deepest)
        };
        let left = candidates
            .iter()
            .zip(&depths)
            .enumerate()
            .filter(|&(i, (_, &depth))| left_from(i, depth));
        let stays_free = Self::slot_free_where_it_is(keys, left.map(|(_, (c, _))| c), now);
        let (spared, kept): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .zip(depths)
            .enumerate()
            .partition(|&(i, (ref c, depth))| {
                stays_free && !left_from(i, depth) && self.lands_on_freed_slot(c, keys, now)
            });
        let (candidates, depths) = kept.into_iter().map(|(_, kept)| kept).unzip();
        let spared = spared.into_iter().map(|(_, (c, _))| c).collect();
        (candidates, depths, spared)
    }

    /// Whether a candidate has a free slot that did not [just go idle](Self::just_freed):
    /// somewhere a newcomer takes no live conversation's slot.
    fn free_elsewhere(&self, candidates: &[Arc<Cluster>], now: Instant) -> bool {
        candidates
            .iter()
            .any(|c| c.load().free_slot(now) == Some(true) && !self.just_freed(c, now))
    }

    /// `outcome` with `candidates` left but those whose slots [just freed](Self::just_freed)
    /// when another has a free slot that did not, [passed over](Decision::passed_over):
    /// for a request too short to key, which goes by load and takes whichever idle slot
    /// the engine gives it. All of them otherwise.
    fn spare_just_freed(
        &self,
        outcome: Outcome,
        candidates: Vec<Arc<Cluster>>,
        now: Instant,
    ) -> Decision {
        let freed: Vec<bool> = candidates.iter().map(|c| self.just_freed(c, now)).collect();
        if !freed.contains(&true) || !self.free_elsewhere(&candidates, now) {
            return Decision::undecided(Some(outcome), candidates);
        }
        let (passed_over, kept): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .zip(freed)
            .partition(|&(_, freed)| freed);
        Decision {
            passed_over: passed_over.into_iter().map(|(c, _)| c).collect(),
            ..Decision::undecided(Some(outcome), kept.into_iter().map(|(c, _)| c).collect())
        }
    }

    /// The whole affinity rule for one request.
    ///
    /// `candidates` are the admitted clusters serving the request's model
    /// ([`GridView::candidates`](crate::grid::GridView::candidates)); `keys` the request's
    /// prefix keys (`None` when it has none); `session` its session key, if the client
    /// named one; `draw` a uniform random number in `[0, 1)` for the exploration share.
    /// With affinity disabled or fewer than two candidates there is nothing to decide:
    /// every candidate stays and the outcome is `None`. Otherwise:
    ///
    /// - no keys and no session is [`Outcome::NotApplicable`], `draw < exploration` is
    ///   [`Outcome::Exploration`] unless the prompt continues a conversation
    ///   ([`PrefixKeys::continues_conversation`]), else [`narrow`] on the index's depths
    ///   at `now`. The first goes without the candidates whose slots [just went
    ///   idle](crate::grid::ClusterLoad::slot_just_freed), on engines not learned to keep
    ///   shared heads, while another has a free slot that did not;
    /// - a sticky match shorter than [`STICKY_MATCH_BYTES`] for a request that opens a
    ///   conversation (its prompt holds no earlier answer,
    ///   [`PrefixKeys::opens_conversation`], or its session no candidate has answered),
    ///   which can only be matching a head others share, is [`Outcome::LoadOverride`] when
    ///   its least loaded holder is busier than the least loaded other candidate: it is not
    ///   crowded in beside the conversations there. A head that long sticks on its own
    ///   length and is the load gate's to weigh: its prefill is worth saving wherever it
    ///   lives, while a shorter one sticks only because the question after it is shorter
    ///   still, and the conversation outgrows it within a turn or two. Except where a
    ///   busier holder has a free slot and its engines [keep shared
    ///   heads](Self::keeps_shared_heads) (a host prompt cache, learned from answers): the
    ///   request stays [`Outcome::Sticky`] with the least loaded of those holders alone,
    ///   counted in flight there at once ([`Decision::placed`]), and finds the head there
    ///   (what it may cost a live conversation there: the module's step 3). A first
    ///   turn whose holders are no busier passes over those whose slot just went idle, on
    ///   engines not learned to keep shared heads: it stays with the other holders when
    ///   one has a free slot that did not, else, while another candidate has one, it is
    ///   [`Outcome::LoadOverride`], placed among the others as a prompt that matches
    ///   nothing. Such a first turn stuck to a holder no busier than the others
    ///   [asks](Decision::asks_shared_head) whether the head was kept;
    /// - a sticky prefix match wins. Otherwise, with
    ///   [`session_affinity`](AffinitySettings::session_affinity) on and the prompt the
    ///   request continues ([`PrefixKeys::follows`]) or else its session last answered at
    ///   one of the candidates ([`PrefixIndex::session`]), the load gate weighs
    ///   that cluster against the others at the prompt it is believed to hold for the
    ///   request: the session's last confirmed prompt, capped by the request's own and by
    ///   the index's depth for the request's keys there. The
    ///   gate passing is [`Outcome::Session`] with that cluster alone; failing it is
    ///   [`Outcome::LoadOverride`], the candidates left as the prefix rule left them, by
    ///   load first;
    /// - a conversation's later turn ([`PrefixKeys::continues_conversation`]) the gate
    ///   would move, by prefix or by session, off a cluster with a slot free does not
    ///   weigh a candidate whose one free slot [just went
    ///   idle](crate::grid::ClusterLoad::slot_just_freed) among the lighter ones, and a
    ///   move leaves it out, [passed over](Decision::passed_over);
    /// - [`Outcome::NoMatch`] narrows the candidates as the module's rule, step 2, says:
    ///   on engines with slots to one with a free slot, recording what it was sent.
    ///
    /// A request that opens a conversation (as above) or is too short to key, whatever the
    /// outcome, says where it waits before it reaches the engine ([`Decision::holds`]).
    pub fn decide(
        &self,
        candidates: Vec<Arc<Cluster>>,
        keys: Option<&PrefixKeys>,
        session: Option<SessionKey>,
        now: Instant,
        draw: f64,
    ) -> Decision {
        // Whether any candidate holds a newcomer now, first: most decisions end there.
        let newcomer = candidates.iter().any(|c| self.hold_until(c, now).is_some())
            && self.is_newcomer(&candidates, keys, session, now);
        let mut decision = self.decide_among(candidates, keys, session, now, draw);
        if newcomer && decision.outcome.is_some() {
            decision.holds = decision
                .clusters
                .iter()
                .filter_map(|c| Some((c.id().clone(), self.hold_until(c, now)?)))
                .collect();
        }
        decision
    }

    /// Until when a newcomer sent to `cluster` now waits: while a slot there [just went
    /// idle](Self::just_freed) (so not where heads are kept), until
    /// [`ClusterLoad::reclaim_hold_until`](crate::grid::ClusterLoad::reclaim_hold_until).
    fn hold_until(&self, cluster: &Cluster, now: Instant) -> Option<Instant> {
        let until = cluster.load().reclaim_hold_until(now)?;
        (!self.heads.kept(cluster.id())).then_some(until)
    }

    /// Whether a request is a newcomer to every candidate: too short to key and with no
    /// session, or opening a conversation ([`PrefixKeys::opens_conversation`], and a
    /// session, if it names one that affinity reads, no candidate has answered).
    fn is_newcomer(
        &self,
        candidates: &[Arc<Cluster>],
        keys: Option<&PrefixKeys>,
        session: Option<SessionKey>,
        now: Instant,
    ) -> bool {
        let session = session.filter(|_| self.settings().session_affinity());
        keys.is_none_or(PrefixKeys::opens_conversation)
            && session.is_none_or(|session| self.is_new(candidates, session, now))
    }

    /// [`decide`](Self::decide) but for where the request waits.
    fn decide_among(
        &self,
        mut candidates: Vec<Arc<Cluster>>,
        keys: Option<&PrefixKeys>,
        session: Option<SessionKey>,
        now: Instant,
        draw: f64,
    ) -> Decision {
        let settings = self.settings();
        if !settings.enabled() || candidates.len() < 2 {
            return Decision::undecided(None, candidates);
        }
        let session = session.filter(|_| settings.session_affinity());
        if keys.is_none() && session.is_none() {
            return self.spare_just_freed(Outcome::NotApplicable, candidates, now);
        }
        // A conversation's later turn matches its own history beyond any shared head: no
        // other conversation will ask a second site for it, and exploring it would only
        // pay its whole prefill again.
        if draw < settings.exploration()
            && (settings.explores_continuations()
                || !keys.is_some_and(PrefixKeys::continues_conversation))
        {
            return Decision::undecided(Some(Outcome::Exploration), candidates);
        }
        let Some(keys) = keys else {
            // A session without a prompt to key (token ids, an unknown part type, ...).
            let Some(found) = self.session_gate(&settings, &candidates, session, None, now) else {
                return Decision::undecided(Some(Outcome::NotApplicable), candidates);
            };
            return found.decided(candidates, 0);
        };
        let mut depths = self
            .index
            .depths(candidates.iter().map(|c| c.id()), keys.as_slice(), now);
        let priced = self.priced_for_match(&settings, &candidates, &depths);
        let (mut narrowing, gate_spared) = self.narrow_at(&priced, &candidates, keys, &depths, now);
        let first_turn = self.first_turn(
            &settings,
            &mut narrowing,
            &candidates,
            &depths,
            keys,
            session,
            now,
        );
        let mut outcome = narrowing.outcome;
        // The prompt this one continues, to the byte: where its conversation was served.
        let thread = keys.follows().filter(|_| settings.session_affinity());
        let mut moved_from = None;
        if outcome != Outcome::Sticky {
            // The conversation's own thread first: a client's session may span several
            // conversations.
            let prefix = Some((keys, &depths[..]));
            let found = self
                .session_gate(&settings, &candidates, thread, prefix, now)
                .or_else(|| self.session_gate(&settings, &candidates, session, prefix, now));
            match found {
                Some(found) if found.sticks => {
                    let depth = depths[found.at];
                    return found.decided(candidates, depth);
                }
                // The session's cluster is too busy for what it holds: the candidates stay
                // as the prefix rule left them, and the move leaves that cluster.
                Some(found) => (outcome, moved_from) = (Outcome::LoadOverride, Some(found.at)),
                None => {}
            }
        }
        let mut placed = None;
        let joins_busier_holder = first_turn.joins.is_some() && outcome == Outcome::Sticky;
        let mut passed_over = [first_turn.passed_over, gate_spared].concat();
        if outcome == Outcome::LoadOverride && !first_turn.placed_away {
            let spared;
            (candidates, depths, spared) =
                self.spare_freed_landings(candidates, depths, keys, &narrowing, moved_from, now);
            passed_over.extend(spared);
        }
        if first_turn.placed_away {
            (candidates, placed) = self.place_away(
                &settings,
                &candidates,
                keys,
                &depths,
                narrowing.deepest,
                now,
            );
        } else if narrowing.outcome == Outcome::NoMatch {
            (candidates, placed) =
                self.place_unmatched(&settings, outcome, &candidates, keys, &depths, now);
        } else if let Some((joined, counted)) = first_turn.joins {
            candidates = vec![joined];
            placed = Some(counted);
        } else {
            let sticky_thread = thread.filter(|_| outcome == Outcome::Sticky);
            candidates = self.keep_holders(
                &settings,
                candidates,
                &depths,
                &narrowing,
                &mut passed_over,
                (keys, sticky_thread),
                now,
            );
        }
        Decision {
            outcome: Some(outcome),
            deepest: narrowing.deepest,
            covered_bytes: keys.covered_bytes(narrowing.deepest),
            clusters: candidates,
            placed,
            asks_shared_head: first_turn.asks_shared_head && outcome == Outcome::Sticky,
            joins_busier_holder,
            passed_over,
            holds: Vec::new(),
        }
    }

    /// The holders `narrowing` keeps, but those `passed_over`. Of several, for a sticky
    /// request with a thread (`thread`, given only then), the one its thread was last
    /// answered at when the gate lets it stick there: holders tied at a head shared by
    /// other conversations, since blocks stop at 256 bytes and never hold the answers, so
    /// the index cannot tell which of them holds this conversation. Its thread can, and
    /// the gate weighs that holder against the others at what it holds there (the holders
    /// that weighing [passed over](Decision::passed_over) join `passed_over`).
    #[allow(clippy::too_many_arguments)]
    fn keep_holders(
        &self,
        settings: &AffinitySettings,
        candidates: Vec<Arc<Cluster>>,
        depths: &[usize],
        narrowing: &Narrowing,
        passed_over: &mut Vec<Arc<Cluster>>,
        (keys, thread): (&PrefixKeys, Option<SessionKey>),
        now: Instant,
    ) -> Vec<Arc<Cluster>> {
        let (kept, kept_depths): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .zip(depths)
            .filter(|&(ref c, &depth)| {
                narrowing.keeps(depth) && !passed_over.iter().any(|p| Arc::ptr_eq(p, c))
            })
            .map(|(c, &depth)| (c, depth))
            .unzip();
        if thread.is_some() && kept.len() > 1 {
            let prefix = Some((keys, &kept_depths[..]));
            if let Some(found) = self.session_gate(settings, &kept, thread, prefix, now)
                && found.sticks
            {
                passed_over.extend(found.passed_over);
                return vec![Arc::clone(&kept[found.at])];
            }
        }
        kept
    }

    /// A first turn placed away from its holders ([`FirstTurn::placed_away`]), placed
    /// among the other candidates (those not at `deepest`) as a prompt that matches
    /// nothing: those it goes to and its count in flight there.
    fn place_away(
        &self,
        settings: &AffinitySettings,
        candidates: &[Arc<Cluster>],
        keys: &PrefixKeys,
        depths: &[usize],
        deepest: usize,
        now: Instant,
    ) -> (Vec<Arc<Cluster>>, Option<Placed>) {
        let (others, other_depths): (Vec<_>, Vec<_>) = candidates
            .iter()
            .zip(depths)
            .filter(|&(_, &depth)| depth != deepest)
            .map(|(c, &depth)| (Arc::clone(c), depth))
            .unzip();
        self.place_unmatched(
            settings,
            Outcome::NoMatch,
            &others,
            keys,
            &other_depths,
            now,
        )
    }

    /// `settings` priced for the request's match at `candidates` (their `depths`): with
    /// learned prices, the deepest holders' prefill is saved at the slowest of them, the
    /// one it saves most on, against the dearest of their queues. Under the floor there is
    /// no match to price ([`narrow`] returns no_match first).
    fn priced_for_match(
        &self,
        settings: &AffinitySettings,
        candidates: &[Arc<Cluster>],
        depths: &[usize],
    ) -> AffinitySettings {
        let deepest = depths.iter().copied().max().unwrap_or(0);
        if !settings.learns_prices() || deepest < MIN_STICKY_DEPTH {
            return *settings;
        }
        let (rate, queued) = candidates
            .iter()
            .zip(depths)
            .filter(|&(_, &depth)| depth == deepest)
            .map(|(c, _)| self.prices_under(settings, c.id()))
            .fold((f64::INFINITY, 0.0_f64), |(rate, queued), p| {
                (
                    rate.min(p.prefill_tokens_per_second),
                    queued.max(p.queued_request_seconds),
                )
            });
        settings.priced_at(rate, queued)
    }

    /// A new conversation behind a short shared head (see [`decide`](Self::decide)): turns
    /// a sticky `narrowing` at a busier holder into [`Outcome::LoadOverride`], unless some
    /// busier holder has a free slot and keeps shared heads, and says which one it joins
    /// (the least loaded, counted in flight there under the lock the free-slot rule takes)
    /// and whether its answer teaches the tally. Any other request is left as it is.
    #[allow(clippy::too_many_arguments)]
    fn first_turn(
        &self,
        settings: &AffinitySettings,
        narrowing: &mut Narrowing,
        candidates: &[Arc<Cluster>],
        depths: &[usize],
        keys: &PrefixKeys,
        session: Option<SessionKey>,
        now: Instant,
    ) -> FirstTurn {
        let mut first = FirstTurn::default();
        let opens = narrowing.outcome == Outcome::Sticky
            && keys.covered_bytes(narrowing.deepest) < STICKY_MATCH_BYTES
            && (keys.opens_conversation()
                || session.is_some_and(|session| self.is_new(candidates, session, now)));
        if !opens {
            return first;
        }
        if narrowing.holder_busier {
            // The slots are read and the join counted in flight under the lock a free-slot
            // placement takes (see `Placed`): two newcomers in one burst would otherwise
            // both see the same free slot and both join it.
            let placements = self.placed.at(now);
            let joinable = candidates.iter().zip(depths).filter(|&(c, &depth)| {
                depth == narrowing.deepest
                    && c.load().free_slot(now) == Some(true)
                    && self.heads.kept(c.id())
            });
            // The one `Select` would pick among them, ties to the first.
            if let Some(cluster) = least_loaded(joinable.map(|(c, _)| c), now, 0) {
                let held =
                    PredictedMatch::new(narrowing.deepest, keys.covered_bytes(narrowing.deepest));
                let prefill = prefill_bytes(Some(keys), Some(&held));
                let (load, in_flight) = count_in_flight(cluster, None, prefill, now);
                let counted = Placed::new(cluster.id().clone(), load, in_flight);
                first.joins = Some((Arc::clone(cluster), counted));
            } else {
                narrowing.outcome = Outcome::LoadOverride;
            }
            drop(placements);
        } else {
            // At a holder of the head where an answer just ended, the newcomer would take
            // the idle slot sharing its head (the longest common prefix), likely that live
            // conversation's, and push its prompt out. Such holders are passed over: for
            // another holder with a free slot that did not just go idle, where the head is
            // found at no one's cost; else, with such a slot at a non-holder, the newcomer
            // is placed among the others as a prompt matching nothing (the free-slot rule)
            // and pays the head's prefill.
            let holders: Vec<Arc<Cluster>> = candidates
                .iter()
                .zip(depths)
                .filter(|&(_, &depth)| depth == narrowing.deepest)
                .map(|(c, _)| Arc::clone(c))
                .collect();
            let freed: Vec<Arc<Cluster>> = holders
                .iter()
                .filter(|c| self.just_freed(c, now))
                .cloned()
                .collect();
            if !freed.is_empty() {
                if self.free_elsewhere(&holders, now) {
                    first.passed_over = freed;
                } else if self.free_elsewhere(candidates, now) {
                    narrowing.outcome = Outcome::LoadOverride;
                    first.passed_over = freed;
                    first.placed_away = true;
                    return first;
                }
            }
            // Sent under the rule that does not crowd: its answer says whether the holder
            // kept the head. One that joined a busier holder would find it in a live
            // conversation's idle slot either way.
            first.asks_shared_head = settings.engine_feedback();
        }
        first
    }

    /// Whether no candidate has answered `session`: the request is a conversation's first
    /// turn, so a sticky match can only be a head other conversations share (a system
    /// prompt), not its own history. Sent to a busier holder it would save that head's
    /// prefill once, then share the holder with the conversations already there for as
    /// long as it lasts: on an engine with a few slots, one of them loses its prompt at
    /// every turn.
    fn is_new(&self, candidates: &[Arc<Cluster>], session: SessionKey, now: Instant) -> bool {
        candidates
            .iter()
            .all(|c| self.index.session(c.id(), session, now).is_none())
    }

    /// The session step: where `session` was last answered among `candidates`, and whether
    /// the load gate lets the request wait for that cluster. `None` when there is no
    /// session or no candidate holds it.
    fn session_gate(
        &self,
        settings: &AffinitySettings,
        candidates: &[Arc<Cluster>],
        session: Option<SessionKey>,
        keys: Option<(&PrefixKeys, &[usize])>,
        now: Instant,
    ) -> Option<SessionFound> {
        let session = session?;
        // The most recent confirmation: a session that moved holds its latest prompt
        // where it went.
        let (at, entry) = candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, self.index.session(c.id(), session, now)?)))
            .max_by_key(|(_, hold)| (hold.confirmed(), hold.held_bytes()))?;
        // What the cluster is believed to hold for this request: the session's last
        // confirmed prompt, capped by the request's own, and by how deep the index still
        // holds the request's keys there. The index's depth is what it knows of the
        // prompt itself: after an eviction it forgot, or when the session's last prompt
        // was another conversation's (one `user_id` for all of a user's chats), the
        // session alone would price a prefix the engine does not hold.
        let held = keys.map_or(entry.held_bytes(), |(keys, depths)| {
            entry
                .held_bytes()
                .min(keys.total_covered_bytes())
                .min(keys.covered_bytes(depths[at]))
        });
        let prices = self.prices_under(settings, candidates[at].id());
        let worth = settings
            .priced_at(
                prices.prefill_tokens_per_second,
                prices.queued_request_seconds,
            )
            .match_worth(held);
        let here = candidates[at].load().routing_load(now);
        // Nor are the places a move would land only on a live conversation's slot weighed,
        // while a slot is free here.
        // The request's keys where the rule applies (a later turn, a slot free here).
        let guarded_keys = keys
            .map(|(keys, _)| keys)
            .filter(|&keys| Self::slot_free_where_it_is(keys, [&candidates[at]].into_iter(), now));
        let (mut others, mut every_other) = (f64::INFINITY, f64::INFINITY);
        let mut spared = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            if i == at {
                continue;
            }
            let load = c.load().routing_load(now);
            every_other = every_other.min(load);
            if guarded_keys.is_some_and(|keys| self.lands_on_freed_slot(c, keys, now)) {
                spared.push(Arc::clone(c));
            } else {
                others = others.min(load);
            }
        }
        // As in `narrow`: an unmeasured cluster gives way to a measured other, and two
        // unmeasured ones give NaN, which exceeds nothing.
        let overloaded = here - others > worth;
        // Passed over only where leaving them out kept the request here.
        let moved_by_every_load = here - every_other > worth;
        if overloaded || !moved_by_every_load {
            spared.clear();
        }
        Some(SessionFound {
            at,
            held,
            sticks: !overloaded,
            passed_over: spared,
        })
    }
}

/// What [`Affinity::first_turn`] decided for a new conversation behind a short shared head.
#[derive(Default)]
struct FirstTurn {
    /// The candidate it joins (the least loaded of the busier holders with a free slot
    /// that keep shared heads), when it joins one, and its count in flight there.
    joins: Option<(Arc<Cluster>, Placed)>,
    /// Whether its answer tells if its holder kept the head.
    asks_shared_head: bool,
    /// No holder has a free slot that did not [just go idle](Affinity::just_freed), one
    /// did, and another candidate has a free slot that did not: placed among the others
    /// as a prompt that matches nothing, with the outcome `load_override`.
    placed_away: bool,
    /// The holders whose slots [just went idle](Affinity::just_freed), left out: for the
    /// others when one has a free slot that did not, else by `placed_away`. Empty when
    /// neither applies.
    passed_over: Vec<Arc<Cluster>>,
}

/// What the session step found: the cluster that last answered the session, the prompt it
/// is believed to hold for the request, and whether the load gate lets it stick.
struct SessionFound {
    at: usize,
    held: u64,
    sticks: bool,
    /// The places left out of the gate's weighing whose leaving out kept the request at
    /// its session's cluster (the gate would have moved it): [passed
    /// over](Decision::passed_over).
    passed_over: Vec<Arc<Cluster>>,
}

impl SessionFound {
    /// The decision, with `depth` the chosen cluster's depth for the request's keys.
    fn decided(self, mut candidates: Vec<Arc<Cluster>>, depth: usize) -> Decision {
        if self.sticks {
            let chosen = candidates.swap_remove(self.at);
            Decision {
                outcome: Some(Outcome::Session),
                deepest: depth,
                covered_bytes: self.held,
                clusters: vec![chosen],
                placed: None,
                asks_shared_head: false,
                joins_busier_holder: false,
                passed_over: self.passed_over,
                holds: Vec::new(),
            }
        } else {
            Decision {
                outcome: Some(Outcome::LoadOverride),
                deepest: depth,
                covered_bytes: self.held,
                clusters: candidates,
                placed: None,
                asks_shared_head: false,
                joins_busier_holder: false,
                passed_over: Vec::new(),
                holds: Vec::new(),
            }
        }
    }
}

impl Affinity {
    /// Where a request whose match does not stick goes ([`Outcome::NoMatch`]).
    ///
    /// - On engines with slots (every candidate's are known: llama.cpp's `--parallel N`),
    ///   when `outcome` is still [`Outcome::NoMatch`] and the settings
    ///   [place on free slots](AffinitySettings::places_on_free_slots), when some
    ///   candidate has a free one
    ///   ([`free_slot`](crate::grid::ClusterLoad::free_slot)): the request starts
    ///   at once on any of them, so load does not rank them, and neither does a match
    ///   too short to stick (a head other conversations share, which pulls every new
    ///   conversation behind it onto the engines already holding theirs). A free slot
    ///   where the prompts waiting for their first token would hold the request back
    ///   more than [`FREE_SLOT_WAIT_FACTOR`](super::FREE_SLOT_WAIT_FACTOR) times its own
    ///   prefill beyond the free slot that starts it soonest goes behind the others
    ///   ([`held_back`](Self::held_back)). Then the one with the most room goes first:
    ///   the fewest live index entries, or behind a shared index ([`index_shared`](Self::index_shared)) the fewest bytes of new prompt this
    ///   replica sent it lately in requests that matched nothing
    ///   ([`PLACED_HALF_LIFE`](super::PLACED_HALF_LIFE)); then the least loaded, then the
    ///   one with the fewest prompt bytes waiting for their first token
    ///   ([`prefill_waiting_bytes`](crate::grid::ClusterLoad::prefill_waiting_bytes): a
    ///   slot engine prefills one pass at a time, so a free slot behind a long prefill
    ///   starts late), then the first (why: the [module](super)'s rule, step 2, and the
    ///   `room` module).
    /// - Otherwise [`roomiest`](Self::roomiest), where load comes first.
    ///
    /// A session whose cluster the gate found too busy (`outcome` is
    /// [`Outcome::LoadOverride`]) goes by load first: placed on a free slot by room it
    /// could go straight back there.
    ///
    /// With [`ranks_free_slots_by_depth`](AffinitySettings::ranks_free_slots_by_depth)
    /// (the rule before, which the simulator measures the default against) free slots are
    /// ranked by the most of the prompt held first (a depth under [`MIN_STICKY_DEPTH`]
    /// counts as none), then by room.
    ///
    /// On a grid of engines with slots, when it names one cluster, that cluster is
    /// recorded as sent the prompt's bytes beyond its depth there (unless a reload has
    /// just removed it), and the request is counted in flight there at once, under the
    /// lock the rule reads under ([`Placed`], returned with the clusters).
    fn place_unmatched(
        &self,
        settings: &AffinitySettings,
        outcome: Outcome,
        candidates: &[Arc<Cluster>],
        keys: &PrefixKeys,
        depths: &[usize],
        now: Instant,
    ) -> (Vec<Arc<Cluster>>, Option<Placed>) {
        let on_free_slots = outcome == Outcome::NoMatch && settings.places_on_free_slots();
        let by_depth = settings.ranks_free_slots_by_depth();
        // One lock for reading the slots, loads and sums and adding to them: two new
        // conversations placed at once do not both take the same free slot or the same
        // cluster for the roomiest.
        let mut placed = on_free_slots.then(|| self.placed.at(now));
        // Whether each candidate has a slot free; `None` unless every one's slots are known.
        let free: Option<Vec<bool>> = if on_free_slots {
            candidates.iter().map(|c| c.load().free_slot(now)).collect()
        } else {
            None
        };
        let mut counted = None;
        let chosen = match (free, placed.as_mut()) {
            (Some(free), Some(placed)) => {
                // What stands for the room each cluster's engines have: see above.
                let shared = self.index_shared();
                let room = |cluster: &ClusterId| {
                    if shared {
                        placed.bytes(cluster)
                    } else {
                        self.index.live_entries(cluster, now) as f64
                    }
                };
                // Every depth alike unless ranked by depth: room decides.
                let depth = |i: usize| {
                    if by_depth {
                        preferred_depth(depths[i])
                    } else {
                        0
                    }
                };
                let prefill = prefill_bytes(Some(keys), None);
                let held_back = self.held_back(settings, candidates, &free, prefill);
                let chosen = Self::freest_slot(candidates, &free, &held_back, depth, room, now)
                    .map_or_else(|| self.roomiest(candidates, depths, now), |at| vec![at]);
                if let &[at] = chosen.as_slice() {
                    let cluster = &candidates[at];
                    if self.index.knows(cluster.id()) {
                        let new_bytes = keys
                            .total_covered_bytes()
                            .saturating_sub(keys.covered_bytes(depths[at]));
                        placed.add(cluster.id(), new_bytes);
                    }
                    // Counted in flight before the lock is let go, as `Select` would count
                    // it (see `Placed`).
                    let (load, in_flight) = count_in_flight(cluster, None, prefill, now);
                    counted = Some(Placed::new(cluster.id().clone(), load, in_flight));
                }
                chosen
            }
            _ => self.roomiest(candidates, depths, now),
        };
        drop(placed);
        let chosen = chosen
            .into_iter()
            .map(|at| Arc::clone(&candidates[at]))
            .collect();
        (chosen, counted)
    }

    /// Which candidates' free slots (`free[i]` for candidate `i`) would hold a new
    /// conversation of `prefill` prompt bytes back too long to be taken for their room:
    /// those where the prompt bytes waiting for their first token would take more than
    /// [`free_slot_wait_factor`](AffinitySettings::free_slot_wait_factor) times the
    /// request's own prefill longer than at the free slot where the least waits, both at
    /// the cluster's prefill speed (see [`FREE_SLOT_WAIT_FACTOR`](super::FREE_SLOT_WAIT_FACTOR)).
    /// None with an infinite factor, or fewer than two free slots to choose from.
    fn held_back(
        &self,
        settings: &AffinitySettings,
        candidates: &[Arc<Cluster>],
        free: &[bool],
        prefill: u64,
    ) -> Vec<bool> {
        let factor = settings.free_slot_wait_factor();
        let mut held_back = vec![false; candidates.len()];
        if factor.is_infinite() || free.iter().filter(|&&free| free).count() < 2 {
            return held_back;
        }
        // Seconds at each free slot's cluster: its prompts waiting, the request's own.
        let seconds: Vec<Option<(f64, f64)>> = candidates
            .iter()
            .zip(free)
            .map(|(cluster, &free)| {
                free.then(|| {
                    // Bytes to prefill seconds as the load gate prices a match.
                    let gate = self.prices_under(settings, cluster.id());
                    let at_speed = settings
                        .priced_at(gate.prefill_tokens_per_second, gate.queued_request_seconds);
                    let waiting = cluster.load().prefill_waiting_bytes();
                    (
                        at_speed.saved_seconds(waiting),
                        at_speed.saved_seconds(prefill),
                    )
                })
            })
            .collect();
        let soonest = seconds
            .iter()
            .flatten()
            .map(|&(waiting, _)| waiting)
            .fold(f64::INFINITY, f64::min);
        for (held_back, seconds) in held_back.iter_mut().zip(&seconds) {
            if let &Some((waiting, own)) = seconds {
                *held_back = waiting > soonest + factor * own;
            }
        }
        held_back
    }

    /// The candidate with a free slot (`free[i]` for candidate `i`) a request that matches
    /// nothing takes (see [`place_unmatched`](Self::place_unmatched)), ranked by `depth`,
    /// then not `held_back` before held back, then by the rest of the rule; `None` when
    /// none has one.
    fn freest_slot(
        candidates: &[Arc<Cluster>],
        free: &[bool],
        held_back: &[bool],
        depth: impl Fn(usize) -> usize,
        room: impl Fn(&ClusterId) -> f64,
        now: Instant,
    ) -> Option<usize> {
        type Rank = (std::cmp::Reverse<usize>, bool, f64, f64, u64, usize);
        let order = |a: &Rank, b: &Rank| {
            a.0.cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.total_cmp(&b.2))
                .then(a.3.total_cmp(&b.3))
                .then(a.4.cmp(&b.4))
                .then(a.5.cmp(&b.5))
        };
        (0..candidates.len())
            .filter(|&i| free[i])
            .map(|i| {
                let c = &candidates[i];
                let (load, in_flight) = load_rank(c, now);
                let prefill = c.load().prefill_waiting_bytes();
                let rank: Rank = (
                    std::cmp::Reverse(depth(i)),
                    held_back[i],
                    room(c.id()),
                    load,
                    prefill,
                    in_flight,
                );
                (i, rank)
            })
            .min_by(|a, b| order(&a.1, &b.1))
            .map(|(i, _)| i)
    }

    /// Where a request whose match does not stick may go when no free slot decides
    /// ([`place_unmatched`](Self::place_unmatched)): the positions in `candidates` of the
    /// least loaded (as [`least_loaded`](crate::select::least_loaded) ranks them), among
    /// those the ones holding the most of its prompt (`depths[i]` is candidate `i`'s; a
    /// depth under [`MIN_STICKY_DEPTH`] counts as none), and among those the ones whose
    /// index holds the fewest live entries, in order.
    ///
    /// A match too short to stick is still prefill saved where load ties: a conversation
    /// whose new turn adds more than `1 - threshold` of its prompt (a fifth at the
    /// default) goes back to its engine when that engine is no busier than the others,
    /// instead of to whichever engine has the most room. Between its turns a conversation
    /// is in no cluster's load, so by load and depth alone a new conversation lands as
    /// often on an engine whose cache is full of others (which it then evicts) as on one
    /// with room. The fewest entries stand for the most room, as the smallest radix tree
    /// does in SGLang's and vLLM's cache-aware routers. Load still comes first here: on a
    /// batching engine a request waits behind the prefills ahead of it, and depth and
    /// room only break ties.
    fn roomiest(&self, candidates: &[Arc<Cluster>], depths: &[usize], now: Instant) -> Vec<usize> {
        type Rank = (f64, usize, std::cmp::Reverse<usize>, usize);
        let rank = |c: &Cluster, depth: usize| {
            let (load, in_flight) = load_rank(c, now);
            (
                load,
                in_flight,
                std::cmp::Reverse(depth),
                self.index.live_entries(c.id(), now),
            )
        };
        let order = |a: &Rank, b: &Rank| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.3.cmp(&b.3))
        };
        let ranked: Vec<Rank> = candidates
            .iter()
            .zip(depths)
            .map(|(c, &depth)| rank(c, preferred_depth(depth)))
            .collect();
        let Some(best) = ranked.iter().copied().min_by(order) else {
            return Vec::new();
        };
        (0..ranked.len())
            .filter(|&i| order(&ranked[i], &best).is_eq())
            .collect()
    }
}

/// A depth as placement prefers it: under [`MIN_STICKY_DEPTH`] a match is no preference,
/// so identical short prompts spread.
fn preferred_depth(depth: usize) -> usize {
    if depth < MIN_STICKY_DEPTH { 0 } else { depth }
}

impl fmt::Debug for Affinity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Affinity")
            .field("index", &self.index)
            .field("settings", &self.settings())
            .field("prices", &self.prices)
            .field("placed", &self.placed)
            .field("heads", &self.heads)
            .field("index_shared", &self.index_shared())
            .finish()
    }
}

/// What [`Affinity::decide`] made of one request.
#[derive(Debug, Clone)]
pub struct Decision {
    outcome: Option<Outcome>,
    deepest: usize,
    covered_bytes: u64,
    clusters: Vec<Arc<Cluster>>,
    placed: Option<Placed>,
    asks_shared_head: bool,
    joins_busier_holder: bool,
    passed_over: Vec<Arc<Cluster>>,
    holds: Vec<(ClusterId, Instant)>,
}

impl Decision {
    /// `outcome` with every candidate in `clusters` staying, no depth looked up.
    fn undecided(outcome: Option<Outcome>, clusters: Vec<Arc<Cluster>>) -> Self {
        Self {
            outcome,
            deepest: 0,
            covered_bytes: 0,
            clusters,
            placed: None,
            asks_shared_head: false,
            joins_busier_holder: false,
            passed_over: Vec::new(),
            holds: Vec::new(),
        }
    }

    /// The candidates left out because a slot there [just went
    /// idle](crate::grid::ClusterLoad::slot_just_freed) while another had a free slot that
    /// did not (the module's rule, step 2): for a request too short to key, for a first
    /// turn the holders of its short head, and for a later turn the load gate would move
    /// off a cluster with a slot free the clusters whose one free slot just went idle:
    /// left out of where it moves, or of the gate's weighing when that kept it where it
    /// was. Empty otherwise.
    pub fn passed_over(&self) -> &[Arc<Cluster>] {
        &self.passed_over
    }

    /// Where the request, a new conversation or a prompt too short to key, waits before it
    /// reaches the engine, and until when: the candidates left where a slot [just went
    /// idle](crate::grid::ClusterLoad::reclaim_hold_until), on engines not learned to keep
    /// shared heads (the module's rule, step 2). [`Select`](crate::select::Select) holds
    /// it there if it picks one of them. Empty otherwise.
    pub fn holds(&self) -> &[(ClusterId, Instant)] {
        &self.holds
    }

    /// Whether the request is a conversation's first turn that joins a busier holder of a
    /// short head other conversations share, one with a free slot whose engines keep
    /// shared heads ([`Affinity::keeps_shared_heads`]): the exception to the rule that
    /// does not crowd ([`Affinity::decide`]). The outcome is [`Outcome::Sticky`].
    pub fn joins_busier_holder(&self) -> bool {
        self.joins_busier_holder
    }

    /// Whether the request is a conversation's first turn that stuck to a holder of a
    /// short head other conversations share, no busier than the other candidates, with
    /// engine feedback on: its answer's cached tokens tell whether the holder's engines
    /// kept that head while they served others ([`Affinity::count_shared_head`]).
    pub fn asks_shared_head(&self) -> bool {
        self.asks_shared_head
    }

    /// The outcome to count; `None` when there was nothing to decide (affinity disabled,
    /// fewer than two candidates).
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// The largest depth among the candidates (0 when no depth was looked up); for
    /// [`Outcome::Session`], the depth at the session's cluster.
    pub fn deepest(&self) -> usize {
        self.deepest
    }

    /// Bytes of prompt the deepest match covers; for a decision the session step made, the
    /// bytes the session's cluster is believed to hold for the request.
    pub fn covered_bytes(&self) -> u64 {
        self.covered_bytes
    }

    /// The candidates that stay, in their original order.
    pub fn clusters(&self) -> &[Arc<Cluster>] {
        &self.clusters
    }

    /// The candidates that stay, by value.
    pub fn into_clusters(self) -> Vec<Arc<Cluster>> {
        self.clusters
    }

    /// A new conversation placed on one cluster: by the free-slot rule (a free slot's, or
    /// with none free the one least loaded), or joining a busier holder of its shared head
    /// at its free slot. The cluster that stays, where the request already counts in
    /// flight until the balancer takes the count over ([`Placed::take_for`]) or the
    /// decision and its clones are dropped.
    pub fn placed(&self) -> Option<&Placed> {
        self.placed.as_ref()
    }
}
