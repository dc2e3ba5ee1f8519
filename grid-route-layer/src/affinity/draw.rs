//! The random draw behind the exploration share: a per-thread splitmix64.
//!
//! Exploration needs a fair coin, not secrecy: a client that could predict the draw could
//! only make its own request skip affinity. So a splitmix64 per thread, seeded once from
//! the standard library's per-process random hasher keys, costs a few nanoseconds and no
//! dependency.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// One splitmix64 step: advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seed() -> u64 {
    // `RandomState::new` draws fresh keys per thread (incremented per call), so every
    // thread gets its own sequence.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x5eed);
    hasher.finish()
}

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

/// A uniform draw in `[0, 1)` from this thread's generator.
pub(crate) fn random_draw() -> f64 {
    STATE.with(|state| {
        let mut s = state.get();
        let bits = splitmix64(&mut s);
        state.set(s);
        // The top 53 bits make every representable multiple of 2^-53 in [0, 1) equally
        // likely.
        (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_in_the_unit_interval_and_spread() {
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            let d = random_draw();
            assert!((0.0..1.0).contains(&d));
            buckets[(d * 10.0) as usize] += 1;
        }
        for count in buckets {
            assert!((9_000..11_000).contains(&count), "{buckets:?}");
        }
    }

    #[test]
    fn splitmix64_matches_its_reference_output() {
        // The first output for seed 0 of the reference implementation (Vigna).
        let mut s = 0;
        assert_eq!(splitmix64(&mut s), 0xe220_a839_7b1d_cdaf);
    }
}
