//! Where a request names stored state: the id segment of a Responses or Conversations
//! path, and the `previous_response_id` and `conversation` fields of a `POST
//! /v1/responses` body. Plain code on strings and bytes; the layer acts on what it finds.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use super::tag::{IdKind, is_unreserved};
use crate::keying::scan::{Kind, ScanResult, Scanner};

/// The Responses API's path; stored responses live under it.
pub(crate) const RESPONSES_PATH: &str = "/v1/responses";

/// The Conversations API's path; conversations live under it.
pub(crate) const CONVERSATIONS_PATH: &str = "/v1/conversations";

/// Whether `path` belongs to the Responses or Conversations API (`/v1/responses`,
/// `/v1/conversations` and every path under them): the requests that may name stored
/// state and the answers whose ids are tagged.
///
/// ```
/// use grid_route_layer::pin::is_stored_state_api;
///
/// assert!(is_stored_state_api("/v1/responses"));
/// assert!(is_stored_state_api("/v1/conversations/conv_1/items"));
/// assert!(!is_stored_state_api("/v1/responsesx"));
/// assert!(!is_stored_state_api("/v1/chat/completions"));
/// ```
pub fn is_stored_state_api(path: &str) -> bool {
    [RESPONSES_PATH, CONVERSATIONS_PATH].into_iter().any(|api| {
        path.strip_prefix(api)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// A path whose first segment under `/v1/responses/` or `/v1/conversations/` names a
/// stored object: `/v1/responses/{id}`, `/v1/responses/{id}/cancel`,
/// `/v1/conversations/{id}/items/{item}`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredPath<'a> {
    /// `resp_` under `/v1/responses/`, `conv_` under `/v1/conversations/`.
    pub(crate) kind: IdKind,
    /// The collection, `/v1/responses` or `/v1/conversations`.
    collection: &'static str,
    /// The id segment, as it is written in the path (never percent-decoded).
    pub(crate) id: &'a str,
    /// What follows the id segment: empty, or `/` and more segments.
    rest: &'a str,
}

impl<'a> StoredPath<'a> {
    /// Reads `path` (the URI's path, without the query). `None` when it names no stored
    /// object: another path, the collection itself, or an empty first segment.
    pub(crate) fn read(path: &'a str) -> Option<Self> {
        [
            (RESPONSES_PATH, IdKind::Response),
            (CONVERSATIONS_PATH, IdKind::Conversation),
        ]
        .into_iter()
        .find_map(|(collection, kind)| {
            let under = path.strip_prefix(collection)?.strip_prefix('/')?;
            let (id, rest) = under.find('/').map_or((under, ""), |at| under.split_at(at));
            (!id.is_empty()).then_some(Self {
                kind,
                collection,
                id,
                rest,
            })
        })
    }

    /// Whether every segment after the id is one plain segment (see
    /// [`is_plain_segment`]), so the path keeps its shape on its way to the engine.
    pub(crate) fn rest_is_plain(&self) -> bool {
        self.rest.is_empty() || self.rest[1..].split('/').all(is_plain_segment)
    }

    /// The same path with `engine_id` in place of the id segment.
    pub(crate) fn with_id(&self, engine_id: &str) -> String {
        let mut path =
            String::with_capacity(self.collection.len() + 1 + engine_id.len() + self.rest.len());
        path.push_str(self.collection);
        path.push('/');
        path.push_str(engine_id);
        path.push_str(self.rest);
        path
    }
}

/// One plain path segment: non-empty, RFC 3986 unreserved characters only (so no `%`,
/// no separator), not `.` and holding no `..`. An engine reads it as itself, whatever
/// its router normalises.
pub(crate) fn is_plain_segment(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    !bytes.is_empty()
        && segment != "."
        && bytes.iter().all(|&b| is_unreserved(b))
        && !bytes.windows(2).any(|pair| pair == b"..")
}

/// A string field of a `POST /v1/responses` body that names stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BodyId {
    /// The field, as the client would name it: `previous_response_id`, `conversation`
    /// or `conversation.id`.
    pub(crate) field: &'static str,
    /// The kind of id the field holds.
    pub(crate) kind: IdKind,
    /// Where the string's content (between its quotes) sits in the body.
    pub(crate) content: Range<usize>,
    /// The decoded string; `None` when it is not valid UTF-8 (a lone surrogate escape),
    /// which no id is.
    pub(crate) text: Option<String>,
}

/// What a `POST /v1/responses` body says about stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyIds {
    /// The string ids it names (none, one, or one of each field). A `null` or a value of
    /// another type names nothing.
    Found(Vec<BodyId>),
    /// A field named twice: `previous_response_id`, `conversation` or `conversation.id`.
    Duplicate(&'static str),
    /// Not a JSON object that could be read to its end: the engine will refuse it.
    Unreadable,
}

impl BodyIds {
    /// Reads the top level of `body` (and a `conversation` object) without building any
    /// value: other values are skipped.
    pub(crate) fn read(body: &[u8]) -> Self {
        match read_ids(body) {
            Ok(Ok(ids)) => Self::Found(ids),
            Ok(Err(field)) => Self::Duplicate(field),
            Err(_) => Self::Unreadable,
        }
    }
}

const PREVIOUS_RESPONSE_ID: &str = "previous_response_id";
const CONVERSATION: &str = "conversation";
const CONVERSATION_ID: &str = "conversation.id";

fn read_ids(body: &[u8]) -> ScanResult<Result<Vec<BodyId>, &'static str>> {
    let mut scanner = Scanner::new(body);
    let mut fields = scanner.begin_object()?;
    let mut ids = Vec::new();
    let (mut previous_seen, mut conversation_seen) = (false, false);
    while let Some(key) = scanner.next_key(&mut fields)? {
        match &*key {
            b"previous_response_id" => {
                if std::mem::replace(&mut previous_seen, true) {
                    return Ok(Err(PREVIOUS_RESPONSE_ID));
                }
                ids.extend(string_id(
                    &mut scanner,
                    PREVIOUS_RESPONSE_ID,
                    IdKind::Response,
                )?);
            }
            b"conversation" => {
                if std::mem::replace(&mut conversation_seen, true) {
                    return Ok(Err(CONVERSATION));
                }
                if scanner.peek_kind()? == Kind::Object {
                    match conversation_object(&mut scanner)? {
                        Ok(id) => ids.extend(id),
                        Err(field) => return Ok(Err(field)),
                    }
                } else {
                    ids.extend(string_id(&mut scanner, CONVERSATION, IdKind::Conversation)?);
                }
            }
            _ => {
                scanner.skip_value()?;
            }
        }
    }
    Ok(Ok(ids))
}

