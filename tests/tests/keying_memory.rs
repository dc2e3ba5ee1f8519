//! Keying a large body costs at most about the body's own size in extra heap.
//!
//! Keys 1 MiB and 8 MiB Chat Completions bodies, with the tool list before and after the
//! messages and with each message's `content` before and after its `role` (the order
//! serde_json and Go write), under a counting global allocator; the extra heap at the peak
//! must stay within the body's size plus 64 KiB. Run with `-- --nocapture` to see the
//! numbers. One test in this binary, so nothing else is counted.

use grid_route_layer::keying::{Api, KeySeed, key_body};
use grid_route_tests::counting_alloc::{CountingAllocator, peak_bytes, reset_peak};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const SLACK_BYTES: usize = 64 * 1024;

fn tools() -> String {
    let tool = |i: usize| {
        format!(
            r#"{{"type":"function","function":{{"name":"tool_{i}","description":"Looks things up, number {i}.","parameters":{{"type":"object","properties":{{"q":{{"type":"string"}},"n":{{"type":"integer"}}}},"required":["q"]}}}}}}"#
        )
    };
    format!("[{}]", (0..8).map(tool).collect::<Vec<_>>().join(","))
}

/// A chat body of about `bytes`, in the requested field orders.
fn conversation_body(bytes: usize, tools_first: bool, content_first: bool) -> Vec<u8> {
    let line = "Lines of a long conversation, with \\\"quotes\\\" and a newline.\\n ";
    let turn = line.repeat(64);
    let mut messages = Vec::new();
    let mut size = 0;
    let mut i = 0;
    while size < bytes {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let message = if content_first {
            format!(r#"{{"content":"{turn}","role":"{role}"}}"#)
        } else {
            format!(r#"{{"role":"{role}","content":"{turn}"}}"#)
        };
        size += message.len() + 1;
        messages.push(message);
        i += 1;
    }
    let messages = format!("[{}]", messages.join(","));
    let body = if tools_first {
        format!(
            r#"{{"model":"demo","tools":{},"messages":{messages}}}"#,
            tools()
        )
    } else {
        format!(
            r#"{{"messages":{messages},"model":"demo","tools":{}}}"#,
            tools()
        )
    };
    body.into_bytes()
}

#[test]
fn keying_uses_at_most_the_body_size_plus_64_kib_of_extra_heap() {
    let seed = KeySeed::random();
    for mib in [1, 8] {
        for tools_first in [true, false] {
            for content_first in [false, true] {
                let body = conversation_body(mib << 20, tools_first, content_first);
                let before = reset_peak();
                let prompt = key_body(&seed, Api::ChatCompletions, &body).expect("no duplicates");
                let extra = peak_bytes() - before;
                let keys = prompt.keys().expect("keys").len();
                drop(prompt);
                println!(
                    "{} bytes, tools {}, content {}: {keys} keys, peak extra heap {extra} bytes ({:.3} of the body)",
                    body.len(),
                    if tools_first { "first" } else { "last" },
                    if content_first {
                        "before role"
                    } else {
                        "after role"
                    },
                    extra as f64 / body.len() as f64,
                );
                assert!(
                    extra <= body.len() + SLACK_BYTES,
                    "{extra} bytes of extra heap for a {} byte body",
                    body.len()
                );
            }
        }
    }
}
