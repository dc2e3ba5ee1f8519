//! Whether a cluster's engines still hold a head other conversations share (a system
//! prompt) when a new conversation comes to them for it, learned from their answers.
//!
//! An engine with a few slots (llama.cpp's `--parallel N`) holds one prompt's cache a
//! slot. A head that only idle slots hold goes with the next conversation that takes one,
//! unless the engine saves the prompts it pushes out and restores them (llama.cpp's
//! `--cache-ram`, a host prompt cache). Nothing an engine serves says which it has:
//! llama.cpp's `/props`, `/slots` and `/metrics` are the same with a host cache and
//! without. Its answers do. A conversation's first turn that sticks to a holder of a
//! short shared head (under [`STICKY_MATCH_BYTES`](super::STICKY_MATCH_BYTES)) no busier
//! than the other candidates asks the holder for a head that the conversations it ran
//! since may have pushed out of every slot; its cached tokens say whether the head was
//! still there. In three arena sittings each way (25a4b73's, in `git show
//! 6c45727:BENCHMARKS.md`) such first turns found their head in 2 of 21 on engines
//! without a host cache, and in 16 of 21 on engines with one.
//!
//! Where heads are kept, a new conversation may join a busier holder of its head when
//! that holder has a free slot ([`Affinity::decide`](super::Affinity::decide)): the head
//! is found there. A live conversation whose idle slot it takes keeps its prompt in the
//! host cache if it does not share the head, and loses its history past the head if it
//! does (docs/architecture.md, step 3). Where heads are not kept, either kind would lose
//! its prompt, and the newcomer goes by load as before.
//!
//! Only first turns sent under the rule that does not crowd (their holder no busier)
//! teach the tally: a first turn that joined a busier holder finds its head by taking a
//! live conversation's idle slot, with a host cache or without, and would teach that every
//! engine keeps heads.
//!
//! The verdict also says whether a newcomer passes over a slot that just went idle (the
//! [module](super)'s rule, step 2): an engine that keeps shared heads keeps, in the same
//! host cache, a live conversation's prompt that a newcomer pushes out of its slot, and
//! one that does not loses it. Until answers say the heads are kept, the slot is passed
//! over: the first such answers come a minute into the arena's runs, after the first
//! slots were lost.
//!
//! A decaying pair of counts per cluster is a few lines; no maintained crate offers one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::grid::ClusterId;

/// How much the earlier answers weigh once another is counted: the tally remembers about
/// the last eight first turns (1 / (1 - 0.875)), so an engine restarted without its host
/// cache is found out within a few conversations.
pub const SHARED_HEAD_MEMORY: f64 = 0.875;

/// First turns a cluster's own tally needs before its verdict is its own; until then it
/// is every cluster's tally together. Engines of one fleet are most often started alike,
/// and a cluster sees few such first turns: about two a run in the arena's 20
/// conversations, across three clusters.
pub const OWN_SHARED_HEAD_ANSWERS: u32 = 2;

/// Found and missed heads, each count decaying by [`SHARED_HEAD_MEMORY`] at every answer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    found: f64,
    missed: f64,
    answers: u32,
}

impl Tally {
    fn count(&mut self, found: bool) {
        self.found *= SHARED_HEAD_MEMORY;
        self.missed *= SHARED_HEAD_MEMORY;
        if found {
            self.found += 1.0;
        } else {
            self.missed += 1.0;
        }
        self.answers = self.answers.saturating_add(1);
    }

    /// More found than missed, weighed by recency; nothing counted is not kept.
    fn kept(self) -> bool {
        self.found > self.missed
    }
}

/// Per cluster, whether its engines still held a shared head when a new conversation
/// came to them for it ([module](self)).
#[derive(Debug, Default)]
pub(crate) struct SharedHeads {
    by_cluster: Mutex<HashMap<ClusterId, Tally>>,
}

/// What one answer changed ([`Affinity::count_shared_head`](super::Affinity::count_shared_head)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadVerdict {
    /// Whether the answer counted found its head.
    pub found: bool,
    /// The share of the cluster's own counted first turns that found their head, weighed
    /// by recency.
    pub found_share: f64,
    /// Whether the cluster keeps shared heads after the answer.
    pub kept: bool,
    /// The verdict before the answer.
    pub kept_before: bool,
}

