//! The random draw behind the exploration share: `fastrand`'s per-thread generator.
//!
//! Exploration needs a fair coin, not secrecy: a client that could predict the draw could
//! only make its own request skip affinity. `fastrand` keeps a wyrand generator per thread,
//! seeded by hashing the thread's id and the time, so a draw costs a few nanoseconds, takes
//! no lock, and the crate has no dependencies of its own (the workspace already builds it
//! for `tempfile` and the simulator). The cores take the draw as an argument; only the layer
//! calls this.

/// A uniform draw in `[0, 1)` from this thread's generator.
pub(crate) fn random_draw() -> f64 {
    fastrand::f64()
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
    fn threads_draw_different_sequences() {
        let here: Vec<f64> = (0..4).map(|_| random_draw()).collect();
        let there = std::thread::spawn(|| (0..4).map(|_| random_draw()).collect::<Vec<f64>>())
            .join()
            .unwrap();
        assert_ne!(here, there);
    }
}
