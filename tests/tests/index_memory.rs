//! Measures the heap an index entry costs, with a global allocator that counts bytes.
//!
//! Run with `cargo test -p grid-route-tests --test index_memory -- --nocapture` to see the
//! number. It is the bytes *requested* from the allocator; the allocator's own rounding
//! and headers come on top (glibc serves each 32-byte LRU node from a 48-byte chunk).
//! This binary holds one test so that no other test's allocations are counted.

use std::time::Instant;

use grid_route_layer::grid::{ClusterId, SiteName};
use grid_route_layer::index::{IndexSettings, PrefixIndex};
use grid_route_tests::counting_alloc::{CountingAllocator, live_bytes};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const PROMPT_KEYS: usize = 512;

/// The keys of a prompt: uniformly spread, like the keyed SipHash keys the index gets.
fn prompt(seed: u64) -> Vec<u64> {
    let mut keys = fastrand::Rng::with_seed(seed);
    (0..PROMPT_KEYS).map(|_| keys.u64(..)).collect()
}

#[test]
fn a_full_cluster_costs_under_80_heap_bytes_an_entry() {
    let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    let capacity = IndexSettings::DEFAULT_CAPACITY;
    let prompts: Vec<_> = (0..(capacity / PROMPT_KEYS) as u64).map(prompt).collect();
    let now = Instant::now();
    let index = PrefixIndex::new(IndexSettings::default(), [east.clone()]);

    let before = live_bytes();
    for keys in &prompts {
        index.confirm(&east, keys, now);
    }
    let grown = live_bytes() - before;

    let entries = index.entries(&east);
    assert_eq!(entries, capacity);
    let per_entry = grown as f64 / entries as f64;
    println!("index: {entries} entries, {grown} heap bytes, {per_entry:.1} bytes per entry");
    // A 32-byte LRU node (u64 key, u32 deadline, two links) plus a 16-byte map slot and
    // its control byte at the map's load factor: about 66 bytes when the table is full.
    assert!(per_entry < 80.0, "{per_entry:.1} bytes per entry");
    assert!(per_entry >= 48.0, "{per_entry:.1} bytes per entry");
}
