use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{IndexSettings, IndexSettingsError, PrefixIndex};
use crate::grid::{ClusterId, SiteName};

fn cluster(site: &str, name: &str) -> ClusterId {
    ClusterId::new(SiteName::new(site).unwrap(), name)
}

fn settings(capacity: usize, ttl_secs: u64) -> IndexSettings {
    IndexSettings::new(capacity, Duration::from_secs(ttl_secs)).unwrap()
}

/// The keys of a prompt of `len` blocks: uniformly spread, like the keyed SipHash output
/// the index gets; different seeds give unrelated prompts.
fn chain(seed: u64, len: usize) -> Vec<u64> {
    let mut keys = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| keys.u64(..)).collect()
}

#[test]
fn a_confirmed_prompt_is_held_to_the_depth_confirmed() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    let prompt = chain(1, 512);
    let now = Instant::now();
    assert_eq!(index.depth(&east, &prompt, now), 0);

    index.confirm(&east, &prompt[..200], now);
    assert_eq!(index.depth(&east, &prompt, now), 200);
    assert_eq!(index.depth(&east, &prompt[..150], now), 150);
    assert_eq!(index.entries(&east), 200);

    index.confirm(&east, &prompt, now);
    assert_eq!(index.depth(&east, &prompt, now), 512);
    assert_eq!(index.entries(&east), 512);
    assert_eq!(index.depth(&east, &[], now), 0);
}

#[test]
fn live_entries_leave_out_what_expired_and_sweep_it() {
    let east = cluster("east", "east-a");
    let unknown = cluster("north", "north-a");
    let index = PrefixIndex::new(settings(16_384, 600), [east.clone()]);
    let start = Instant::now();
    index.confirm(&east, &chain(1, 100), start);
    let later = start + Duration::from_secs(300);
    index.confirm(&east, &chain(2, 30), later);
    assert_eq!(index.live_entries(&east, later), 130);
    // The first prompt expired; nothing was confirmed since, so it is still stored.
    let expired = start + Duration::from_secs(601);
    assert_eq!(index.entries(&east), 130);
    assert_eq!(index.live_entries(&east, expired), 30);
    assert_eq!(index.entries(&east), 30);
    // More expired than one call sweeps: the rest go at the next.
    index.confirm(&east, &chain(3, 2_000), expired);
    let all_expired = expired + Duration::from_secs(601);
    assert_eq!(index.live_entries(&east, all_expired), 2_030 - 1_024);
    assert_eq!(index.live_entries(&east, all_expired), 0);
    assert_eq!(index.live_entries(&unknown, all_expired), 0);
}

#[test]
fn a_prompt_with_another_head_has_no_depth() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    let now = Instant::now();
    index.confirm(&east, &chain(1, 64), now);
    assert_eq!(index.depth(&east, &chain(2, 64), now), 0);
}

#[test]
fn depth_counts_only_the_prefix_held_by_that_cluster() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let unknown = cluster("north", "north-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone(), west.clone()]);
    let prompt = chain(1, 100);
    let now = Instant::now();
    index.confirm(&east, &prompt[..80], now);
    index.confirm(&west, &prompt[..20], now);
    assert_eq!(index.depth(&east, &prompt, now), 80);
    assert_eq!(index.depth(&west, &prompt, now), 20);
    assert_eq!(index.depth(&unknown, &prompt, now), 0);
    assert_eq!(
        index.depths([&west, &unknown, &east], &prompt, now),
        [20, 0, 80]
    );
}

#[test]
fn one_clusters_traffic_cannot_evict_anothers_entries() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let index = PrefixIndex::new(settings(100, 600), [east.clone(), west.clone()]);
    let now = Instant::now();
    let quiet = chain(1, 100);
    index.confirm(&west, &quiet, now);
    for seed in 2..50 {
        index.confirm(&east, &chain(seed, 100), now);
    }
    assert_eq!(index.depth(&west, &quiet, now), 100);
    assert_eq!(index.entries(&east), 100);
}

#[test]
fn dropping_a_requests_keys_forgets_them_at_that_cluster_only() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone(), west.clone()]);
    let prompt = chain(1, 64);
    let now = Instant::now();
    index.confirm(&east, &prompt, now);
    index.confirm(&west, &prompt, now);

    index.drop_keys(&east, &prompt);
    assert_eq!(index.depth(&east, &prompt, now), 0);
    assert_eq!(index.entries(&east), 0);
    assert_eq!(index.depth(&west, &prompt, now), 64);
}

