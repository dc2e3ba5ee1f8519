//! One cluster's LRU of confirmed keys.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use lru::LruCache;

use super::clock::{DeadlineClock, Secs};
use super::hasher::PassThroughState;

/// Expired entries a confirmation removes from the cold end before writing, at most.
///
/// A confirmation writes at most 512 keys, so sweeping up to twice that keeps removal ahead
/// of insertion while bounding the time one writer holds the lock after an idle spell.
const EXPIRED_SWEEP_PER_CONFIRM: usize = 1024;

type Entries = LruCache<u64, Entry, PassThroughState>;

/// One confirmed key: when it stops counting, and for a session key how many blocks of
/// prompt its last confirmed request held (0 for a prefix key). Eight bytes, so an LRU
/// node is no larger than it was with the deadline alone (the key and two links pad it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    deadline: Secs,
    held_blocks: u32,
}

impl Entry {
    fn prefix(deadline: Secs) -> Self {
        Self {
            deadline,
            held_blocks: 0,
        }
    }
}

/// The keys one cluster was confirmed for, each with its deadline, least recent first out.
///
/// Behind a `RwLock`: reads use `peek`, which does not touch recency, so any number of
/// readers share the lock; only confirmations, drops and resizes take it for writing.
pub(crate) struct ClusterLru {
    entries: RwLock<Entries>,
}

impl ClusterLru {
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        // Start empty and grow with use (the map doubles as it fills) rather than reserve
        // `capacity` slots up front: an idle or new cluster costs nothing, and a huge
        // configured capacity cannot fail an allocation at reload time.
        let mut entries = LruCache::unbounded_with_hasher(PassThroughState::default());
        entries.resize(capacity);
        Self {
            entries: RwLock::new(entries),
        }
    }

    // A panic while the lock was held cannot leave the LRU half-updated in a way that
    // matters here (every operation is a whole put/pop), so a poisoned lock is recovered
    // rather than turned into a panic on every later request.
    fn read(&self) -> RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Entries> {
        self.entries.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `keys` tail first, all with `deadline`.
    pub(crate) fn confirm(&self, keys: &[u64], deadline: Secs, now: Secs) {
        let mut entries = self.write();
        sweep_expired(&mut entries, now);
        // Written tail first, the head ends up most recent. Only the first `cap` keys can
        // survive their own confirmation, so the rest are not written just to be evicted
        // (the end state is the same: the head fills the whole LRU).
        let kept = keys.len().min(entries.cap().get());
        for &key in keys[..kept].iter().rev() {
            entries.put(key, Entry::prefix(deadline));
        }
    }

    /// Writes a session key, most recent, holding `held_blocks` of prompt until `deadline`.
    pub(crate) fn confirm_session(&self, key: u64, held_blocks: u32, deadline: Secs, now: Secs) {
        let mut entries = self.write();
        sweep_expired(&mut entries, now);
        entries.put(
            key,
            Entry {
                deadline,
                held_blocks,
            },
        );
    }

    /// A live session key's deadline and held blocks.
    pub(crate) fn session(&self, key: u64, now: Secs) -> Option<(Secs, u32)> {
        self.read()
            .peek(&key)
            .filter(|entry| DeadlineClock::is_live(now, entry.deadline))
            .map(|entry| (entry.deadline, entry.held_blocks))
    }

    /// Removes `keys`, wherever they are.
    pub(crate) fn drop_keys(&self, keys: &[u64]) {
        let mut entries = self.write();
        for key in keys {
            entries.pop(key);
        }
    }

    /// The deadline of `key`, when it is held and still counts at `now`.
    pub(crate) fn deadline_of(&self, key: u64, now: Secs) -> Option<Secs> {
        self.read()
            .peek(&key)
            .map(|entry| entry.deadline)
            .filter(|&deadline| DeadlineClock::is_live(now, deadline))
    }

    /// Removes entries from the cold end while their deadline is before `deadline`, and
    /// returns their keys.
    ///
    /// Confirmations write at the warm end with the deadline of their moment, so the cold
    /// end holds the earliest deadlines and this stops at the first entry confirmed since.
    /// When the order is broken (a TTL changed, a peer's confirmation applied with its own
    /// lifetime), it stops early: it may forget less than asked, never an entry confirmed
    /// after `deadline`.
    pub(crate) fn forget_older(&self, deadline: Secs) -> Vec<u64> {
        let mut entries = self.write();
        let mut forgotten = Vec::new();
        while let Some((&key, entry)) = entries.peek_lru() {
            if entry.deadline >= deadline {
                break;
            }
            entries.pop_lru();
            forgotten.push(key);
        }
        forgotten
    }

    /// How many of `keys` this cluster holds as a prefix (see [`PrefixIndex::depth`]).
    ///
    /// [`PrefixIndex::depth`]: super::PrefixIndex::depth
    pub(crate) fn depth(&self, keys: &[u64], now: Secs) -> usize {
        let entries = self.read();
        if keys.is_empty() || entries.is_empty() {
            return 0;
        }
        let held = |i: usize| {
            entries
                .peek(&keys[i])
                .is_some_and(|entry| DeadlineClock::is_live(now, entry.deadline))
        };
        // The two common answers first: most clusters hold none of a prompt (one probe),
        // and a repeated prompt is held whole (two probes).
        if !held(0) {
            return 0;
        }
        let last = keys.len() - 1;
        if held(last) {
            return keys.len();
        }
        // Invariant: key `lo - 1` is held, key `hi` is not; the answer is in [lo, hi].
        // Tails are written first and heads are refreshed by every prompt that shares
        // them, so the held keys of a chain are normally a prefix and this finds its end in
        // log2(len) probes. When they are not (a middle key dropped or evicted) it still
        // returns a depth whose last key is held, so it never overstates, but it may stop
        // at an earlier boundary than the deepest held key.
        let (mut lo, mut hi) = (1, last);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if held(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Sets the capacity; shrinking evicts the least recent entries.
    pub(crate) fn resize(&self, capacity: NonZeroUsize) {
        self.write().resize(capacity);
    }

    /// Entries stored, including expired ones not yet swept.
    pub(crate) fn len(&self) -> usize {
        self.read().len()
    }

    /// Entries stored after sweeping expired ones from the cold end (bounded, as a
    /// confirmation sweeps); the write lock only when the coldest entry has expired.
    pub(crate) fn live_len(&self, now: Secs) -> usize {
        {
            let entries = self.read();
            let coldest_live = entries
                .peek_lru()
                .is_none_or(|(_, entry)| DeadlineClock::is_live(now, entry.deadline));
            if coldest_live {
                return entries.len();
            }
        }
        let mut entries = self.write();
        sweep_expired(&mut entries, now);
        entries.len()
    }
}

/// Removes expired entries from the cold end, a bounded number at a time.
///
/// Entries are not in deadline order when the TTL changed between confirmations, so this
/// stops at the first live entry; anything expired behind it is skipped by reads and goes
/// when evicted.
fn sweep_expired(entries: &mut Entries, now: Secs) {
    for _ in 0..EXPIRED_SWEEP_PER_CONFIRM {
        match entries.peek_lru() {
            Some((_, entry)) if !DeadlineClock::is_live(now, entry.deadline) => {
                entries.pop_lru();
            }
            _ => break,
        }
    }
}

impl fmt::Debug for ClusterLru {
    // Counts only: keys stand for prompt text and never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.read();
        f.debug_struct("ClusterLru")
            .field("entries", &entries.len())
            .field("capacity", &entries.cap())
            .finish()
    }
}
