//! Canonical JSON: object keys sorted recursively, so key order never changes a key.
//!
//! Values are written as stream tokens (markers, decoded key and string text, number text)
//! rather than as JSON text; the tokens are unambiguous for the same reason the rest of
//! the stream is. A value whose raw size is over [`CANONICAL_LIMIT_BYTES`] is not sorted:
//! its bytes as sent are digested, which bounds the memory and time any one value costs.

use super::scan::{Kind, OwnedText, ScanResult, Scanner, Span, TextSink, Unreadable};
use super::stream::{KeySeed, Marker, digest, marker};

/// Values over this raw size are keyed by a digest of their bytes, not canonicalised.
pub const CANONICAL_LIMIT_BYTES: usize = 16 * 1024;

/// Deepest nesting canonicalised; deeper values are unreadable for keying.
const MAX_DEPTH: usize = 64;

/// Writes the canonical form of the value at the scanner, or the digest of its raw bytes
/// when it is over the limit, and moves past it. `drop_key_at_depth_1` names a key left out
/// of each object directly inside the value (Anthropic tool definitions' `cache_control`).
///
/// The value is read once: canonicalising stops as soon as it runs past the limit, and
/// only then is the value skipped again to digest its bytes.
pub(crate) fn json_value(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    drop_key_at_depth_1: Option<&[u8]>,
    out: &mut impl TextSink,
) -> ScanResult<()> {
    s.peek_kind()?;
    let start = s.position();
    let mut canonical = Canonical::new(drop_key_at_depth_1, start + CANONICAL_LIMIT_BYTES);
    match canonical.value(s, 0) {
        Ok(()) if s.position() - start <= CANONICAL_LIMIT_BYTES => {
            out.text(&canonical.arena.0);
            Ok(())
        }
        Ok(()) | Err(Stop::TooLarge) => {
            s.seek(start);
            let span = s.skip_value()?;
            digest(
                out,
                Marker::RawDigest,
                seed.raw_digest(&s.buf()[span.range()]),
            );
            Ok(())
        }
        Err(Stop::Unreadable(unreadable)) => Err(unreadable),
    }
}

/// Writes tool-call arguments: the canonical form of the JSON a string holds, the string's
/// text when it holds no JSON, or the digest of the raw string when it is over the limit.
pub(crate) fn arguments(
    seed: &KeySeed,
    buf: &[u8],
    span: Span,
    out: &mut impl TextSink,
) -> ScanResult<()> {
    let mut s = Scanner::at(buf, span);
    if s.peek_kind()? != Kind::String {
        // Some clients send the arguments as an object rather than a string.
        return json_value(seed, &mut s, None, out);
    }
    if span.len() > CANONICAL_LIMIT_BYTES {
        digest(out, Marker::RawDigest, seed.raw_digest(&buf[span.range()]));
        return Ok(());
    }
    let mut text = OwnedText(Vec::with_capacity(span.len()));
    s.string(&mut text)?;
    let text = text.0;
    let mut canonical = Canonical::new(None, usize::MAX);
    let mut inner = Scanner::new(&text);
    let parsed = canonical
        .value(&mut inner, 0)
        .and_then(|()| inner.finish().map_err(Stop::Unreadable));
    if parsed.is_ok() {
        out.text(&canonical.arena.0);
    } else {
        marker(out, Marker::Text);
        out.text(&text);
    }
    Ok(())
}

/// Renders canonical JSON into one arena: an object's entries are rendered in the order
/// they come, then copied out in key order to the end of the arena and moved down over the
/// unsorted copies. One buffer (and one entry list) serves the whole value.
struct Canonical<'k> {
    drop_key_at_depth_1: Option<&'k [u8]>,
    /// Position in the input past which the value is over the limit.
    limit_end: usize,
    arena: OwnedText,
}

/// Why canonicalising stopped.
enum Stop {
    Unreadable(Unreadable),
    /// The value runs past the canonical limit: it is digested as sent instead.
    TooLarge,
}

impl From<Unreadable> for Stop {
    fn from(unreadable: Unreadable) -> Self {
        Stop::Unreadable(unreadable)
    }
}

impl<'k> Canonical<'k> {
    fn new(drop_key_at_depth_1: Option<&'k [u8]>, limit_end: usize) -> Self {
        Self {
            drop_key_at_depth_1,
            limit_end,
            arena: OwnedText(Vec::with_capacity(1024)),
        }
    }

