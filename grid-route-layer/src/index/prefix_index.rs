//! The index: one LRU per cluster behind a map that readers never lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::clock::{DeadlineClock, Secs};
use super::cluster::ClusterLru;
use super::settings::IndexSettings;
use super::shared::{IndexEvent, IndexObserver};
use crate::grid::ClusterId;
use crate::keying::{BLOCK_BYTES, HASHED_BLOCKS, SessionKey};

/// When a cluster was last confirmed for a key, from [`PrefixIndex::confirmation`]: a mark
/// to give back to [`PrefixIndex::forget_older`] of the same index. Opaque (the index
/// keeps whole seconds); marks of one index compare by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Confirmation(Secs);

/// A session's entry at one cluster, from [`PrefixIndex::session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionHold {
    confirmed: Confirmation,
    held_bytes: u64,
}

impl SessionHold {
    /// When it was last confirmed there (later marks are more recent).
    pub fn confirmed(&self) -> Confirmation {
        self.confirmed
    }

    /// Bytes of canonical prompt the last confirmed request of the session covered, in
    /// whole blocks.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }
}

/// Whole blocks of `bytes`, at most the blocks a prompt's keys can cover
/// ([`HASHED_BLOCKS`], about 4 MiB): no confirmation, a peer's included, can claim a session
/// holds more than any match could save.
fn held_blocks(bytes: u64) -> u32 {
    let blocks = (bytes / BLOCK_BYTES as u64).min(HASHED_BLOCKS as u64);
    u32::try_from(blocks).unwrap_or(u32::MAX)
}

/// What this gateway replica remembers about which cluster holds which prompt prefix.
///
/// Each cluster has its own LRU of confirmed prefix keys, each with a deadline, so one
/// cluster's traffic never evicts another's entries. Time is passed in (`now`), never read,
/// so the index is plain code that tests and the simulator drive with any clock.
///
/// Share it behind an `Arc`: every method takes `&self`. Reads ([`depth`](Self::depth),
/// [`depths`](Self::depths), [`entries`](Self::entries)) take no exclusive lock anywhere;
/// writes lock only the cluster they touch.
pub struct PrefixIndex {
    clock: DeadlineClock,
    /// The current settings and clusters, replaced whole by `reconfigure`. Readers load it
    /// with an atomic read, so they never wait behind each other or behind a reload.
    state: ArcSwap<State>,
    /// Serialises `reconfigure` calls so that two reloads cannot interleave their resizes.
    reconfiguring: Mutex<()>,
    /// Told of every confirmation and drop made here (not of applied peer events).
    observer: Option<Arc<dyn IndexObserver>>,
}

struct State {
    settings: IndexSettings,
    clusters: HashMap<ClusterId, Arc<ClusterLru>>,
}

impl PrefixIndex {
    /// An empty index for `clusters`, each with an LRU of `settings.capacity()` entries.
    pub fn new(settings: IndexSettings, clusters: impl IntoIterator<Item = ClusterId>) -> Self {
        Self::starting_at(settings, clusters, Instant::now())
    }

    /// [`new`](Self::new), with deadlines counted in whole seconds from `base` rather than
    /// from the moment it is built.
    ///
    /// Deadlines are rounded to the second from the index's base, so a caller driving
    /// virtual time (the simulator: `base + offset` for every `now`) passes its own `base`
    /// to make expiry a function of the offsets alone, the same on every run.
    pub fn starting_at(
        settings: IndexSettings,
        clusters: impl IntoIterator<Item = ClusterId>,
        base: Instant,
    ) -> Self {
        let clusters = clusters
            .into_iter()
            .map(|cluster| {
                let lru = Arc::new(ClusterLru::new(settings.capacity_nonzero()));
                (cluster, lru)
            })
            .collect();
        Self {
            clock: DeadlineClock::starting_at(base),
            state: ArcSwap::from_pointee(State { settings, clusters }),
            reconfiguring: Mutex::new(()),
            observer: None,
        }
    }