#[test]
fn dropping_a_shorter_prompt_forgets_the_shared_head() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    let prompt = chain(1, 64);
    let now = Instant::now();
    index.confirm(&east, &prompt, now);
    index.drop_keys(&east, &prompt[..10]);
    assert_eq!(index.depth(&east, &prompt, now), 0);
    assert_eq!(index.entries(&east), 54);
}

#[test]
fn expired_entries_do_not_count() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(16_384, 60), [east.clone()]);
    let prompt = chain(1, 32);
    let t0 = Instant::now();
    index.confirm(&east, &prompt, t0);
    assert_eq!(
        index.depth(&east, &prompt, t0 + Duration::from_secs(59)),
        32
    );
    assert_eq!(index.depth(&east, &prompt, t0 + Duration::from_secs(61)), 0);
}

#[test]
fn reconfirming_refreshes_the_deadline() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(16_384, 60), [east.clone()]);
    let prompt = chain(1, 32);
    let t0 = Instant::now();
    index.confirm(&east, &prompt, t0);
    index.confirm(&east, &prompt[..8], t0 + Duration::from_secs(50));
    // The head was refreshed; the tail kept its first deadline.
    assert_eq!(index.depth(&east, &prompt, t0 + Duration::from_secs(90)), 8);
    assert_eq!(
        index.depth(&east, &prompt, t0 + Duration::from_secs(111)),
        0
    );
}

#[test]
fn reconfirming_refreshes_recency() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(20, 600), [east.clone()]);
    let (a, b, c) = (chain(1, 10), chain(2, 10), chain(3, 10));
    let now = Instant::now();
    index.confirm(&east, &a, now);
    index.confirm(&east, &b, now);
    index.confirm(&east, &a, now);
    index.confirm(&east, &c, now);
    assert_eq!(index.depth(&east, &a, now), 10);
    assert_eq!(index.depth(&east, &b, now), 0);
    assert_eq!(index.depth(&east, &c, now), 10);
}

#[test]
fn confirmations_sweep_expired_entries() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(16_384, 60), [east.clone()]);
    let t0 = Instant::now();
    index.confirm(&east, &chain(1, 100), t0);
    index.confirm(&east, &chain(2, 5), t0 + Duration::from_secs(61));
    assert_eq!(index.entries(&east), 5);
}

#[test]
fn eviction_takes_tails_first() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(100, 600), [east.clone()]);
    let now = Instant::now();
    let prompt = chain(1, 512);
    index.confirm(&east, &prompt, now);
    assert_eq!(index.entries(&east), 100);
    assert_eq!(index.depth(&east, &prompt, now), 100);

    // A second prompt sharing the first 30 blocks pushes out the first one's tail, never
    // its head.
    let mut other = prompt[..30].to_vec();
    other.extend(chain(2, 40));
    index.confirm(&east, &other, now);
    assert_eq!(index.depth(&east, &other, now), 70);
    assert_eq!(index.depth(&east, &prompt, now), 60);
}

#[test]
fn a_middle_gap_never_overstates_the_depth() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    let now = Instant::now();
    let prompt = chain(1, 512);
    index.confirm(&east, &prompt, now);
    index.drop_keys(&east, &prompt[300..301]);
    // Key 511 is held: the cluster was sent the whole prompt.
    assert_eq!(index.depth(&east, &prompt, now), 512);
    index.drop_keys(&east, &prompt[511..]);
    let depth = index.depth(&east, &prompt, now);
    assert!(depth == 300 || depth == 511, "{depth}");
}

#[test]
fn a_resize_keeps_the_most_recent() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(100, 600), [east.clone()]);
    let now = Instant::now();
    let (old, recent) = (chain(1, 50), chain(2, 50));
    index.confirm(&east, &old, now);
    index.confirm(&east, &recent, now);

    index.reconfigure(settings(50, 600), [east.clone()]);
    assert_eq!(index.entries(&east), 50);
    assert_eq!(index.depth(&east, &recent, now), 50);
    assert_eq!(index.depth(&east, &old, now), 0);

    index.reconfigure(settings(30, 600), [east.clone()]);
    assert_eq!(index.depth(&east, &recent, now), 30);
    assert_eq!(index.settings().capacity(), 30);
}

