//! Runs one keying workload in a loop, for profilers and instruction counters:
//! `cargo run --release -p grid-route-benches --example profile_keying -- keys 20000`
//! (the first argument is `keys`, `session`, `skip` or `value`: keying `chat_100k`, keying
//! it with a `prompt_cache_key` in front, or parsing it with serde_json as `IgnoredAny` or
//! `Value`).
//!
//! What a session costs, in instructions (deterministic where times on a shared machine
//! are not): `scripts/session-cost` runs `keys` and `session` under callgrind.

use grid_route_layer::keying::{Api, KeySeed, key_body};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "keys".into());
    let rounds: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let body = match std::env::var("BODY").as_deref() {
        Ok("sorted") => grid_route_benches::chat_100k_sorted(),
        _ => grid_route_benches::chat_100k(),
    };
    let body = if what == "session" {
        let mut with =
            br#"{"prompt_cache_key":"conv-7f3c9e2a-5b1d-4e8f-9a6c-2d4b8e1f0a37","#.to_vec();
        with.extend_from_slice(&body[1..]);
        with
    } else {
        body
    };
    let seed = KeySeed::random();
    let mut total = 0usize;
    for _ in 0..rounds {
        let body = std::hint::black_box(&body);
        total += match what.as_str() {
            "skip" => usize::from(serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()),
            "value" => usize::from(serde_json::from_slice::<serde_json::Value>(body).is_ok()),
            _ => key_body(&seed, Api::ChatCompletions, body)
                .map(|p| {
                    p.keys()
                        .map(grid_route_layer::keying::PrefixKeys::len)
                        .unwrap_or_default()
                })
                .unwrap_or_default(),
        };
    }
    println!("{what}: {total}");
}
