//! Keying throughput against parsing the same body with serde_json, in the same run.
//!
//! For each body: `keying/<body>/keys` (the whole keying of the body),
//! `keying/<body>/serde_skip` (`from_slice::<IgnoredAny>`, the cheapest full read) and
//! `keying/<body>/serde_value` (`from_slice::<Value>`, what a gateway that builds a tree
//! would pay). Targets on `chat_100k`: keys ≤ 2.0× serde_skip and ≤ 0.67× serde_value.
//!
//! And `keying/<body>+session/keys`: the same body naming a session (`prompt_cache_key`;
//! Anthropic `metadata.user_id` for `messages_tools`). Target: at most 1.02× the body's own
//! `keys` in the same run.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use grid_route_benches as bodies;
use grid_route_layer::keying::{Api, KeySeed, key_body};
use serde::de::IgnoredAny;
use serde_json::Value;

fn keying(c: &mut Criterion) {
    let seed = KeySeed::random();
    let cases: [(&str, Api, Vec<u8>); 6] = [
        ("chat_100k", Api::ChatCompletions, bodies::chat_100k()),
        (
            "chat_100k_sorted",
            Api::ChatCompletions,
            bodies::chat_100k_sorted(),
        ),
        ("messages_tools", Api::Messages, bodies::messages_tools()),
        ("responses_items", Api::Responses, bodies::responses_items()),
        (
            "chat_image_4m",
            Api::ChatCompletions,
            bodies::chat_image_4m(),
        ),
        ("chat_20m", Api::ChatCompletions, bodies::chat_20m()),
    ];
    let mut group = c.benchmark_group("keying");
    for (name, api, body) in &cases {
        let prompt = key_body(&seed, *api, body).expect("bench bodies have no duplicates");
        assert!(
            prompt.keys().is_ok(),
            "{name} must get keys: {:?}",
            prompt.keys().err()
        );
        group.throughput(Throughput::Bytes(body.len() as u64));
        if body.len() > 1 << 20 {
            group.sample_size(20);
        } else {
            group.sample_size(100);
        }
        group.bench_function(format!("{name}/keys"), |b| {
            b.iter(|| key_body(&seed, *api, black_box(body)));
        });
        group.bench_function(format!("{name}/serde_skip"), |b| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(body)).map(|_| ()));
        });
        group.bench_function(format!("{name}/serde_value"), |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(body)));
        });
    }
    // The same bodies naming a session: the field goes first, where clients put it.
    let sessions: [(&str, Api, Vec<u8>, &str); 2] = [
        (
            "chat_100k",
            Api::ChatCompletions,
            bodies::chat_100k(),
            r#""prompt_cache_key":"conv-7f3c9e2a-5b1d-4e8f-9a6c-2d4b8e1f0a37","#,
        ),
        (
            "messages_tools",
            Api::Messages,
            bodies::messages_tools(),
            r#""metadata":{"user_id":"user_5e1d_account_9a6c_session_7f3c9e2a-5b1d"},"#,
        ),
    ];
    for (name, api, body, field) in &sessions {
        assert_eq!(body.first(), Some(&b'{'));
        let mut with = b"{".to_vec();
        with.extend_from_slice(field.as_bytes());
        with.extend_from_slice(&body[1..]);
        let prompt = key_body(&seed, *api, &with).expect("bench bodies have no duplicates");
        assert!(prompt.session().is_some(), "{name} must name a session");
        let plain = key_body(&seed, *api, body).expect("bench bodies have no duplicates");
        assert_eq!(prompt.keys(), plain.keys(), "a session changes no key");
        group.throughput(Throughput::Bytes(with.len() as u64));
        group.sample_size(100);
        group.bench_function(format!("{name}+session/keys"), |b| {
            b.iter(|| key_body(&seed, *api, black_box(&with)));
        });
    }
    group.finish();
}

criterion_group!(benches, keying);
criterion_main!(benches);
