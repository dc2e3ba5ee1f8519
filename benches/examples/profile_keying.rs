//! Keys `chat_100k` in a loop, for a profiler: `cargo run --release -p grid-route-benches
//! --example profile_keying -- 20000`.

use grid_route_layer::keying::{Api, KeySeed, key_body};

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let body = grid_route_benches::chat_100k();
    let seed = KeySeed::random();
    let mut total = 0usize;
    for _ in 0..rounds {
        let prompt = key_body(&seed, Api::ChatCompletions, std::hint::black_box(&body))
            .expect("no duplicates");
        total += prompt
            .keys()
            .map(grid_route_layer::keying::PrefixKeys::len)
            .unwrap_or_default();
    }
    println!("{total}");
}
