//! Pieces shared by the four request formats: reading an object's fields in one pass,
//! messages, text and media parts.

use std::borrow::Cow;

use super::keys::NoKeys;
use super::scan::{Kind, Scanner, Span, TextSink};
use super::stream::{KeySeed, Marker, digest, marker};

/// Where a field of an object was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Absent,
    At(Span),
    /// The field was read as it was met (it arrived in canonical order).
    Streamed,
}

/// The fields of one object that a format reads, found in one pass.
pub(crate) struct Found<const N: usize> {
    slots: [Slot; N],
}

impl<const N: usize> Found<N> {
    /// Where field `i` is, when it was given, not null, and not already read.
    pub(crate) fn span(&self, i: usize) -> Option<Span> {
        match self.slots[i] {
            Slot::At(span) => Some(span),
            _ => None,
        }
    }

    pub(crate) fn seen(&self, i: usize) -> bool {
        self.slots[i] != Slot::Absent
    }

    pub(crate) fn streamed(&self, i: usize) -> bool {
        self.slots[i] == Slot::Streamed
    }

    /// Field `i` decoded as a short string (a type or a role); `None` when absent or not
    /// a string.
    pub(crate) fn small_string<'a>(&self, buf: &'a [u8], i: usize) -> Option<Cow<'a, [u8]>> {
        let span = self.span(i)?;
        Scanner::at(buf, span).small_string().ok()
    }
}

/// Reads one object, noting where each field in `names` is. Each named field is first
/// offered to `stream` with what was found so far; when `stream` returns `true` it has
/// read the value itself. This lets the common field order (role before content, type
/// before text) be read in a single pass while any other order is still read correctly,
/// from the recorded spans, afterwards.
///
/// Null values count as absent. A named field given twice makes the body unreadable for
/// keying rather than guessing which one the engine will use.
pub(crate) fn read_object<'a, const N: usize>(
    s: &mut Scanner<'a>,
    names: [&[u8]; N],
    mut stream: impl FnMut(usize, &Found<N>, &mut Scanner<'a>) -> Result<bool, NoKeys>,
) -> Result<Found<N>, NoKeys> {
    let mut found = Found {
        slots: [Slot::Absent; N],
    };
    let mut fields = s.begin_object()?;
    while let Some(key) = s.next_key(&mut fields)? {
        let Some(i) = names.iter().position(|name| **name == *key) else {
            s.skip_value()?;
            continue;
        };
        if s.null()? {
            continue;
        }
        if found.slots[i] != Slot::Absent {
            return Err(NoKeys::unreadable("each field of an object at most once"));
        }
        found.slots[i] = if stream(i, &found, s)? {
            Slot::Streamed
        } else {
            Slot::At(s.skip_value()?)
        };
    }
    Ok(found)
}

/// Starts a message: the marker, then the role's text (a message without a role has none).
pub(crate) fn open_message(
    buf: &[u8],
    role: Option<Span>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marker(out, Marker::Message);
    if let Some(role) = role {
        string(&mut Scanner::at(buf, role), out)?;
    }
    Ok(())
}

/// Writes a string value's decoded text; any other value makes the body unreadable.
pub(crate) fn string(s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    if s.peek_kind()? != Kind::String {
        return Err(NoKeys::unreadable("a string"));
    }
    s.string(out)?;
    Ok(())
}

/// Writes a marker and then the string at `span`.
pub(crate) fn marked_string(
    buf: &[u8],
    marker_: Marker,
    span: Span,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marker(out, marker_);
    string(&mut Scanner::at(buf, span), out)
}

/// Writes a media part as its kind and one fixed-size digest: of the part's `uuid` when it
/// has one (vLLM's stable media id), else of its source. The source is a string (a URL, a
/// data URL, a file id) or an object holding one under the first of `nested` that is
/// present; any other shape is digested as sent. So an inline 4 MiB image costs the same
/// ten stream bytes as a URL.
pub(crate) fn media(
    seed: &KeySeed,
    buf: &[u8],
    kind: Marker,
    uuid: Option<Span>,
    source: Option<Span>,
    nested: &[&[u8]],
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marker(out, kind);
    if let Some(uuid) = uuid {
        let mut sink = seed.text_digest();
        string(&mut Scanner::at(buf, uuid), &mut sink)?;
        digest(out, Marker::ByUuid, sink.finish());
        return Ok(());
    }
    let Some(source) = source else {
        return Err(NoKeys::unreadable("a media part with its source"));
    };
    let text = match Scanner::at(buf, source).peek_kind()? {
        Kind::String => Some(source),
        Kind::Object => nested_string(buf, source, nested)?,
        _ => None,
    };
    let value = match text {
        Some(span) => {
            let mut sink = seed.text_digest();
            Scanner::at(buf, span).string(&mut sink)?;
            sink.finish()
        }
        None => seed.raw_digest(&buf[source.range()]),
    };
    digest(out, Marker::ByContent, value);
    Ok(())
}

/// The first of `names` that the object at `span` holds as a string.
fn nested_string(buf: &[u8], span: Span, names: &[&[u8]]) -> Result<Option<Span>, NoKeys> {
    let mut best: Option<(usize, Span)> = None;
    let mut s = Scanner::at(buf, span);
    let mut fields = s.begin_object()?;
    while let Some(key) = s.next_key(&mut fields)? {
        let is_string = s.peek_kind()? == Kind::String;
        let value = s.skip_value()?;
        if let Some(rank) = names.iter().position(|name| **name == *key)
            && is_string
            && best.is_none_or(|(r, _)| rank < r)
        {
            best = Some((rank, value));
        }
    }
    Ok(best.map(|(_, span)| span))
}

/// A reason naming an unknown `type` value. The name is clipped: it is client text.
pub(crate) fn unknown(place: &'static str, name: Option<&[u8]>) -> NoKeys {
    const SHOWN: usize = 40;
    let name = name.unwrap_or_default();
    let name = String::from_utf8_lossy(&name[..name.len().min(SHOWN)]).into_owned();
    NoKeys::UnknownType {
        place,
        name: name.into(),
    }
}
