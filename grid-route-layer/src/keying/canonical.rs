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

/// Writes the canonical form of the value at `span`, or the digest of its raw bytes when it
/// is over the limit. `drop_key_at_depth_1` names a key left out of each object directly
/// inside the value (Anthropic tool definitions' `cache_control`).
pub(crate) fn json_value(
    seed: &KeySeed,
    buf: &[u8],
    span: Span,
    drop_key_at_depth_1: Option<&[u8]>,
    out: &mut impl TextSink,
) -> ScanResult<()> {
    if span.len() > CANONICAL_LIMIT_BYTES {
        digest(out, Marker::RawDigest, seed.raw_digest(&buf[span.range()]));
        return Ok(());
    }
    let mut s = Scanner::at(buf, span);
    Canonical {
        drop_key_at_depth_1,
    }
    .value(&mut s, 0, out)
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
        return json_value(seed, buf, span, None, out);
    }
    if span.len() > CANONICAL_LIMIT_BYTES {
        digest(out, Marker::RawDigest, seed.raw_digest(&buf[span.range()]));
        return Ok(());
    }
    let mut text = OwnedText(Vec::new());
    s.string(&mut text)?;
    let text = text.0;
    let mut canonical = OwnedText(Vec::new());
    let mut inner = Scanner::new(&text);
    let parsed = Canonical {
        drop_key_at_depth_1: None,
    }
    .value(&mut inner, 0, &mut canonical)
    .and_then(|()| inner.finish());
    if parsed.is_ok() {
        out.text(&canonical.0);
    } else {
        marker(out, Marker::Text);
        out.text(&text);
    }
    Ok(())
}

struct Canonical<'a> {
    drop_key_at_depth_1: Option<&'a [u8]>,
}

impl Canonical<'_> {
    fn value(&self, s: &mut Scanner<'_>, depth: usize, out: &mut impl TextSink) -> ScanResult<()> {
        if depth > MAX_DEPTH {
            return Err(Unreadable {
                offset: 0,
                expected: "JSON nested at most 64 deep",
            });
        }
        match s.peek_kind()? {
            Kind::Object => {
                // Each value is rendered once, into one buffer, then the entries are
                // written in key order.
                let mut rendered = OwnedText(Vec::new());
                let mut entries = Vec::new();
                let mut fields = s.begin_object()?;
                while let Some(key) = s.next_key(&mut fields)? {
                    if depth == 1 && self.drop_key_at_depth_1 == Some(&*key) {
                        s.skip_value()?;
                        continue;
                    }
                    let start = rendered.0.len();
                    self.value(s, depth + 1, &mut rendered)?;
                    entries.push((key, start..rendered.0.len()));
                }
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                marker(out, Marker::Object);
                for (key, range) in entries {
                    marker(out, Marker::Key);
                    out.text(&key);
                    out.text(&rendered.0[range]);
                }
                marker(out, Marker::ObjectEnd);
            }
            Kind::Array => {
                marker(out, Marker::Array);
                let mut items = s.begin_array()?;
                while s.next_item(&mut items)? {
                    self.value(s, depth + 1, out)?;
                }
                marker(out, Marker::ArrayEnd);
            }
            Kind::String => {
                marker(out, Marker::String);
                s.string(out)?;
            }
            Kind::Number => {
                marker(out, Marker::Number);
                out.text(s.number()?);
            }
            Kind::Bool => marker(
                out,
                if s.boolean()? {
                    Marker::True
                } else {
                    Marker::False
                },
            ),
            Kind::Null => {
                s.null()?;
                marker(out, Marker::Null);
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
        let span = Span {
            start: 0,
            end: json.len(),
        };
        json_value(seed, json.as_bytes(), span, None, &mut out).unwrap();
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