    /// This index, telling `observer` of every confirmation and drop it makes on its own
    /// (see [`IndexObserver`]). One observer per index; a later call replaces it.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn IndexObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> IndexSettings {
        self.state.load().settings
    }

    /// Records that `cluster` answered a request with prompt `keys` with 2xx at `now`.
    ///
    /// Keys are written tail first (the last key first, the first key last), so the head
    /// of the prompt is the most recent and eviction takes tails before heads. Every key
    /// gets the deadline `now + ttl` with the TTL in force; confirming a key again refreshes
    /// both its recency and its deadline. A cluster the index does not know (never
    /// configured, or removed by [`reconfigure`](Self::reconfigure) while the request was
    /// in flight) is ignored, so a late answer cannot bring a removed cluster back.
    pub fn confirm(&self, cluster: &ClusterId, keys: &[u64], now: Instant) {
        let state = self.state.load();
        if let Some(lru) = state.clusters.get(cluster) {
            let lifetime = state.settings.ttl();
            lru.confirm(
                keys,
                self.clock.deadline(now, lifetime),
                self.clock.now(now),
            );
            self.tell(&IndexEvent::Confirmed {
                cluster,
                keys,
                lifetime,
            });
        }
    }

    /// Records that `cluster` answered a request of `session` with 2xx at `now`, holding
    /// `held_bytes` of its prompt (its keys' [`total_covered_bytes`]; 0 when it had none).
    ///
    /// The session key lives in the cluster's LRU with the prefix keys: the same capacity,
    /// TTL, eviction and forgetting. It is written after the request's own keys, so it is
    /// the most recent of them. A later confirmation at the same cluster replaces the held
    /// length, so it is always the last confirmed prompt's.
    ///
    /// [`total_covered_bytes`]: crate::keying::PrefixKeys::total_covered_bytes
    ///
    /// ```
    /// use std::time::Instant;
    ///
    /// use grid_route_layer::grid::{ClusterId, SiteName};
    /// use grid_route_layer::index::{IndexSettings, PrefixIndex};
    /// use grid_route_layer::keying::SessionKey;
    ///
    /// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    /// let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    /// let session = SessionKey::from_digest(0x5eed);
    /// let now = Instant::now();
    /// assert!(index.session(&east, session, now).is_none());
    /// index.confirm_session(&east, session, 10_240, now);
    /// assert_eq!(index.session(&east, session, now).unwrap().held_bytes(), 10_240);
    /// ```
    pub fn confirm_session(
        &self,
        cluster: &ClusterId,
        session: SessionKey,
        held_bytes: u64,
        now: Instant,
    ) {
        let state = self.state.load();
        if let Some(lru) = state.clusters.get(cluster) {
            let lifetime = state.settings.ttl();
            lru.confirm_session(
                session.as_u64(),
                held_blocks(held_bytes),
                self.clock.deadline(now, lifetime),
                self.clock.now(now),
            );
            self.tell(&IndexEvent::SessionConfirmed {
                cluster,
                key: session.as_u64(),
                held_bytes,
                lifetime,
            });
        }
    }

    /// Where `session` was confirmed at `cluster`, if it still counts at `now`.
    pub fn session(
        &self,
        cluster: &ClusterId,
        session: SessionKey,
        now: Instant,
    ) -> Option<SessionHold> {
        let now = self.clock.now(now);
        let (deadline, blocks) = self
            .state
            .load()
            .clusters
            .get(cluster)?
            .session(session.as_u64(), now)?;
        Some(SessionHold {
            confirmed: Confirmation(deadline),
            held_bytes: u64::from(blocks) * BLOCK_BYTES as u64,
        })
    }

    /// Forgets the request's `keys` at `cluster` (after a 429, a 5xx or a failed
    /// connection), including the head keys other prompts share with it.
    pub fn drop_keys(&self, cluster: &ClusterId, keys: &[u64]) {
        if let Some(lru) = self.state.load().clusters.get(cluster) {
            lru.drop_keys(keys);
            self.tell(&IndexEvent::Dropped { cluster, keys });
        }
    }

    /// When `cluster` was last confirmed for `key`, as a mark for
    /// [`forget_older`](Self::forget_older); `None` when it does not hold the key at `now`.
    pub fn confirmation(
        &self,
        cluster: &ClusterId,
        key: u64,
        now: Instant,
    ) -> Option<Confirmation> {
        let now = self.clock.now(now);
        self.state
            .load()
            .clusters
            .get(cluster)?
            .deadline_of(key, now)
            .map(Confirmation)
    }

    /// Forgets, at `cluster` alone, the entries last confirmed before `than`, least recent
    /// first, and returns how many. The observer is told, as a [`IndexEvent::Dropped`] of
    /// those keys, so peers forget them too.
    ///
    /// This is how an engine's report of an eviction reaches the index: an engine whose
    /// cache evicted a prompt the index recorded at `than` has, evicting least recently
    /// used first, evicted what the index recorded before it as well; what was confirmed
    /// since (the evicted prompt itself included, once the engine served it again) stays.
    /// Entries are compared by deadline, to the second, so entries confirmed with a
    /// different TTL may stop the forgetting early (see the module's notes on order).
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    ///
    /// use grid_route_layer::grid::{ClusterId, SiteName};
    /// use grid_route_layer::index::{IndexSettings, PrefixIndex};
    ///
    /// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    /// let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    /// let (old, evicted, fresh) = ([1, 2], [3, 4], [5, 6]);
    /// let now = Instant::now();
    /// index.confirm(&east, &old, now);
    /// index.confirm(&east, &evicted, now + Duration::from_secs(5));
    /// index.confirm(&east, &fresh, now + Duration::from_secs(10));
    /// let later = now + Duration::from_secs(20);
    ///
    /// // The engine reports the prompt behind `evicted` gone: what came before goes too.
    /// let mark = index.confirmation(&east, evicted[1], later).unwrap();
    /// assert_eq!(index.forget_older(&east, mark), 2);
    /// assert_eq!(index.depth(&east, &old, later), 0);
    /// assert_eq!(index.depth(&east, &evicted, later), 2);
    /// assert_eq!(index.depth(&east, &fresh, later), 2);
    /// ```
    pub fn forget_older(&self, cluster: &ClusterId, than: Confirmation) -> usize {
        let Some(lru) = self.state.load().clusters.get(cluster).cloned() else {
            return 0;
        };
        let keys = lru.forget_older(than.0);
        if !keys.is_empty() {
            self.tell(&IndexEvent::Dropped {
                cluster,
                keys: &keys,
            });
        }
        keys.len()
    }

    fn tell(&self, event: &IndexEvent<'_>) {
        if let Some(observer) = &self.observer {
            observer.observe(event);
        }
    }

    /// Applies a peer replica's change at `now`, without telling the observer (so it is
    /// never sent back out). Returns whether it changed anything: an event for a cluster
    /// this index does not know, or a confirmation whose lifetime is over, is ignored.
    ///
    /// A confirmation counts for its `lifetime`, but never longer than this index's own
    /// TTL, so a peer with a longer `ttl_secs` cannot make entries outlive local ones.
    /// Keys are written tail first, like a local confirmation.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    ///
    /// use grid_route_layer::grid::{ClusterId, SiteName};
    /// use grid_route_layer::index::{IndexEvent, IndexSettings, PrefixIndex};
    ///
    /// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    /// let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    /// let keys = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];
    /// let now = Instant::now();
    /// // A peer's confirmation made 100 s ago, with 500 s left to count.
    /// let event = IndexEvent::Confirmed { cluster: &east, keys: &keys, lifetime: Duration::from_secs(500) };
    /// assert!(index.apply(&event, now));
    /// assert_eq!(index.depth(&east, &keys, now), 2);
    /// assert_eq!(index.depth(&east, &keys, now + Duration::from_secs(501)), 0);
    /// ```
    pub fn apply(&self, event: &IndexEvent<'_>, now: Instant) -> bool {
        let state = self.state.load();
        let Some(lru) = state.clusters.get(event.cluster()) else {
            return false;
        };
        match *event {
            IndexEvent::Confirmed { keys, lifetime, .. } => {
                let lifetime = lifetime.min(state.settings.ttl());
                if lifetime == Duration::ZERO {
                    return false;
                }
                lru.confirm(
                    keys,
                    self.clock.deadline(now, lifetime),
                    self.clock.now(now),
                );
            }
            IndexEvent::SessionConfirmed {
                key,
                held_bytes,
                lifetime,
                ..
            } => {
                let lifetime = lifetime.min(state.settings.ttl());
                if lifetime == Duration::ZERO {
                    return false;
                }
                lru.confirm_session(
                    key,
                    held_blocks(held_bytes),
                    self.clock.deadline(now, lifetime),
                    self.clock.now(now),
                );
            }
            IndexEvent::Dropped { keys, .. } => lru.drop_keys(keys),
        }
        true
    }

    /// How many of the request's `keys` `cluster` holds as a prefix at `now`: the largest
    /// `d` such that key `d - 1` is held and unexpired (keys chain, so holding key `i`
    /// means the cluster was sent blocks `0..=i`). 0 for an unknown cluster.
    ///
    /// Found by binary search rather than by probing every key, in at most about
    /// `log2(keys.len()) + 2` lookups: a miss costs one, a whole match two. This relies on
    /// the held keys of a chain being a prefix, which the index maintains as far as it
    /// can: confirmations write tails first, heads are refreshed by every prompt sharing
    /// them and so are evicted and expire last. When a key in the middle is missing anyway
    /// (dropped after another request's failure, or evicted while its tail was refreshed),
    /// the answer is still a depth whose last key is held — never more than the true
    /// depth — but it may be a shorter one. A missing first key always reads as 0.
    pub fn depth(&self, cluster: &ClusterId, keys: &[u64], now: Instant) -> usize {
        let now = self.clock.now(now);
        self.state
            .load()
            .clusters
            .get(cluster)
            .map_or(0, |lru| lru.depth(keys, now))
    }

    /// [`depth`](Self::depth) for each of `clusters`, in their order, reading the cluster
    /// map once.
    pub fn depths<'a>(
        &self,
        clusters: impl IntoIterator<Item = &'a ClusterId>,
        keys: &[u64],
        now: Instant,
    ) -> Vec<usize> {
        let now = self.clock.now(now);
        let state = self.state.load();
        clusters
            .into_iter()
            .map(|cluster| {
                state
                    .clusters
                    .get(cluster)
                    .map_or(0, |lru| lru.depth(keys, now))
            })
            .collect()
    }

    /// Applies new settings and a new cluster list.
    ///
    /// Clusters that stay keep their entries, resized to the new capacity (shrinking
    /// evicts the least recent); clusters new to the list start empty with the new
    /// capacity; clusters not in the list are dropped with their entries. A new TTL
    /// applies to later confirmations only: existing deadlines stay.
    pub fn reconfigure(
        &self,
        settings: IndexSettings,
        clusters: impl IntoIterator<Item = ClusterId>,
    ) {
        let _reconfiguring = self
            .reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.state.load_full();
        let capacity = settings.capacity_nonzero();
        let clusters = clusters
            .into_iter()
            .map(|cluster| {
                let lru = match old.clusters.get(&cluster) {
                    Some(lru) => {
                        lru.resize(capacity);
                        Arc::clone(lru)
                    }
                    None => Arc::new(ClusterLru::new(capacity)),
                };
                (cluster, lru)
            })
            .collect();
        // A confirmation that loaded the old state may still write into a dropped
        // cluster's LRU; it is freed when that confirmation lets go of it.
        self.state.store(Arc::new(State { settings, clusters }));
    }

    /// Entries stored for `cluster` (0 for an unknown cluster), for the gauge
    /// `grid_route_index_entries{site,cluster}`. Expired entries count until they are swept,
    /// which confirmations do lazily from the cold end, or evicted.
    pub fn entries(&self, cluster: &ClusterId) -> usize {
        self.state
            .load()
            .clusters
            .get(cluster)
            .map_or(0, |lru| lru.len())
    }

    /// Entries live at `now` for `cluster` (0 for an unknown cluster): first removes the
    /// expired ones at the cold end, as a confirmation does (at most 1,024 a call, so one
    /// call after a long idle spell stays short; the rest go at the next). What placement
    /// reads as a cluster's room: a cluster that served much long ago and nothing since
    /// would otherwise look full until its next confirmation.
    pub fn live_entries(&self, cluster: &ClusterId, now: Instant) -> usize {
        self.state
            .load()
            .clusters
            .get(cluster)
            .map_or(0, |lru| lru.live_len(self.clock.now(now)))
    }

    /// Whether the index keeps an LRU for `cluster`: it was configured and no
    /// [`reconfigure`](Self::reconfigure) has removed it since.
    pub fn knows(&self, cluster: &ClusterId) -> bool {
        self.state.load().clusters.contains_key(cluster)
    }

    /// The clusters the index keeps an LRU for, in no particular order.
    pub fn clusters(&self) -> Vec<ClusterId> {
        self.state.load().clusters.keys().cloned().collect()
    }
}

impl fmt::Debug for PrefixIndex {
    // Counts only: keys stand for prompt text and never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.load();
        f.debug_struct("PrefixIndex")
            .field("settings", &state.settings)
            .field("clusters", &state.clusters)
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}
