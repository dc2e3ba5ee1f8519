//! The id rewriter (`pin::IdRewriter`) on arbitrary bodies fed in arbitrary chunkings.
//!
//! Input: one flags byte (bit 0: event stream, else JSON; bit 1: a keyed stamp, else an
//! empty mac), one byte seeding the chunking, then the body.
//!
//! Holds, for every body:
//! - the output is the same whatever the chunk boundaries: random chunks of up to 64 bytes
//!   (empty ones included; all of one byte for one chunking byte in 64) give what the
//!   whole body at once gives;
//! - a rewriter finished in the middle of a body rewrites the next body like a fresh one;
//! - the rewriter only inserts the stamp: removing every stamp from the output gives the
//!   body back, and it inserts at most one stamp per `"resp_` or `"conv_` in the body;
//! - the gateway finds the body's first output (what ends a stream's wait for its first
//!   token) in the chunk holding the byte that decides it fed one byte at a time, for
//!   random chunks of 0 to 64 bytes, and finds some output in the whole body exactly when
//!   it does byte by byte.
#![no_main]

use std::sync::LazyLock;

use bytes::Bytes;
use grid_route_layer::fuzzing;
use grid_route_layer::grid::{ClusterDigest, SiteName};
use grid_route_layer::pin::{Framing, IdRewriter, TagKey, TagKeys, TagStamp};
use libfuzzer_sys::fuzz_target;

static STAMPS: LazyLock<[TagStamp; 2]> = LazyLock::new(|| {
    let site = SiteName::new("east").unwrap();
    let digest = ClusterDigest::of_name("east-a");
    let key = TagKey::from_bytes(b"a fuzzing key of at least 32 bytes!!").unwrap();
    [
        TagKeys::new(None).stamp(&site, digest),
        TagKeys::new(Some(key)).stamp(&site, digest),
    ]
});

fuzz_target!(|data: &[u8]| {
    let [flags, chunking, body @ ..] = data else {
        return;
    };
    let framing = if flags & 1 == 1 {
        Framing::EventStream
    } else {
        Framing::Json
    };
    let stamp = &STAMPS[usize::from(flags >> 1 & 1)];
    let body_bytes = Bytes::copy_from_slice(body);
    let whole = IdRewriter::rewrite(stamp.clone(), framing, body_bytes.clone());

    // A rewriter left in the middle of another body, then finished: it must start afresh.
    let mut rewriter = IdRewriter::new(stamp.clone(), framing);
    let _ = rewriter.push(body_bytes.slice(..body.len() / 2));
    let _ = rewriter.finish();

    let mut out = Vec::with_capacity(whole.len());
    let mut rng = u32::from(*chunking) | 0x9e37_7900;
    // Chunks of 1 to `max` bytes: every byte alone when `chunking` is a multiple of 64.
    let max = 1 + usize::from(*chunking % 64);
    let mut at = 0;
    while at < body.len() {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        // One chunk in eight is empty.
        let len = if (rng >> 16) % 8 == 0 {
            0
        } else {
            1 + (rng >> 8) as usize % max
        };
        let end = (at + len).min(body.len());
        out.extend_from_slice(&rewriter.push(body_bytes.slice(at..end)));
        at = end;
    }
    out.extend_from_slice(&rewriter.finish());
    assert!(out == whole, "chunk boundaries changed the output");

    // Where the first output is found: in the chunk holding the byte that, fed one byte at
    // a time, decides it, whatever the chunks.
    let decided = fuzzing::first_output_at(body.chunks(1));
    let mut bounds = Vec::new();
    let mut at = 0;
    let mut rng = u32::from(*chunking) | 0x9e37_7900;
    while at < body.len() {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        // 0 to `max` bytes: some chunks are empty.
        at = (at + (rng >> 8) as usize % (max + 1)).min(body.len());
        bounds.push(at);
    }
    let mut from = 0;
    let chunks = bounds.iter().map(|&to| {
        let chunk = &body[from..to];
        from = to;
        chunk
    });
    let found = fuzzing::first_output_at(chunks);
    let expected = decided.map(|byte| bounds.iter().copied().find(|&end| end >= byte).unwrap());
    assert_eq!(found, expected, "chunk boundaries moved the first output");
    assert_eq!(
        fuzzing::first_output_at([body]).is_some(),
        decided.is_some()
    );

    let stamp_text = stamp.as_str().as_bytes();
    if find(body, stamp_text).is_none() {
        let (restored, inserted) = remove_all(&whole, stamp_text);
        assert!(restored == body, "the rewriter changed more than the ids");
        let ids = count(body, b"\"resp_") + count(body, b"\"conv_");
        assert!(inserted <= ids, "{inserted} stamps for {ids} ids");
    }
});

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    memchr::memmem::find_iter(haystack, needle).count()
}

/// `text` without any occurrence of `needle`, and how many were removed.
fn remove_all(text: &[u8], needle: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(text.len());
    let (mut from, mut removed) = (0, 0);
    for at in memchr::memmem::find_iter(text, needle) {
        out.extend_from_slice(&text[from..at]);
        from = at + needle.len();
        removed += 1;
    }
    out.extend_from_slice(&text[from..]);
    (out, removed)
}
