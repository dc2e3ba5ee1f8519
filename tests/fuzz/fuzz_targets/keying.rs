//! The keying scanner, for all four keyed APIs, on arbitrary request bodies.
//!
//! Holds, for every body and API:
//! - keying never panics, and keying the same body twice gives the same model, keys and
//!   session;
//! - at most `MAX_KEYS` keys, and they cover no more bytes than the stream has blocks;
//! - the model and a duplicated routing field agree with `read_model` (the reader used when
//!   prefix affinity is off), so switching affinity off never changes how a request routes
//!   by model or whether it is refused;
//! - for a body that is valid JSON (as `serde_json` reads it) and small enough that no value
//!   is keyed by a digest of its raw bytes: removing or adding whitespace between tokens
//!   changes neither the model, the keys nor the session. A media source that is not a string (an
//!   object or array with none of the fields keying reads) is digested as sent, by design,
//!   so bodies with a media field holding anything but a string are left out of this
//!   check (found by this target; see RELIABILITY.md).
#![no_main]

use std::sync::LazyLock;

use grid_route_layer::keying::{
    Api, BLOCK_BYTES, CANONICAL_LIMIT_BYTES, KeySeed, MAX_KEYS, key_body, read_model,
};
use grid_route_layer::route::Prompt;
use libfuzzer_sys::fuzz_target;

static SEED: LazyLock<KeySeed> = LazyLock::new(KeySeed::random);

fuzz_target!(|body: &[u8]| {
    let model_only = read_model(body);
    let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    for api in Api::ALL {
        let first = key_body(&SEED, api, body);
        let again = key_body(&SEED, api, body);
        match (&first, &again) {
            (Ok(a), Ok(b)) => assert_same(a, b, "keying the same body twice"),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("keying the same body twice: one refused, one not"),
        }
        if !body.contains(&0xFF) {
            // `key_body` refuses a 0xFF byte before reading anything; `read_model` does not
            // look for it.
            match (&first, &model_only) {
                (Ok(keyed), Ok(read)) => {
                    assert_eq!(keyed.model(), read.model());
                    assert_eq!(keyed.streamed(), read.streamed());
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("key_body ({a:?}) and read_model ({b:?}) disagree"),
            }
        }
        let Ok(prompt) = &first else { continue };
        if let Ok(keys) = prompt.keys() {
            assert!(!keys.is_empty() && keys.len() <= MAX_KEYS);
            assert!(keys.total_covered_bytes() <= keys.blocks() * BLOCK_BYTES as u64);
            for depth in 1..=keys.len() {
                assert!(keys.covered_bytes(depth) > keys.covered_bytes(depth - 1));
            }
            if is_json && !has_media_object(&compact(body)) {
                for reshaped in [compact(body), spaced(body)] {
                    if reshaped.len() > CANONICAL_LIMIT_BYTES || body.len() > CANONICAL_LIMIT_BYTES
                    {
                        continue;
                    }
                    let other = key_body(&SEED, api, &reshaped)
                        .unwrap_or_else(|e| panic!("whitespace made a duplicate: {e}"));
                    assert_same(prompt, &other, "whitespace between tokens");
                }
            }
        }
    }
});

fn assert_same(a: &Prompt, b: &Prompt, what: &str) {
    assert_eq!(a.model(), b.model(), "{what}: models differ");
    assert_eq!(a.keys(), b.keys(), "{what}: keys differ");
    assert_eq!(a.session(), b.session(), "{what}: sessions differ");
}

/// Fields whose value keying digests as a media source: a string is decoded first, any
/// other shape without a known source field is digested byte for byte.
const MEDIA_FIELDS: [&[u8]; 8] = [
    b"\"image_url\":",
    b"\"input_audio\":",
    b"\"audio_url\":",
    b"\"video_url\":",
    b"\"file\":",
    b"\"source\":",
    b"\"file_data\":",
    b"\"data\":",
];

/// Whether a compact body gives a media field anything but a string.
fn has_media_object(compact: &[u8]) -> bool {
    MEDIA_FIELDS.iter().any(|field| {
        memchr::memmem::find_iter(compact, field)
            .any(|at| compact.get(at + field.len()) != Some(&b'"'))
    })
}

/// Calls `f` with each byte of `body` and whether it sits outside any JSON string.
fn for_each_byte(body: &[u8], mut f: impl FnMut(u8, bool)) {
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        let outside = !in_string;
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        }
        f(b, outside && b != b'"');
    }
}

/// `body` without whitespace between tokens.
fn compact(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    for_each_byte(body, |b, outside| {
        if !(outside && matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            out.push(b);
        }
    });
    out
}

/// `body` with whitespace after every structural character and around the document.
fn spaced(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() * 2 + 4);
    out.extend_from_slice(b"\r\n ");
    for_each_byte(body, |b, outside| {
        out.push(b);
        if outside && matches!(b, b'{' | b'[' | b',' | b':') {
            out.extend_from_slice(b" \n\t");
        }
    });
    out.extend_from_slice(b" \n");
    out
}
