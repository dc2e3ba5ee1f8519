//! Benchmarks of the prefix index: the reads an affinity decision makes and the writes a
//! 2xx answer makes.
//!
//! `index/depth_512x8` reads the depth of a 512-key prompt at 8 full clusters that hold
//! it to depths 0, 16, 64, 200, 300, 400, 511 and 512 (the budget for a whole affinity
//! decision is well under 5 µs). `index/confirm_512` writes a new 512-key prompt into a
//! full cluster, evicting as many keys; `index/confirm_512_refresh` confirms a prompt the
//! cluster already holds.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use grid_route_layer::grid::{ClusterId, SiteName};
use grid_route_layer::index::{IndexSettings, PrefixIndex};

const PROMPT_KEYS: usize = 512;
const DEPTHS: [usize; 8] = [0, 16, 64, 200, 300, 400, 511, 512];

fn prompt(seed: u64) -> Vec<u64> {
    grid_route_benches::synthetic_keys(seed, PROMPT_KEYS)
}

fn clusters(n: usize) -> Vec<ClusterId> {
    let site = SiteName::new("east").expect("a valid site name");
    (0..n)
        .map(|i| ClusterId::new(site.clone(), &format!("east-{i}")))
        .collect()
}

/// Fills `cluster` to its capacity with unrelated prompts, so lookups see a full table.
fn fill(index: &PrefixIndex, cluster: &ClusterId, seed: u64, now: Instant) {
    let prompts = IndexSettings::DEFAULT_CAPACITY / PROMPT_KEYS;
    for i in 0..prompts as u64 {
        index.confirm(cluster, &prompt(seed * 1_000 + i), now);
    }
}

fn depth_512x8(c: &mut Criterion) {
    let clusters = clusters(DEPTHS.len());
    let index = PrefixIndex::new(IndexSettings::default(), clusters.clone());
    let now = Instant::now();
    let request = prompt(0);
    for (i, (cluster, depth)) in clusters.iter().zip(DEPTHS).enumerate() {
        fill(&index, cluster, i as u64 + 1, now);
        index.confirm(cluster, &request[..depth], now);
    }
    assert_eq!(index.depths(&clusters, &request, now), DEPTHS);
    c.bench_function("index/depth_512x8", |b| {
        b.iter(|| index.depths(black_box(&clusters), black_box(&request), now));
    });
}

fn confirm_512(c: &mut Criterion) {
    let clusters = clusters(1);
    let cluster = &clusters[0];
    let index = PrefixIndex::new(IndexSettings::default(), clusters.clone());
    let now = Instant::now();
    fill(&index, cluster, 1, now);
    // Twice as many prompts as the cluster holds: each one is gone when its turn comes
    // again, so every confirmation inserts 512 keys and evicts 512.
    let ring: Vec<_> = (0..2 * IndexSettings::DEFAULT_CAPACITY / PROMPT_KEYS)
        .map(|i| prompt(1_000_000 + i as u64))
        .collect();
    let mut next = ring.iter().cycle();
    c.bench_function("index/confirm_512", |b| {
        b.iter(|| {
            let keys = next
                .next()
                .expect("a cycle over a non-empty ring never ends");
            index.confirm(cluster, black_box(keys), now);
        });
    });
    assert_eq!(index.entries(cluster), IndexSettings::DEFAULT_CAPACITY);

    let held = prompt(0);
    index.confirm(cluster, &held, now);
    c.bench_function("index/confirm_512_refresh", |b| {
        b.iter(|| index.confirm(cluster, black_box(&held), now));
    });
}

criterion_group!(benches, depth_512x8, confirm_512);
criterion_main!(benches);
