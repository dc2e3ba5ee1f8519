//! How much new prompt each cluster was recently given, for placing requests that match
//! nothing on engines with slots behind a shared index.
//!
//! An engine started with a few slots (llama.cpp's `--parallel N`) keeps one prompt's cache
//! per slot, plus what its host cache saves. A new conversation sent there takes a slot and
//! pushes the least recently used prompt out; the conversations already there lose their
//! cache one new conversation at a time. Between its turns a conversation weighs on no
//! cluster's load, so load cannot tell a cluster whose cache is full of live conversations
//! from one with room. The index can: the fewest entries stand for the most room, as the
//! smallest radix tree does in SGLang's and vLLM's cache-aware routers, and the index's
//! entries grow with every turn confirmed there, expire after its TTL and shrink when an
//! engine's answer shows it evicted them (engine feedback). That is what a replica with
//! an index of its own reads.
//!
//! Behind a shared index every replica reads the same entries, and they move only as fast
//! as answers confirm them: replicas would all send their new conversations to the same
//! cluster between two confirmations. There each replica reads what it sent lately
//! instead: the bytes of each
//! prompt beyond what the index says the cluster already held, summed per cluster and
//! halved every [`PLACED_HALF_LIFE`], so that old placements, long since evicted or
//! ended, stop counting. A cluster given little has little to lose, and each replica's
//! sums are its own, so replicas pick different clusters.
//!
//! Only requests that matched nothing are counted, when they are placed (whether or not
//! the engine answers): a sticky request adds little to what its cluster already held.
//! The sums are kept whether or not the index is shared, so a reload that starts sharing
//! finds them. The half life is the contract's index TTL; a configured `ttl_secs` does
//! not change it.
//!
//! A decaying sum per cluster is a few lines; no maintained crate offers one that reads
//! without a timer task.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::grid::ClusterId;

/// How long it takes a placement's bytes to count half: the index's TTL by the contract
/// (600 s), the time the gateway remembers a prompt anywhere.
pub const PLACED_HALF_LIFE: Duration = Duration::from_secs(600);

/// One cluster's decaying sum: `bytes` as it stood at `at`.
#[derive(Debug, Clone, Copy)]
struct Decaying {
    bytes: f64,
    at: Instant,
}

impl Decaying {
    /// The sum at `now` (never grown by time; a `now` before `at` reads it as is).
    fn at(self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.bytes * 0.5_f64.powf(elapsed / PLACED_HALF_LIFE.as_secs_f64())
    }
}

/// The bytes of new prompt this replica sent each cluster in requests that matched nothing,
/// decaying by half every [`PLACED_HALF_LIFE`].
#[derive(Debug, Default)]
pub(crate) struct RecentPlacements {
    by_cluster: Mutex<HashMap<ClusterId, Decaying>>,
}

impl RecentPlacements {
    /// The sums as they stand at `now`, locked: a request reads them and records its own
    /// placement under one lock, so two placed at once do not both read the same sums.
    pub(crate) fn at(&self, now: Instant) -> PlacementsAt<'_> {
        // A panic elsewhere while it was held leaves a map of plain numbers: still sound.
        let by_cluster = self
            .by_cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        PlacementsAt { by_cluster, now }
    }

    /// Keeps only the clusters `keep` accepts (a reload removed the others).
    pub(crate) fn retain(&self, keep: impl Fn(&ClusterId) -> bool) {
        self.at(Instant::now())
            .by_cluster
            .retain(|cluster, _| keep(cluster));
    }
}

/// [`RecentPlacements`] locked at one instant.
pub(crate) struct PlacementsAt<'a> {
    by_cluster: MutexGuard<'a, HashMap<ClusterId, Decaying>>,
    now: Instant,
}

impl PlacementsAt<'_> {
    /// `cluster`'s recent placements, bytes; 0 for one never given any.
    pub(crate) fn bytes(&self, cluster: &ClusterId) -> f64 {
        self.by_cluster.get(cluster).map_or(0.0, |d| d.at(self.now))
    }

    /// Records that `cluster` was given `bytes` of new prompt.
    pub(crate) fn add(&mut self, cluster: &ClusterId, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let now = self.now;
        let sum = self.by_cluster.entry(cluster.clone()).or_insert(Decaying {
            bytes: 0.0,
            at: now,
        });
        // A `now` earlier than the last one (two requests racing) keeps the later time.
        let at = sum.at.max(now);
        *sum = Decaying {
            bytes: sum.at(at) + bytes as f64,
            at,
        };
    }
}

#[cfg(test)]
// Sums of whole bytes at zero elapsed time are exact.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;
    use crate::grid::SiteName;

    fn cluster(site: &str) -> ClusterId {
        ClusterId::new(SiteName::new(site).unwrap(), &format!("{site}-a"))
    }

    #[test]
    fn placements_add_up_and_halve_every_half_life() {
        let placed = RecentPlacements::default();
        let (east, west) = (cluster("east"), cluster("west"));
        let start = Instant::now();
        assert_eq!(placed.at(start).bytes(&east), 0.0);
        placed.at(start).add(&east, 4_000);
        placed.at(start).add(&east, 4_000);
        assert_eq!(placed.at(start).bytes(&east), 8_000.0);
        assert_eq!(placed.at(start).bytes(&west), 0.0);
        let later = start + PLACED_HALF_LIFE;
        assert!((placed.at(later).bytes(&east) - 4_000.0).abs() < 1e-6);
        // Added later, on top of what is left.
        placed.at(later).add(&east, 1_000);
        let two_later = later + PLACED_HALF_LIFE;
        assert!((placed.at(two_later).bytes(&east) - 2_500.0).abs() < 1e-6);
        // A reading from before the last addition does not grow it.
        assert!((placed.at(start).bytes(&east) - 5_000.0).abs() < 1e-6);
        placed.at(start).add(&west, 1_000);
        placed.retain(|cluster| cluster != &east);
        assert_eq!(placed.at(two_later).bytes(&east), 0.0);
        assert_eq!(placed.at(start).bytes(&west), 1_000.0);
    }

    #[test]
    fn an_addition_from_before_the_last_one_keeps_the_later_time() {
        let placed = RecentPlacements::default();
        let east = cluster("east");
        let start = Instant::now();
        let later = start + PLACED_HALF_LIFE;
        placed.at(later).add(&east, 2_000);
        placed.at(start).add(&east, 2_000);
        assert!((placed.at(later).bytes(&east) - 4_000.0).abs() < 1e-6);
    }
}