impl SharedHeads {
    fn lock(&self) -> MutexGuard<'_, HashMap<ClusterId, Tally>> {
        // A panic elsewhere while it was held leaves a map of plain numbers: still sound.
        self.by_cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one first turn at `cluster` that found its head (`found`) or not.
    pub(crate) fn count(&self, cluster: &ClusterId, found: bool) -> HeadVerdict {
        let mut by_cluster = self.lock();
        let kept_before = verdict(&by_cluster, cluster);
        let tally = by_cluster.entry(cluster.clone()).or_default();
        tally.count(found);
        let found_share = tally.found / (tally.found + tally.missed);
        HeadVerdict {
            found,
            found_share,
            kept: verdict(&by_cluster, cluster),
            kept_before,
        }
    }

    /// Whether `cluster`'s engines keep shared heads: its own tally once it counts
    /// [`OWN_SHARED_HEAD_ANSWERS`], every cluster's together until then.
    pub(crate) fn kept(&self, cluster: &ClusterId) -> bool {
        verdict(&self.lock(), cluster)
    }

    /// Keeps only the clusters `keep` accepts (a reload removed the others).
    pub(crate) fn retain(&self, keep: impl Fn(&ClusterId) -> bool) {
        self.lock().retain(|cluster, _| keep(cluster));
    }
}

fn verdict(by_cluster: &HashMap<ClusterId, Tally>, cluster: &ClusterId) -> bool {
    match by_cluster.get(cluster) {
        Some(own) if own.answers >= OWN_SHARED_HEAD_ANSWERS => own.kept(),
        _ => by_cluster
            .values()
            .fold(Tally::default(), |all, t| Tally {
                found: all.found + t.found,
                missed: all.missed + t.missed,
                answers: all.answers.saturating_add(t.answers),
            })
            .kept(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::SiteName;

    fn id(name: &str) -> ClusterId {
        ClusterId::new(SiteName::new(name).unwrap(), &format!("{name}-a"))
    }

    #[test]
    fn nothing_counted_keeps_nothing() {
        assert!(!SharedHeads::default().kept(&id("east")));
    }

    #[test]
    fn a_cluster_with_few_answers_goes_by_every_clusters_tally_then_by_its_own() {
        let heads = SharedHeads::default();
        let (east, west) = (id("east"), id("west"));
        let first = heads.count(&east, true);
        assert_eq!((first.kept_before, first.kept), (false, true));
        // West has counted nothing: it goes by east's find.
        assert!(heads.kept(&west));
        // One miss at west: together one found, one missed (decayed alike), not kept.
        assert!(!heads.count(&west, false).kept);
        assert!(!heads.kept(&east));
        // East's second find makes its verdict its own.
        let second = heads.count(&east, true);
        assert_eq!((second.kept_before, second.kept), (false, true));
        assert!(
            (second.found_share - 1.0).abs() < 1e-12,
            "no miss counted at east"
        );
        // West counts one answer: still every cluster's tally, east's two finds against
        // its one miss.
        assert!(heads.kept(&west));
        assert!(!heads.count(&west, false).kept, "west's own two misses");
        assert!(heads.kept(&east));
    }

    #[test]
    fn recent_answers_outweigh_old_ones() {
        let heads = SharedHeads::default();
        let east = id("east");
        for _ in 0..3 {
            heads.count(&east, true);
        }
        // Three finds (2.64 decayed), then misses: the engine lost its host cache. The
        // third miss turns it (finds 1.77, misses 2.64); undecayed it would take four.
        assert!(heads.count(&east, false).kept);
        assert!(heads.count(&east, false).kept);
        let third = heads.count(&east, false);
        assert!(!third.kept && third.kept_before);
    }

    #[test]
    fn removed_clusters_are_forgotten() {
        let heads = SharedHeads::default();
        let east = id("east");
        heads.count(&east, true);
        heads.retain(|_| false);
        assert!(!heads.kept(&east));
    }
}
