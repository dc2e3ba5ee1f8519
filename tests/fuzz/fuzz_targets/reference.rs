//! Where a request names stored state: Responses and Conversations paths, and the
//! `previous_response_id` / `conversation` fields of a `POST /v1/responses` body.
//!
//! Input: a path, a line feed, then a body.
//!
//! Holds:
//! - a path read as naming a stored object gives itself back when its id is put back, its
//!   id is one non-empty segment, and it belongs to the APIs whose answers are tagged;
//!   putting another id in reads back that id, with the same kind and the same verdict on
//!   the segments after it; a path of those APIs naming no object is the collection itself
//!   or has an empty first segment;
//! - every id found in a body is a string's content in place (in order, not overlapping,
//!   between quotes), decoded as `serde_json` decodes it; replacing each by another id (as
//!   the pin layer replaces a tag by the engine's id) leaves a body that reads the same
//!   fields with the new ids.
#![no_main]

use bytes::Bytes;
use grid_route_layer::fuzzing::{
    BodyRead, is_plain_segment, is_stored_state_api, read_body_ids, read_stored_path, splice,
};
use libfuzzer_sys::fuzz_target;

const COLLECTIONS: [&str; 2] = ["/v1/responses", "/v1/conversations"];

fuzz_target!(|data: &[u8]| {
    let (path, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    if let Ok(path) = std::str::from_utf8(path) {
        check_path(path);
    }
    check_body(body);
});

fn check_path(path: &str) {
    let Some(parts) = read_stored_path(path) else {
        if is_stored_state_api(path) {
            assert!(
                COLLECTIONS.iter().any(|c| path == *c
                    || path
                        .strip_prefix(c)
                        .is_some_and(|rest| rest.starts_with("//") || rest == "/")),
                "a stored-state path with a first segment names no object"
            );
        }
        return;
    };
    assert_eq!(parts.with_same_id, path);
    assert!(!parts.id.is_empty() && !parts.id.contains('/'));
    assert!(is_stored_state_api(path));
    let collection = COLLECTIONS
        .iter()
        .find(|c| path.starts_with(&format!("{c}/")))
        .expect("a stored path is under a collection");
    let rest = &path[collection.len() + 1 + parts.id.len()..];
    let plain = rest.is_empty() || rest[1..].split('/').all(is_plain_segment);
    assert_eq!(parts.rest_is_plain, plain);
    let moved = read_stored_path(&parts.with_placeholder_id).expect("the placeholder path reads");
    assert_eq!(moved.id, "X");
    assert_eq!(moved.kind, parts.kind);
    assert_eq!(moved.rest_is_plain, parts.rest_is_plain);
}

fn check_body(body: &[u8]) {
    let BodyRead::Found(ids) = read_body_ids(body) else {
        return;
    };
    assert!(ids.len() <= 2, "at most one id per field");
    let mut after = 0;
    for id in &ids {
        let (start, end) = (id.content.start, id.content.end);
        assert!(after < start && start <= end && end < body.len(), "{id:?}");
        assert_eq!(body[start - 1], b'"');
        assert_eq!(body[end], b'"');
        after = end + 1;
        if let Ok(decoded) = serde_json::from_slice::<String>(&body[start - 1..=end]) {
            assert_eq!(id.text.as_deref(), Some(decoded.as_str()), "{id:?}");
        }
    }
    let bytes = Bytes::copy_from_slice(body);
    let edits: Vec<_> = ids
        .iter()
        .map(|id| (id.content.clone(), "resp_engine-id"))
        .collect();
    let replaced = splice(&bytes, &edits);
    let BodyRead::Found(again) = read_body_ids(&replaced) else {
        panic!("a body whose ids were replaced no longer reads");
    };
    assert_eq!(again.len(), ids.len());
    for (old, new) in ids.iter().zip(&again) {
        assert_eq!((old.field, old.kind), (new.field, new.kind));
        assert_eq!(new.text.as_deref(), Some("resp_engine-id"));
    }
}