/// The `id` of a `conversation` object; other members are skipped.
fn conversation_object(
    scanner: &mut Scanner<'_>,
) -> ScanResult<Result<Option<BodyId>, &'static str>> {
    let mut fields = scanner.begin_object()?;
    let mut found = None;
    let mut seen = false;
    while let Some(key) = scanner.next_key(&mut fields)? {
        if &*key == b"id" {
            if std::mem::replace(&mut seen, true) {
                return Ok(Err(CONVERSATION_ID));
            }
            found = string_id(scanner, CONVERSATION_ID, IdKind::Conversation)?;
        } else {
            scanner.skip_value()?;
        }
    }
    Ok(Ok(found))
}

/// The next value as an id when it is a string; any other value is skipped.
fn string_id(
    scanner: &mut Scanner<'_>,
    field: &'static str,
    kind: IdKind,
) -> ScanResult<Option<BodyId>> {
    if scanner.peek_kind()? != Kind::String {
        scanner.skip_value()?;
        return Ok(None);
    }
    // `peek_kind` stopped at the opening quote.
    let open = scanner.position();
    let text = scanner.small_string()?;
    let close = scanner.position() - 1;
    Ok(Some(BodyId {
        field,
        kind,
        content: open + 1..close,
        text: String::from_utf8(text.into_owned()).ok(),
    }))
}

