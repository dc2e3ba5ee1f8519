//! Pinning benches: the streaming id rewriter against a plain copy of the same chunks.
//!
//! `pin/sse_rewrite_1m` feeds one streamed Responses answer of 1 MiB (text deltas of about
//! 200 bytes each, framed by the created/done/completed events) in 16 KiB chunks;
//! `pin/passthrough_copy_1m` copies the same chunks into one output buffer and
//! `pin/passthrough_copy_1m_bytes` into a new `Bytes` each: the baselines.
//! The others are harder cases: 1 MiB of short responses back to back, an id in every
//! event, and a single 1 MiB JSON response object.

use std::fmt::Write as _;
use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use grid_route_layer::grid::{ClusterDigest, SiteName};
use grid_route_layer::pin::{Framing, IdRewriter, TagKey, TagKeys, TagStamp};

const STREAM_BYTES: usize = 1 << 20;
const CHUNK_BYTES: usize = 16 << 10;

fn stamp() -> TagStamp {
    let key =
        TagKey::from_bytes(b"bench key, at least thirty-two bytes long").expect("long enough");
    TagKeys::new(Some(key)).stamp(
        &SiteName::new("east").expect("valid site"),
        ClusterDigest::of_name("east-a"),
    )
}

fn response_id(n: usize) -> String {
    format!("resp_67c9fdcecf488190bdd9a0409de3a1ec{n:016x}")
}

fn message_id(n: usize) -> String {
    format!("msg_67c9fdcf37fc8190ba82116e33fb28c5{n:016x}")
}

/// Appends one SSE event whose data is `{"type":name,"sequence_number":seq,body}`.
fn event(out: &mut String, name: &str, seq: &mut usize, body: &str) {
    let _ = write!(
        out,
        "event: {name}\ndata: {{\"type\":\"{name}\",\"sequence_number\":{seq},{body}}}\n\n"
    );
    *seq += 1;
}

/// One response streamed as the Responses API does: created, in progress, item and part
/// added, `deltas` text deltas of about 200 bytes each, the done events (which repeat the
/// whole text) and completed.
fn response_stream(n: usize, deltas: usize, out: &mut String) {
    let resp = response_id(n);
    let msg = message_id(n);
    let conv = "conv_67c9fdce1a2b8190a1b2c3d4e5f60718";
    let seq = &mut 0;
    let head = format!(
        "\"id\":\"{resp}\",\"object\":\"response\",\"created_at\":1741290958,\"model\":\"demo-model\",\"previous_response_id\":null,\"conversation\":{{\"id\":\"{conv}\"}}"
    );
    let item = format!("\"item_id\":\"{msg}\",\"output_index\":0,\"content_index\":0");
    let created = format!("\"response\":{{{head},\"status\":\"in_progress\",\"output\":[]}}");
    event(out, "response.created", seq, &created);
    event(out, "response.in_progress", seq, &created);
    event(
        out,
        "response.output_item.added",
        seq,
        &format!(
            "\"output_index\":0,\"item\":{{\"id\":\"{msg}\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}"
        ),
    );
    event(
        out,
        "response.content_part.added",
        seq,
        &format!("{item},\"part\":{{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}"),
    );
    let mut text = String::new();
    for d in 0..deltas {
        let delta = format!(" word{d}");
        text.push_str(&delta);
        event(
            out,
            "response.output_text.delta",
            seq,
            &format!("{item},\"delta\":\"{delta}\",\"logprobs\":[],\"obfuscation\":\"x1\""),
        );
    }
    let part = format!("{{\"type\":\"output_text\",\"text\":\"{text}\",\"annotations\":[]}}");
    let message = format!(
        "{{\"id\":\"{msg}\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{part}]}}"
    );
    event(
        out,
        "response.output_text.done",
        seq,
        &format!("{item},\"text\":\"{text}\""),
    );
    event(
        out,
        "response.content_part.done",
        seq,
        &format!("{item},\"part\":{part}"),
    );
    event(
        out,
        "response.output_item.done",
        seq,
        &format!("\"output_index\":0,\"item\":{message}"),
    );
    event(
        out,
        "response.completed",
        seq,
        &format!(
            "\"response\":{{{head},\"status\":\"completed\",\"output\":[{message}],\"usage\":{{\"input_tokens\":36,\"output_tokens\":{deltas}}}}}"
        ),
    );
}

