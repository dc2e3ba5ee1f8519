//! Entry points for the fuzz targets in `tests/fuzz`, built only with the `fuzzing`
//! feature and hidden from the docs: not a stable API.
//!
//! The readers of where a request names stored state (`pin`'s paths and `POST
//! /v1/responses` bodies) are crate-private, because only [`PinLayer`](crate::pin::PinLayer)
//! acts on them. Fuzzing them through the layer would spend most of each run in Tower
//! and HTTP plumbing, so this module calls them directly and returns what they found as
//! plain public values.

use std::ops::Range;

use bytes::Bytes;

use crate::pin::IdKind;
use crate::pin::reference::{BodyIds, StoredPath};

/// What [`read_stored_path`] found in a path naming a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPathParts<'a> {
    /// `resp_` under `/v1/responses/`, `conv_` under `/v1/conversations/`.
    pub kind: IdKind,
    /// The id segment, as written.
    pub id: &'a str,
    /// Whether every segment after the id is one plain segment.
    pub rest_is_plain: bool,
    /// The same path with `"X"` in place of the id segment.
    pub with_placeholder_id: String,
    /// The same path with the id segment put back: must be the path read.
    pub with_same_id: String,
}

/// Reads a request path as the pin layer does; `None` when it names no stored object.
pub fn read_stored_path(path: &str) -> Option<StoredPathParts<'_>> {
    let found = StoredPath::read(path)?;
    Some(StoredPathParts {
        kind: found.kind,
        id: found.id,
        rest_is_plain: found.rest_is_plain(),
        with_placeholder_id: found.with_id("X"),
        with_same_id: found.with_id(found.id),
    })
}

/// Whether the pin layer tags the answers of `path` (the Responses and Conversations
/// APIs).
pub fn is_stored_state_api(path: &str) -> bool {
    crate::pin::reference::is_stored_state_api(path)
}

/// Whether `segment` is one plain path segment (unreserved characters, not `.`, no `..`).
pub fn is_plain_segment(segment: &str) -> bool {
    crate::pin::reference::is_plain_segment(segment)
}

/// One id a `POST /v1/responses` body names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundId {
    /// `previous_response_id`, `conversation` or `conversation.id`.
    pub field: &'static str,
    /// The kind of id the field holds.
    pub kind: IdKind,
    /// Where the string's content (between its quotes) sits in the body.
    pub content: Range<usize>,
    /// The decoded string; `None` when it is not valid UTF-8.
    pub text: Option<String>,
}

/// What the pin layer reads in a `POST /v1/responses` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyRead {
    /// The string ids it names.
    Found(Vec<FoundId>),
    /// A field named twice.
    Duplicate(&'static str),
    /// Not a JSON object that could be read to its end.
    Unreadable,
}

/// Reads the ids naming stored state in a `POST /v1/responses` body, as the pin layer does.
pub fn read_body_ids(body: &[u8]) -> BodyRead {
    match BodyIds::read(body) {
        BodyIds::Found(ids) => BodyRead::Found(
            ids.into_iter()
                .map(|id| FoundId {
                    field: id.field,
                    kind: id.kind,
                    content: id.content,
                    text: id.text,
                })
                .collect(),
        ),
        BodyIds::Duplicate(field) => BodyRead::Duplicate(field),
        BodyIds::Unreadable => BodyRead::Unreadable,
    }
}

/// `body` with each range replaced by its text (ranges in order, not overlapping), as the
/// pin layer replaces tags by engine ids.
pub fn splice(body: &Bytes, edits: &[(Range<usize>, &str)]) -> Bytes {
    crate::pin::reference::splice(body, edits)
}

/// Where the gateway finds an answer's first output (its first token, for a stream) when
/// the answer's body comes as `chunks`, as `InFlightBody` and `FeedbackBody` find it: the
/// end of the chunk it was found in, counting bytes from the body's start; `None` when no
/// chunk carried output.
pub fn first_output_at<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Option<usize> {
    crate::select::OutputScan::found_at(chunks)
}