/// `body` with each range replaced by its text; ranges in order, not overlapping. Only
/// those bytes change: everything else is copied as it was.
pub(crate) fn splice(body: &Bytes, edits: &[(Range<usize>, &str)]) -> Bytes {
    let grown: usize = edits.iter().map(|(_, text)| text.len()).sum();
    let mut out = BytesMut::with_capacity(body.len() + grown);
    let mut from = 0;
    for (range, text) in edits {
        debug_assert!(from <= range.start && range.start <= range.end);
        out.extend_from_slice(&body[from..range.start]);
        out.extend_from_slice(text.as_bytes());
        from = range.end;
    }
    out.extend_from_slice(&body[from..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_paths_split_into_id_and_rest() {
        let cases = [
            ("/v1/responses/resp_x", IdKind::Response, "resp_x", ""),
            (
                "/v1/responses/resp_x/cancel",
                IdKind::Response,
                "resp_x",
                "/cancel",
            ),
            (
                "/v1/conversations/conv_x/items/msg_1",
                IdKind::Conversation,
                "conv_x",
                "/items/msg_1",
            ),
            ("/v1/responses/resp_x/", IdKind::Response, "resp_x", "/"),
        ];
        for (path, kind, id, rest) in cases {
            let stored = StoredPath::read(path).unwrap();
            assert_eq!(
                (stored.kind, stored.id, stored.rest),
                (kind, id, rest),
                "{path}"
            );
            assert_eq!(stored.with_id(id), path);
        }
        for other in [
            "/v1/responses",
            "/v1/responses/",
            "/v1/responses//x",
            "/v1/responsesX/resp_x",
            "/v1/chat/completions",
            "/V1/responses/resp_x",
            "/v1/conversations",
        ] {
            assert_eq!(StoredPath::read(other), None, "{other}");
        }
    }

    #[test]
    fn only_plain_segments_may_follow_the_id() {
        for plain in [
            "/v1/responses/r",
            "/v1/responses/r/cancel",
            "/v1/conversations/c/items/msg_1.a~b",
        ] {
            assert!(StoredPath::read(plain).unwrap().rest_is_plain(), "{plain}");
        }
        for unsafe_path in [
            "/v1/responses/r/",
            "/v1/responses/r/..",
            "/v1/responses/r/.",
            "/v1/conversations/c/items/a%2Fb",
            "/v1/conversations/c/items/%2e%2e",
            "/v1/conversations/c//items",
            "/v1/conversations/c/items/a..b",
            "/v1/conversations/c/items/a;b",
        ] {
            assert!(
                !StoredPath::read(unsafe_path).unwrap().rest_is_plain(),
                "{unsafe_path}"
            );
        }
    }

    #[test]
    fn the_stored_state_apis_are_the_responses_and_conversations_paths() {
        for yes in [
            "/v1/responses",
            "/v1/responses/x/cancel",
            "/v1/conversations",
            "/v1/conversations/c",
        ] {
            assert!(is_stored_state_api(yes), "{yes}");
        }
        for no in [
            "/v1/responsesx",
            "/v1/chat/completions",
            "/v1/conversation",
            "/",
        ] {
            assert!(!is_stored_state_api(no), "{no}");
        }
    }

    fn ids(body: &str) -> Vec<(&'static str, String)> {
        let BodyIds::Found(found) = BodyIds::read(body.as_bytes()) else {
            panic!("{body}");
        };
        found
            .into_iter()
            .map(|id| {
                assert_eq!(&body[id.content.clone()].len(), &id.content.len());
                (id.field, id.text.unwrap())
            })
            .collect()
    }

    #[test]
    fn body_ids_are_found_in_any_order_and_shape() {
        assert_eq!(
            ids(r#"{"model":"m","previous_response_id":"resp_a","input":"hi"}"#),
            [("previous_response_id", "resp_a".to_owned())]
        );
        assert_eq!(
            ids(r#"{"conversation":"conv_a","model":"m"}"#),
            [("conversation", "conv_a".to_owned())]
        );
        assert_eq!(
            ids(r#"{"input":[{"id":"x"}],"conversation":{"meta":{"id":"no"},"id":"conv_\u0061"}}"#),
            [("conversation.id", "conv_a".to_owned())]
        );
        assert_eq!(
            ids(r#"{"previous\u005fresponse_id":"resp_a"}"#),
            [("previous_response_id", "resp_a".to_owned())]
        );
        assert_eq!(
            ids(r#"{"previous_response_id":null,"conversation":7,"model":"m"}"#),
            []
        );
        assert_eq!(ids(r#"{"conversation":{"id":null}}"#), []);
    }

    #[test]
    fn the_content_range_covers_the_string_between_its_quotes() {
        let body = r#"{ "previous_response_id" :  "resp_a\u002eb" }"#;
        let BodyIds::Found(found) = BodyIds::read(body.as_bytes()) else {
            panic!();
        };
        assert_eq!(&body[found[0].content.clone()], r"resp_a\u002eb");
        assert_eq!(found[0].text.as_deref(), Some("resp_a.b"));
    }

    #[test]
    fn a_field_named_twice_is_a_duplicate() {
        for (body, field) in [
            (
                r#"{"previous_response_id":"a","previous_response_id":"b"}"#,
                "previous_response_id",
            ),
            (
                r#"{"conversation":"a","x":1,"conversation":{"id":"b"}}"#,
                "conversation",
            ),
            (r#"{"conversation":{"id":"a","id":"b"}}"#, "conversation.id"),
        ] {
            assert_eq!(
                BodyIds::read(body.as_bytes()),
                BodyIds::Duplicate(field),
                "{body}"
            );
        }
    }

    #[test]
    fn a_body_that_is_not_a_readable_object_is_unreadable() {
        for body in [
            "",
            "[]",
            "\"resp_a\"",
            r#"{"previous_response_id":"resp_a""#,
            r#"{"a":}"#,
        ] {
            assert_eq!(
                BodyIds::read(body.as_bytes()),
                BodyIds::Unreadable,
                "{body}"
            );
        }
    }

    #[test]
    fn splicing_changes_only_the_given_ranges() {
        let body = Bytes::from_static(b"0123456789");
        assert_eq!(
            splice(&body, &[(1..3, "ab"), (5..5, "+"), (8..10, "")]),
            "0ab34+567"
        );
        assert_eq!(splice(&body, &[]), body);
    }
}