    fn value(&mut self, s: &mut Scanner<'_>, depth: usize) -> Result<(), Stop> {
        if s.position() > self.limit_end {
            return Err(Stop::TooLarge);
        }
        if depth > MAX_DEPTH {
            return Err(Stop::Unreadable(Unreadable {
                offset: s.position(),
                expected: "JSON nested at most 64 deep",
            }));
        }
        match s.peek_kind()? {
            Kind::Object => {
                let start = self.arena.0.len();
                let mut entries = Vec::new();
                let mut fields = s.begin_object()?;
                while let Some(key) = s.next_key(&mut fields)? {
                    if depth == 1 && self.drop_key_at_depth_1 == Some(&*key) {
                        s.skip_value()?;
                        continue;
                    }
                    let value_start = self.arena.0.len();
                    self.value(s, depth + 1)?;
                    entries.push((key, value_start..self.arena.0.len()));
                }
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let unsorted_end = self.arena.0.len();
                marker(&mut self.arena, Marker::Object);
                for (key, range) in entries {
                    marker(&mut self.arena, Marker::Key);
                    self.arena.0.extend_from_slice(&key);
                    self.arena.0.extend_from_within(range);
                }
                marker(&mut self.arena, Marker::ObjectEnd);
                let sorted_len = self.arena.0.len() - unsorted_end;
                self.arena.0.copy_within(unsorted_end.., start);
                self.arena.0.truncate(start + sorted_len);
            }
            Kind::Array => {
                marker(&mut self.arena, Marker::Array);
                let mut items = s.begin_array()?;
                while s.next_item(&mut items)? {
                    self.value(s, depth + 1)?;
                }
                marker(&mut self.arena, Marker::ArrayEnd);
            }
            Kind::String => {
                marker(&mut self.arena, Marker::String);
                s.string(&mut self.arena)?;
            }
            Kind::Number => {
                marker(&mut self.arena, Marker::Number);
                self.arena.0.extend_from_slice(s.number()?);
            }
            Kind::Bool => {
                let value = if s.boolean()? {
                    Marker::True
                } else {
                    Marker::False
                };
                marker(&mut self.arena, value);
            }
            Kind::Null => {
                s.null()?;
                marker(&mut self.arena, Marker::Null);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(seed: &KeySeed, json: &str) -> Vec<u8> {
        let mut out = OwnedText(Vec::new());
        json_value(seed, &mut Scanner::new(json.as_bytes()), None, &mut out).unwrap();
        out.0
    }

    fn args(seed: &KeySeed, json: &str) -> Vec<u8> {
        let mut out = OwnedText(Vec::new());
        let span = Span {
            start: 0,
            end: json.len(),
        };
        arguments(seed, json.as_bytes(), span, &mut out).unwrap();
        out.0
    }

    #[test]
    fn object_key_order_does_not_change_the_canonical_form() {
        let seed = KeySeed::random();
        assert_eq!(
            canonical(&seed, r#"{"b":{"y":1,"x":[true,null]},"a":"\u00e9"}"#),
            canonical(
                &seed,
                r#"{ "a" : "é", "b" : { "x" : [ true , null ] , "y" : 1 } }"#
            ),
        );
        assert_ne!(
            canonical(&seed, r#"{"a":1}"#),
            canonical(&seed, r#"{"a":"1"}"#)
        );
    }

    #[test]
    fn argument_strings_holding_json_are_canonicalised() {
        let seed = KeySeed::random();
        assert_eq!(
            args(&seed, r#""{\"a\":1,\"b\":2}""#),
            args(&seed, r#""{ \"b\": 2, \"a\": 1 }""#)
        );
        // Text that is not JSON keys as text, and differs from any JSON form.
        assert_ne!(args(&seed, r#""{\"a\":1"}"#), args(&seed, r#""{\"a\":1}""#));
        assert_ne!(args(&seed, r#""{} trailing""#), args(&seed, r#""{}""#));
    }

    #[test]
    fn values_over_16_kib_are_digested_as_sent() {
        let seed = KeySeed::random();
        let big = |order_ab: bool| {
            let pad = "x".repeat(CANONICAL_LIMIT_BYTES);
            if order_ab {
                format!(r#"{{"a":1,"b":"{pad}"}}"#)
            } else {
                format!(r#"{{"b":"{pad}","a":1}}"#)
            }
        };
        let (ab, ba) = (canonical(&seed, &big(true)), canonical(&seed, &big(false)));
        assert_eq!(ab.len(), 10, "a marker and an 8-byte digest");
        assert_ne!(ab, ba, "over the limit, bytes as sent count");
    }
}