#[test]
fn new_clusters_take_the_current_capacity() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let index = PrefixIndex::new(settings(1_000, 600), [east.clone()]);
    index.reconfigure(settings(10, 600), [east.clone(), west.clone()]);
    let now = Instant::now();
    let prompt = chain(1, 512);
    index.confirm(&west, &prompt, now);
    assert_eq!(index.entries(&west), 10);
    assert_eq!(index.depth(&west, &prompt, now), 10);
}

#[test]
fn removed_clusters_are_dropped() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone(), west.clone()]);
    let now = Instant::now();
    let prompt = chain(1, 64);
    index.confirm(&east, &prompt, now);
    index.confirm(&west, &prompt, now);

    index.reconfigure(IndexSettings::default(), [east.clone()]);
    assert_eq!(index.clusters(), std::slice::from_ref(&east));
    assert_eq!(index.depth(&west, &prompt, now), 0);
    assert_eq!(index.entries(&west), 0);
    assert_eq!(index.depth(&east, &prompt, now), 64);

    // A late answer from the removed cluster does not bring it back, and a cluster that
    // returns starts empty.
    index.confirm(&west, &prompt, now);
    assert_eq!(index.entries(&west), 0);
    index.reconfigure(IndexSettings::default(), [east.clone(), west.clone()]);
    assert_eq!(index.depth(&west, &prompt, now), 0);
}

#[test]
fn a_ttl_change_leaves_existing_deadlines() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(16_384, 600), [east.clone()]);
    let t0 = Instant::now();
    let (before, after) = (chain(1, 16), chain(2, 16));
    index.confirm(&east, &before, t0);

    index.reconfigure(settings(16_384, 60), [east.clone()]);
    index.confirm(&east, &after, t0);
    let later = t0 + Duration::from_secs(120);
    assert_eq!(index.depth(&east, &before, later), 16);
    assert_eq!(index.depth(&east, &after, later), 0);

    index.reconfigure(settings(16_384, 3_600), [east.clone()]);
    assert_eq!(
        index.depth(&east, &before, t0 + Duration::from_secs(601)),
        0
    );
}

#[test]
fn settings_errors_name_field_and_value() {
    let cases = [
        (
            IndexSettings::new(0, Duration::from_secs(600)),
            "prefix_affinity.capacity must be at least 1, got 0",
        ),
        (
            IndexSettings::new(16, Duration::ZERO),
            "prefix_affinity.ttl_secs must be at least 1, got 0",
        ),
        (
            IndexSettings::new(16, Duration::from_millis(500)),
            "prefix_affinity.ttl_secs must be at least 1, got 0.5",
        ),
        (
            IndexSettings::new(16, Duration::from_secs(u64::MAX)),
            "prefix_affinity.ttl_secs cannot be represented, got 18446744073709551615",
        ),
    ];
    for (result, message) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.to_string(), message);
        let _: &dyn std::error::Error = &err;
    }
    assert!(matches!(
        IndexSettings::new(0, Duration::from_secs(1)),
        Err(IndexSettingsError::CapacityTooSmall { capacity: 0 })
    ));
    let ok = IndexSettings::new(1, Duration::from_secs(1)).unwrap();
    assert_eq!((ok.capacity(), ok.ttl()), (1, Duration::from_secs(1)));
}

#[test]
fn default_settings_are_16384_entries_for_600_seconds() {
    let settings = IndexSettings::default();
    assert_eq!(settings.capacity(), 16_384);
    assert_eq!(settings.ttl(), Duration::from_secs(600));
}

#[test]
fn debug_prints_no_keys() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
    let key: u64 = 0x0123_4567_89ab_cdef;
    index.confirm(&east, &[key], Instant::now());
    let debug = format!("{index:?} {index:#?}");
    assert!(debug.contains("entries: 1"), "{debug}");
    for form in [
        format!("{key}"),
        format!("{key:x}"),
        format!("{key:X}"),
        format!("{key:016x}"),
        format!("{:?}", key.to_le_bytes()),
        format!("{:?}", key.to_be_bytes()),
    ] {
        assert!(!debug.contains(&form), "{form} in {debug}");
    }
}