/// One long answer of about 1 MiB: what a gateway sees on one streamed response.
fn long_response_stream() -> Vec<u8> {
    let mut out = String::new();
    // A delta event is about 200 bytes; the done events repeat the text four times.
    response_stream(0, STREAM_BYTES / 240, &mut out);
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// About 1 MiB of short responses (40 deltas each) back to back: many more response
/// objects per byte than a real stream.
fn short_responses_stream() -> Vec<u8> {
    let mut out = String::new();
    let mut n = 0;
    while out.len() < STREAM_BYTES {
        response_stream(n, 40, &mut out);
        n += 1;
    }
    out.into_bytes()
}

/// About 1 MiB of ~200-byte events that each carry a response id.
fn ids_in_every_event() -> Vec<u8> {
    let mut out = String::new();
    let mut n = 0;
    while out.len() < STREAM_BYTES {
        let _ = write!(
            out,
            "event: response.in_progress\ndata: {{\"type\":\"response.in_progress\",\"sequence_number\":{n},\"response\":{{\"id\":\"{}\",\"object\":\"response\",\"status\":\"in_progress\"}}}}\n\n",
            response_id(n)
        );
        n += 1;
    }
    out.into_bytes()
}

/// A 1 MiB response object: ids at the top and the bottom, a long output in between.
fn large_response_object() -> Vec<u8> {
    let mut items = Vec::new();
    let mut n = 0;
    let mut size = 0;
    while size < STREAM_BYTES {
        let item = format!(
            "{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{{\"type\":\"output_text\",\"annotations\":[],\"text\":\"{}\"}}]}}",
            message_id(n),
            "Some generated text, with \\\"quotes\\\" and words. ".repeat(20)
        );
        size += item.len();
        items.push(item);
        n += 1;
    }
    format!(
        "{{\"id\":\"{}\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{}],\"previous_response_id\":\"{}\",\"conversation\":{{\"id\":\"conv_1\"}},\"metadata\":{{}}}}",
        response_id(0),
        items.join(","),
        response_id(1)
    )
    .into_bytes()
}

fn chunks(body: &[u8]) -> Vec<Bytes> {
    body.chunks(CHUNK_BYTES)
        .map(Bytes::copy_from_slice)
        .collect()
}

fn rewrite_all(stamp: &TagStamp, framing: Framing, chunks: &[Bytes]) -> usize {
    let mut rewriter = IdRewriter::new(stamp.clone(), framing);
    let mut sent = 0;
    for chunk in chunks {
        sent += black_box(rewriter.push(chunk.clone())).len();
    }
    sent + rewriter.finish().len()
}

fn total(chunks: &[Bytes]) -> u64 {
    chunks.iter().map(Bytes::len).sum::<usize>() as u64
}

fn pin(c: &mut Criterion) {
    let stamp = stamp();
    let long = chunks(&long_response_stream());
    let short = chunks(&short_responses_stream());
    let every = chunks(&ids_in_every_event());
    let json = chunks(&large_response_object());

    // The benches measure real work only if ids are tagged.
    for (framing, chunks) in [
        (Framing::EventStream, &long),
        (Framing::EventStream, &short),
        (Framing::EventStream, &every),
        (Framing::Json, &json),
    ] {
        assert!(rewrite_all(&stamp, framing, chunks) as u64 > total(chunks));
    }

    let mut group = c.benchmark_group("pin");
    group.throughput(Throughput::Bytes(total(&long)));
    group.bench_function("passthrough_copy_1m", |b| {
        let mut out = Vec::with_capacity(2 * STREAM_BYTES);
        b.iter(|| {
            out.clear();
            for chunk in &long {
                out.extend_from_slice(black_box(chunk));
            }
            black_box(out.len())
        });
    });
    group.bench_function("passthrough_copy_1m_bytes", |b| {
        b.iter(|| {
            let mut sent = 0;
            for chunk in &long {
                sent += black_box(Bytes::copy_from_slice(chunk)).len();
            }
            sent
        });
    });
    group.bench_function("sse_rewrite_1m", |b| {
        b.iter(|| rewrite_all(&stamp, Framing::EventStream, &long));
    });
    group.throughput(Throughput::Bytes(total(&short)));
    group.bench_function("sse_rewrite_1m_short_responses", |b| {
        b.iter(|| rewrite_all(&stamp, Framing::EventStream, &short));
    });
    group.throughput(Throughput::Bytes(total(&every)));
    group.bench_function("sse_rewrite_1m_id_in_every_event", |b| {
        b.iter(|| rewrite_all(&stamp, Framing::EventStream, &every));
    });
    group.throughput(Throughput::Bytes(total(&json)));
    group.bench_function("json_rewrite_1m", |b| {
        b.iter(|| rewrite_all(&stamp, Framing::Json, &json));
    });
    group.finish();
}

criterion_group!(benches, pin);
criterion_main!(benches);
