//! Benchmarks of the routing core against keying, in the same run.
//!
//! - `routing/decide_512x8`: one whole affinity decision — the admitted candidates for the
//!   model, their depths for a 512-key prompt (8 full clusters holding it to depths 0, 16,
//!   64, 200, 300, 400, 511 and 512), the sticky rule and the load gate (every queue read).
//! - `routing/confirm_512`: the verdict of a 2xx applied for a new 512-key prompt at a
//!   full cluster (512 keys written, 512 evicted), what `ConfirmLayer` does at a head.
//! - `keying/chat_100k/keys`: keying the 100 KiB chat body, the yardstick.
//!
//! Targets: decide ≤ 0.10× and confirm ≤ 0.35× of `keying/chat_100k/keys`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use grid_route_layer::affinity::{Affinity, AffinitySettings, Outcome};
use grid_route_layer::confirm::Verdict;
use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
use grid_route_layer::index::{IndexSettings, PrefixIndex};
use grid_route_layer::keying::{Api, KeySeed, MAX_KEYS, key_body};
use serde_json::json;

const DEPTHS: [usize; 8] = [0, 16, 64, 200, 300, 400, 511, 512];

/// A chain of `MAX_KEYS` unrelated keys.
fn synthetic_prompt(seed: u64) -> Vec<u64> {
    grid_route_benches::synthetic_keys(seed, MAX_KEYS)
}

/// Four sites of two clusters, every endpoint measured.
fn grid() -> Grid {
    let sites = ["east", "west", "north", "south"].map(|site| {
        SiteSpec::new(site).with_clusters((0..2).map(|i| {
            ClusterSpec::new(format!("{site}-{i}"))
                .with_models(["demo-model"])
                .with_endpoints([format!("http://{site}-{i}")])
        }))
    });
    let grid = Grid::new(&GridSpec::new(sites), GridSettings::default()).expect("a valid grid");
    let now = Instant::now();
    for (i, cluster) in grid.view().clusters().iter().enumerate() {
        let url = &cluster.endpoints()[0];
        cluster.load().record_queue(url, Some(i as f64), now);
    }
    grid
}

fn decide_512x8(c: &mut Criterion) {
    let grid = grid();
    let view = grid.view();
    let index = Arc::new(PrefixIndex::new(
        IndexSettings::default(),
        view.cluster_ids(),
    ));
    let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
    // About 4.5 MiB of conversation: enough stream for all 512 keys.
    let body = serde_json::to_vec(&json!({
        "model": "demo-model",
        "messages": [
            {"role": "system", "content": grid_route_benches::prose(7, 4_600_000)},
            {"role": "user", "content": "and now?"},
        ],
    }))
    .expect("serialising a Value");
    let prompt = key_body(&KeySeed::random(), Api::ChatCompletions, &body).expect("one model");
    let keys = prompt.keys().expect("a keyed body");
    assert_eq!(keys.len(), MAX_KEYS);
    let now = Instant::now();
    let fill_prompts = IndexSettings::DEFAULT_CAPACITY / MAX_KEYS;
    for (i, (cluster, depth)) in view.clusters().iter().zip(DEPTHS).enumerate() {
        for p in 0..fill_prompts {
            index.confirm(cluster.id(), &synthetic_prompt((i * 1_000 + p) as u64), now);
        }
        index.confirm(cluster.id(), &keys.as_slice()[..depth], now);
    }
    let no_exploration = 0.5;
    let decision = affinity.decide(
        view.candidates(prompt.model()),
        Some(keys),
        None,
        now,
        no_exploration,
    );
    // The 512-deep holder's queue (7) is within what 4 MiB of prefill saves.
    assert_eq!(decision.outcome(), Some(Outcome::Sticky));
    assert_eq!(decision.clusters().len(), 1);
    c.bench_function("routing/decide_512x8", |b| {
        b.iter(|| {
            let view = grid.view();
            affinity.decide(
                view.candidates(black_box(prompt.model())),
                Some(black_box(keys)),
                None,
                now,
                no_exploration,
            )
        });
    });
}

fn confirm_512(c: &mut Criterion) {
    let grid = grid();
    let view = grid.view();
    let cluster = view.clusters()[0].id().clone();
    let index = PrefixIndex::new(IndexSettings::default(), view.cluster_ids());
    let now = Instant::now();
    let per_cluster = IndexSettings::DEFAULT_CAPACITY / MAX_KEYS;
    for p in 0..per_cluster {
        index.confirm(&cluster, &synthetic_prompt(p as u64), now);
    }
    // Twice as many prompts as the cluster holds: each is gone when its turn comes again,
    // so every confirmation writes 512 keys and evicts 512.
    let ring: Vec<_> = (0..2 * per_cluster)
        .map(|p| synthetic_prompt(1_000_000 + p as u64))
        .collect();
    let mut next = ring.iter().cycle();
    c.bench_function("routing/confirm_512", |b| {
        b.iter(|| {
            let keys = next
                .next()
                .expect("a cycle over a non-empty ring never ends");
            Verdict::of_status(black_box(200)).apply(&index, &cluster, black_box(keys), now);
        });
    });
    assert_eq!(index.entries(&cluster), IndexSettings::DEFAULT_CAPACITY);
}

fn keying_chat_100k(c: &mut Criterion) {
    let seed = KeySeed::random();
    let body = grid_route_benches::chat_100k();
    c.bench_function("keying/chat_100k/keys", |b| {
        b.iter(|| key_body(&seed, Api::ChatCompletions, black_box(&body)));
    });
}

criterion_group!(benches, decide_512x8, confirm_512, keying_chat_100k);
criterion_main!(benches);