#[test]
fn concurrent_confirms_drops_reads_and_reloads_leave_a_consistent_index() {
    let clusters: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| cluster("east", &format!("east-{name}")))
        .collect();
    let index = PrefixIndex::new(settings(2_048, 600), clusters.clone());
    let prompts: Vec<_> = (0..16).map(|seed| chain(seed, 512)).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for thread in 0..4_u64 {
            let (index, clusters, prompts, stop) = (&index, &clusters, &prompts, &stop);
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(thread);
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let at = &clusters[rng.usize(..clusters.len())];
                    let prompt = &prompts[rng.usize(..prompts.len())];
                    let keys = &prompt[..=rng.usize(..prompt.len())];
                    match rng.usize(..10) {
                        0..=3 => index.confirm(at, keys, now),
                        4 => index.drop_keys(at, keys),
                        5 if thread == 0 => {
                            let capacity = [64, 2_048][rng.usize(..2)];
                            let kept = 3 + rng.usize(..2);
                            index.reconfigure(
                                settings(capacity, 600),
                                clusters[..kept].iter().cloned(),
                            );
                        }
                        _ => {
                            for depth in index.depths(clusters, keys, now) {
                                assert!(depth <= keys.len());
                            }
                            assert!(index.entries(at) <= 2_048);
                        }
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(400));
        stop.store(true, Ordering::Relaxed);
    });

    // Whatever interleaving ran, each cluster's entry count must agree with the keys it
    // holds: dropping every key the threads could have confirmed leaves it empty, and a
    // fresh prompt then counts exactly its own keys.
    index.reconfigure(settings(2_048, 600), clusters.clone());
    let now = Instant::now();
    for at in &clusters {
        for prompt in &prompts {
            assert!(index.depth(at, prompt, now) <= index.entries(at));
            index.drop_keys(at, prompt);
            assert_eq!(index.depth(at, prompt, now), 0);
        }
        assert_eq!(index.entries(at), 0, "{at} kept entries no prompt holds");
    }
    for (seed, at) in (100..).zip(&clusters) {
        let fresh = chain(seed, 512);
        index.confirm(at, &fresh, now);
        assert_eq!(index.depth(at, &fresh, now), 512);
        assert_eq!(index.entries(at), 512);
    }
}

proptest! {
    #[test]
    fn depth_is_the_longest_confirmed_prefix(
        lengths in proptest::collection::vec(0..=64_usize, 1..20),
        probe in 0..=64_usize,
    ) {
        let east = cluster("east", "east-a");
        let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
        let prompt = chain(7, 64);
        let now = Instant::now();
        let mut longest = 0;
        for length in lengths {
            index.confirm(&east, &prompt[..length], now);
            longest = longest.max(length);
            prop_assert_eq!(index.depth(&east, &prompt, now), longest);
            prop_assert_eq!(index.depth(&east, &prompt[..probe], now), longest.min(probe));
        }
    }

    #[test]
    fn depth_never_overstates_when_keys_are_missing(
        dropped in proptest::collection::hash_set(0..128_usize, 0..20),
    ) {
        let east = cluster("east", "east-a");
        let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);
        let prompt = chain(7, 128);
        let now = Instant::now();
        index.confirm(&east, &prompt, now);
        for &i in &dropped {
            index.drop_keys(&east, &prompt[i..=i]);
        }
        let dropped: HashSet<usize> = dropped;
        let depth = index.depth(&east, &prompt, now);
        prop_assert!(depth <= prompt.len());
        if depth > 0 {
            prop_assert!(!dropped.contains(&(depth - 1)));
            prop_assert!(!dropped.contains(&0));
        }
        if dropped.is_empty() {
            prop_assert_eq!(depth, 128);
        }
    }
}

#[test]
fn an_index_started_at_a_given_base_expires_by_offsets_from_it() {
    let east = cluster("east", "east-a");
    let base = Instant::now();
    let index = PrefixIndex::starting_at(settings(64, 10), [east.clone()], base);
    let keys = chain(7, 4);
    // Confirmed 0.5 s in with a 10 s TTL: the deadline rounds up to 11 s from the base.
    index.confirm(&east, &keys, base + Duration::from_millis(500));
    assert_eq!(
        index.depth(&east, &keys, base + Duration::from_millis(10_999)),
        4
    );
    assert_eq!(index.depth(&east, &keys, base + Duration::from_secs(11)), 0);
}

