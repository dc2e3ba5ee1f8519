//! The prefix index: which cluster this gateway replica sent each prompt block to.
//!
//! A gateway cannot look into its engines' KV caches, but it knows what it sent where. The
//! index remembers, per backend cluster, the prefix keys of the prompts that cluster
//! answered with 2xx, so that affinity can ask "how deep into this prompt does each
//! candidate already hold it?" ([`PrefixIndex::depths`]) and send the request where its
//! prefill is cheapest.
//!
//! It is a sans-IO core: plain structs, no async, no HTTP types, no clock reads. Callers
//! pass `now` in, which lets the Tower layers, the simulator (virtual time) and the tests
//! (no sleeping) share the same code.
//!
//! # How it remembers
//!
//! - **Keys chain.** A prompt's key `i` stands for its whole prefix up to block `i`, so a
//!   cluster holding key `i` was sent blocks `0..=i`. A cluster's *depth* for a request is
//!   the number of the request's keys it holds as a prefix.
//! - **One LRU per cluster** (`prefix_affinity.capacity` entries, default 16384), so one
//!   cluster's traffic cannot evict another's entries.
//! - **Confirm and drop.** [`PrefixIndex::confirm`] records a 2xx answer; it writes the
//!   prompt tail first, so heads are the most recent and eviction takes tails before heads.
//!   [`PrefixIndex::drop_keys`] forgets a request's keys after a 429 or 5xx.
//! - **Deadlines.** Each confirmation counts for `prefix_affinity.ttl_secs` (default 600)
//!   on the monotonic clock; an expired key does not count and is removed lazily.
//! - **Fast reads.** A depth is a binary search over the request's keys (about 11 lookups
//!   for 512 keys, 1 for a cluster that holds nothing), relying on the held keys of a chain
//!   forming a prefix; see [`PrefixIndex::depth`] for what happens when they do not. Reads
//!   use the LRU's `peek`, which leaves recency alone, so readers share a cluster's lock
//!   and never lock the cluster map at all.
//! - **Small entries.** A deadline is 4 bytes (seconds since the index was built), which
//!   keeps an LRU node at 32 bytes; with the map's slot an entry costs about 66 bytes of
//!   heap when a cluster is full (see `tests/tests/index_memory.rs`).
//! - **Quiet.** `Debug` prints counts, never keys.
//! - **Shareable.** Replicas behind one load balancer can share what they learn: an
//!   [`IndexObserver`] set with [`PrefixIndex::with_observer`] is told of each local
//!   confirmation and drop ([`IndexEvent`]), and [`PrefixIndex::apply`] takes a peer's.
//!   The index does no I/O for it; [`wire`] is the format events travel in and the rule
//!   for applying a peer's, and the transport is the gateway's (the example gateway uses
//!   a Redis Stream). Events are comparable only between replicas whose
//!   [`KeySeed`](crate::keying::KeySeed)s share a fingerprint.
//!
//! # Example
//!
//! ```
//! use std::time::{Duration, Instant};
//!
//! use grid_route_layer::grid::{ClusterId, SiteName};
//! use grid_route_layer::index::{IndexSettings, PrefixIndex};
//!
//! let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
//! let west = ClusterId::new(SiteName::new("west").unwrap(), "west-a");
//! let settings = IndexSettings::new(16_384, Duration::from_secs(600)).unwrap();
//! let index = PrefixIndex::new(settings, [east.clone(), west.clone()]);
//!
//! // The keys of a four-block prompt (the keying module computes them in a gateway).
//! let prompt = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344, 0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89];
//! let now = Instant::now();
//!
//! // `east` answered the first three blocks of this conversation with 200 OK.
//! index.confirm(&east, &prompt[..3], now);
//! assert_eq!(index.depths([&east, &west], &prompt, now), [3, 0]);
//!
//! // Ten minutes later the confirmation no longer counts.
//! assert_eq!(index.depth(&east, &prompt, now + Duration::from_secs(601)), 0);
//!
//! // A 503 from `east` makes it forget the request's blocks.
//! index.confirm(&east, &prompt, now);
//! index.drop_keys(&east, &prompt);
//! assert_eq!(index.depth(&east, &prompt, now), 0);
//! ```
//!
//! # Limits
//!
//! The index is per replica and in memory: without a shared transport it is empty after
//! a restart and sees only what this replica routed. It matches request text, not engine tokens, and a cluster's depth
//! is what it was *sent*, not what its engines still cache.

mod clock;
mod cluster;
mod hasher;
mod prefix_index;
mod settings;
mod shared;
pub mod wire;

pub use prefix_index::{Confirmation, PrefixIndex, SessionHold};
pub use settings::{IndexSettings, IndexSettingsError};
pub use shared::{IndexEvent, IndexObserver};

#[cfg(test)]
mod tests;