/// What an observer was told, as (confirmed?, cluster, keys, lifetime).
type Told = Vec<(bool, ClusterId, Vec<u64>, Option<Duration>)>;

#[derive(Default)]
struct Recorder(std::sync::Mutex<Told>);

impl super::IndexObserver for Recorder {
    fn observe(&self, event: &super::IndexEvent<'_>) {
        let lifetime = match event {
            super::IndexEvent::Confirmed { lifetime, .. }
            | super::IndexEvent::SessionConfirmed { lifetime, .. } => Some(*lifetime),
            super::IndexEvent::Dropped { .. } => None,
        };
        self.0.lock().unwrap().push((
            lifetime.is_some(),
            event.cluster().clone(),
            event.keys().to_vec(),
            lifetime,
        ));
    }
}

#[test]
fn the_observer_is_told_of_local_confirmations_and_drops_with_the_ttl() {
    let east = cluster("east", "east-a");
    let gone = cluster("east", "east-gone");
    let recorder = std::sync::Arc::new(Recorder::default());
    let index = PrefixIndex::new(settings(64, 30), [east.clone()])
        .with_observer(std::sync::Arc::clone(&recorder) as _);
    let prompt = chain(3, 4);
    let now = Instant::now();
    index.confirm(&east, &prompt, now);
    index.drop_keys(&east, &prompt[..2]);
    // Changes to clusters the index does not hold change nothing and are not told.
    index.confirm(&gone, &prompt, now);
    index.drop_keys(&gone, &prompt);
    let told = recorder.0.lock().unwrap().clone();
    assert_eq!(
        told,
        [
            (
                true,
                east.clone(),
                prompt.clone(),
                Some(Duration::from_secs(30))
            ),
            (false, east, prompt[..2].to_vec(), None),
        ]
    );
}

#[test]
fn forgetting_older_entries_takes_what_came_before_the_mark_and_tells_the_observer() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let recorder = std::sync::Arc::new(Recorder::default());
    let base = Instant::now();
    let index = PrefixIndex::starting_at(settings(64, 600), [east.clone(), west.clone()], base)
        .with_observer(std::sync::Arc::clone(&recorder) as _);
    let (old, marked, newer) = (chain(1, 3), chain(2, 3), chain(3, 3));
    let at = |secs| base + Duration::from_secs(secs);
    index.confirm(&east, &old, at(1));
    index.confirm(&west, &old, at(1));
    index.confirm(&east, &marked, at(5));
    index.confirm(&east, &newer, at(9));
    let mark = index.confirmation(&east, marked[2], at(20)).unwrap();
    assert!(
        index.confirmation(&east, marked[2], at(606)).is_none(),
        "expired"
    );
    assert!(
        index.confirmation(&west, marked[2], at(20)).is_none(),
        "not held"
    );

    assert_eq!(index.forget_older(&east, mark), 3);
    assert_eq!(index.depths([&east, &west], &old, at(20)), [0, 3]);
    assert_eq!(
        index.depth(&east, &marked, at(20)),
        3,
        "the mark itself stays"
    );
    assert_eq!(index.depth(&east, &newer, at(20)), 3);
    // Old keys confirmed again later come after the mark: a second forget takes nothing.
    index.confirm(&east, &old, at(12));
    assert_eq!(index.forget_older(&east, mark), 0);
    let told = recorder.0.lock().unwrap().clone();
    let dropped: Vec<_> = told.iter().filter(|(confirmed, ..)| !confirmed).collect();
    assert_eq!(
        dropped.len(),
        1,
        "one event for the one forget that took anything"
    );
    assert_eq!(dropped[0].1, east);
    let mut keys = dropped[0].2.clone();
    keys.sort_unstable();
    let mut expected = old.clone();
    expected.sort_unstable();
    assert_eq!(keys, expected);
}

#[test]
fn a_peers_event_applies_without_being_told_back() {
    let east = cluster("east", "east-a");
    let recorder = std::sync::Arc::new(Recorder::default());
    let index = PrefixIndex::new(settings(64, 600), [east.clone()])
        .with_observer(std::sync::Arc::clone(&recorder) as _);
    let prompt = chain(4, 6);
    let now = Instant::now();
    let confirmed = super::IndexEvent::Confirmed {
        cluster: &east,
        keys: &prompt,
        lifetime: Duration::from_secs(20),
    };
    assert!(index.apply(&confirmed, now));
    assert_eq!(index.depth(&east, &prompt, now), 6);
    assert_eq!(
        index.depth(&east, &prompt, now + Duration::from_secs(21)),
        0
    );
    let dropped = super::IndexEvent::Dropped {
        cluster: &east,
        keys: &prompt[3..],
    };
    assert!(index.apply(&dropped, now));
    assert_eq!(index.depth(&east, &prompt, now), 3);
    assert!(recorder.0.lock().unwrap().is_empty());
}

#[test]
fn a_peers_event_for_an_unknown_cluster_or_past_its_lifetime_is_ignored() {
    let east = cluster("east", "east-a");
    let west = cluster("west", "west-a");
    let index = PrefixIndex::new(settings(64, 600), [east.clone()]);
    let prompt = chain(5, 3);
    let now = Instant::now();
    let unknown = super::IndexEvent::Confirmed {
        cluster: &west,
        keys: &prompt,
        lifetime: Duration::from_secs(60),
    };
    assert!(!index.apply(&unknown, now));
    assert_eq!(index.depth(&west, &prompt, now), 0);
    let spent = super::IndexEvent::Confirmed {
        cluster: &east,
        keys: &prompt,
        lifetime: Duration::ZERO,
    };
    assert!(!index.apply(&spent, now));
    assert_eq!(index.entries(&east), 0);
}

#[test]
fn a_peers_confirmation_never_outlives_the_local_ttl() {
    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(64, 10), [east.clone()]);
    let prompt = chain(6, 2);
    let now = Instant::now();
    let long = super::IndexEvent::Confirmed {
        cluster: &east,
        keys: &prompt,
        lifetime: Duration::from_secs(3_600),
    };
    assert!(index.apply(&long, now));
    assert_eq!(index.depth(&east, &prompt, now + Duration::from_secs(9)), 2);
    assert_eq!(
        index.depth(&east, &prompt, now + Duration::from_secs(11)),
        0
    );
}

#[test]
fn a_session_entry_lives_by_the_rules_of_the_keys_beside_it() {
    use crate::keying::SessionKey;

    let east = cluster("east", "east-a");
    let index = PrefixIndex::new(settings(8, 30), [east.clone()]);
    let session = SessionKey::from_digest(0x5e55_1011);
    let now = Instant::now();
    index.confirm(&east, &chain(1, 4), now);
    index.confirm_session(&east, session, 4 * 256, now);
    // One entry beside the prompt's four, holding the prompt's length in whole blocks.
    assert_eq!(index.entries(&east), 5);
    let held = index.session(&east, session, now).unwrap();
    assert_eq!(held.held_bytes(), 1024);
    // A later confirmation replaces the held length and is a later mark.
    let later = now + Duration::from_secs(2);
    index.confirm_session(&east, session, 10 * 256 + 100, later);
    let again = index.session(&east, session, later).unwrap();
    assert_eq!(again.held_bytes(), 10 * 256);
    assert!(again.confirmed() > held.confirmed());
    // The TTL: gone 30 s after its confirmation.
    assert!(
        index
            .session(&east, session, later + Duration::from_secs(31))
            .is_none()
    );
    // Engine feedback: forgetting what came before a later prompt forgets the session too.
    let fresh = chain(2, 2);
    let after = later + Duration::from_secs(3);
    index.confirm(&east, &fresh, after);
    let mark = index.confirmation(&east, fresh[1], after).unwrap();
    assert_eq!(index.forget_older(&east, mark), 5);
    assert!(index.session(&east, session, after).is_none());
    // Eviction: eight more keys push it out of an eight-entry LRU.
    index.confirm_session(&east, session, 256, after);
    index.confirm(&east, &chain(3, 8), after);
    assert!(index.session(&east, session, after).is_none());
    // A drop: the key, like any other.
    index.confirm_session(&east, session, 256, after);
    index.drop_keys(&east, &[session.as_u64()]);
    assert!(index.session(&east, session, after).is_none());
    // An unknown cluster holds no session and takes none.
    let gone = cluster("east", "east-gone");
    index.confirm_session(&gone, session, 256, after);
    assert!(index.session(&gone, session, after).is_none());
}
