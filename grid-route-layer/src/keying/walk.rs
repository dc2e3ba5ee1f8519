//! Pieces shared by the four request formats: reading an object's fields in one pass,
//! deferring what arrives before its place in the stream, messages, text and media.

use std::borrow::Cow;

use super::keys::NoKeys;
use super::scan::{Kind, Scanner, Span, TextSink};
use super::stream::{KeySeed, Marker, digest, marker};

/// Where a field of an object was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Absent,
    At(Span),
    /// The field's value was consumed as it was met.
    Taken,
}

/// The fields of one object that a format reads, found in one pass.
pub(crate) struct Found<const N: usize> {
    slots: [Slot; N],
}

impl<const N: usize> Found<N> {
    /// Where field `i` is, when it was given, not null, and not taken as it was met.
    pub(crate) fn span(&self, i: usize) -> Option<Span> {
        match self.slots[i] {
            Slot::At(span) => Some(span),
            _ => None,
        }
    }

    pub(crate) fn seen(&self, i: usize) -> bool {
        self.slots[i] != Slot::Absent
    }

    /// Field `i` decoded as a short string (a type or a role); `None` when absent or not
    /// a string.
    pub(crate) fn small_string<'a>(&self, buf: &'a [u8], i: usize) -> Option<Cow<'a, [u8]>> {
        let span = self.span(i)?;
        Scanner::at(buf, span).small_string().ok()
    }
}

/// Reads one object, noting where each field in `names` is. Each named field is first
/// offered to `take` with what was found so far; when `take` returns `true` it consumed the
/// value itself (streamed it, deferred it or digested it), otherwise its span is kept for
/// later. So every value is read once, whatever the field order.
///
/// Null values count as absent. A named field given twice makes the body unreadable for
/// keying rather than guessing which one the engine will use.
pub(crate) fn read_object<'a, const N: usize>(
    s: &mut Scanner<'a>,
    names: [&[u8]; N],
    mut take: impl FnMut(usize, &Found<N>, &mut Scanner<'a>) -> Result<bool, NoKeys>,
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
        found.slots[i] = if take(i, &found, s)? {
            Slot::Taken
        } else {
            Slot::At(s.skip_value()?)
        };
    }
    Ok(found)
}

/// Size of the deferred buffer's chunks once it has grown.
const DEFERRED_CHUNK_BYTES: usize = 32 * 1024;

/// Canonical bytes rendered before their place in the stream is reached, e.g. a message's
/// content met before its role. Keeping the rendering instead of re-reading the value later
/// reads every byte of the body once. Chunks never reallocate, so a deferred value costs
/// its own size plus at most one chunk.
#[derive(Default)]
pub(crate) struct Deferred {
    chunks: Vec<Vec<u8>>,
}

impl Deferred {
    pub(crate) fn write_to(&self, out: &mut impl TextSink) {
        for chunk in &self.chunks {
            out.text(chunk);
        }
    }
}

impl TextSink for Deferred {
    fn text(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.chunks.last().map_or(0, |c| c.capacity() - c.len());
            if room == 0 {
                let grown = self.chunks.last().map_or(256, |c| c.capacity() * 2);
                let capacity =
                    grown.clamp(bytes.len().min(DEFERRED_CHUNK_BYTES), DEFERRED_CHUNK_BYTES);
                self.chunks.push(Vec::with_capacity(capacity));
                continue;
            }
            let take = room.min(bytes.len());
            if let Some(chunk) = self.chunks.last_mut() {
                chunk.extend_from_slice(&bytes[..take]);
            }
            bytes = &bytes[take..];
        }
    }
}

/// A value rendered ahead of its place, or why it gets no keys.
///
/// The reason is kept, not raised: the object's type, read later, may make the value
/// irrelevant (reasoning content, say). Unreadable JSON is raised at once.
pub(crate) type Rendered = Result<Deferred, NoKeys>;

/// Renders the value at the scanner into a [`Deferred`] buffer.
pub(crate) fn defer<'a>(
    s: &mut Scanner<'a>,
    render: impl FnOnce(&mut Scanner<'a>, &mut Deferred) -> Result<(), NoKeys>,
) -> Result<Rendered, NoKeys> {
    let start = s.position();
    let mut deferred = Deferred::default();
    match render(s, &mut deferred) {
        Ok(()) => Ok(Ok(deferred)),
        Err(unreadable @ NoKeys::Unreadable { .. }) => Err(unreadable),
        Err(reason) => {
            s.seek(start);
            s.skip_value()?;
            Ok(Err(reason))
        }
    }
}

/// Writes a deferred rendering, or raises why it has no keys.
pub(crate) fn write_rendered(rendered: Rendered, out: &mut impl TextSink) -> Result<(), NoKeys> {
    rendered?.write_to(out);
    Ok(())
}

/// Where a message's `role` is among the fields [`message`] reads: first.
pub(crate) const ROLE: usize = 0;

/// Reads one message object whose first two `names` are its role and its content, and
/// writes the message's start: the role, then the content — streamed by `stream` when the
/// role came first, else rendered aside by `render` and written once the role is known.
/// Returns where the other named fields are, for the caller to write after the content.
pub(crate) fn message<'a, const N: usize, S: TextSink>(
    s: &mut Scanner<'a>,
    names: [&[u8]; N],
    out: &mut S,
    mut stream: impl FnMut(&mut Scanner<'a>, &mut S) -> Result<(), NoKeys>,
    mut render: impl FnMut(&mut Scanner<'a>, &mut Deferred) -> Result<(), NoKeys>,
) -> Result<Found<N>, NoKeys> {
    const CONTENT: usize = 1;
    let buf = s.buf();
    let mut early: Option<Rendered> = None;
    let found = read_object(s, names, |i, found: &Found<N>, s| {
        if i != CONTENT {
            return Ok(false);
        }
        if found.seen(ROLE) {
            open_message(buf, found.span(ROLE), out)?;
            stream(s, out)?;
        } else {
            early = Some(defer(s, |s, d| render(s, d))?);
        }
        Ok(true)
    })?;
    if !found.seen(CONTENT) || early.is_some() {
        open_message(buf, found.span(ROLE), out)?;
        if let Some(rendered) = early {
            write_rendered(rendered, out)?;
        }
    }
    Ok(found)
}

/// Whether field `role` of a message `found` in `buf` makes it the model's side of a
/// conversation: its answer (`assistant`), or a tool's result answering its call (Chat's
/// `tool` and `function`). A prompt holding one continues a conversation.
pub(crate) fn is_answer<const N: usize>(buf: &[u8], found: &Found<N>, role: usize) -> bool {
    matches!(
        found.small_string(buf, role).as_deref(),
        Some(b"assistant" | b"tool" | b"function")
    )
}

/// Whether a message is the model's own: role `assistant` (a tool's result, though it
/// answers the model, is the client's).
pub(crate) fn is_models<const N: usize>(buf: &[u8], found: &Found<N>, role: usize) -> bool {
    found.small_string(buf, role).as_deref() == Some(b"assistant")
}

/// Message content: a string, which keys like one text part holding it, or an array whose
/// elements `part` reads (parts, blocks: each format has its own).
pub(crate) fn content<'a, S: TextSink>(
    s: &mut Scanner<'a>,
    out: &mut S,
    mut part: impl FnMut(&mut Scanner<'a>, &mut S) -> Result<(), NoKeys>,
) -> Result<(), NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Text);
            s.string(out)?;
        }
        Kind::Array => {
            let mut items = s.begin_array()?;
            while s.next_item(&mut items)? {
                part(s, out)?;
            }
        }
        _ => return Err(NoKeys::unreadable("a string or an array as content")),
    }
    Ok(())
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

/// Writes a marker and then the string at the scanner.
pub(crate) fn marked(
    s: &mut Scanner<'_>,
    marker_: Marker,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marker(out, marker_);
    string(s, out)
}

/// Writes a marker and then the string at `span`.
pub(crate) fn marked_string(
    buf: &[u8],
    marker_: Marker,
    span: Span,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marked(&mut Scanner::at(buf, span), marker_, out)
}

/// The digest of a media source at the scanner: a string (a URL, a data URL, a file id)
/// or an object holding one under one of `nested` (the earliest name in `nested` wins,
/// whatever the field order); any other shape is digested as sent. The text is decoded
/// and digested as it is read, so an inline 4 MiB image is read once.
pub(crate) fn media_digest(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    nested: &[&[u8]],
) -> Result<u64, NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            let mut sink = seed.text_digest();
            s.string(&mut sink)?;
            Ok(sink.finish())
        }
        Kind::Object => {
            let start = s.position();
            let mut best: Option<(usize, u64)> = None;
            let mut fields = s.begin_object()?;
            while let Some(key) = s.next_key(&mut fields)? {
                let rank = nested.iter().position(|name| **name == *key);
                match rank {
                    Some(rank)
                        if s.peek_kind()? == Kind::String && best.is_none_or(|(r, _)| rank < r) =>
                    {
                        let mut sink = seed.text_digest();
                        s.string(&mut sink)?;
                        best = Some((rank, sink.finish()));
                    }
                    _ => {
                        s.skip_value()?;
                    }
                }
            }
            Ok(best.map_or_else(
                || seed.raw_digest(&s.buf()[start..s.position()]),
                |(_, d)| d,
            ))
        }
        _ => {
            let span = s.skip_value()?;
            Ok(seed.raw_digest(&s.buf()[span.range()]))
        }
    }
}

/// Writes a media part as its kind and one fixed-size digest: of the part's `uuid` when it
/// has one (vLLM's stable media id), else of its source. So an inline 4 MiB image costs the
/// same ten stream bytes as a URL.
pub(crate) fn media(
    seed: &KeySeed,
    buf: &[u8],
    kind: Marker,
    uuid: Option<Span>,
    source: Option<u64>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    marker(out, kind);
    if let Some(uuid) = uuid {
        let mut sink = seed.text_digest();
        string(&mut Scanner::at(buf, uuid), &mut sink)?;
        digest(out, Marker::ByUuid, sink.finish());
        return Ok(());
    }
    let source = source.ok_or(NoKeys::unreadable("a media part with its source"))?;
    digest(out, Marker::ByContent, source);
    Ok(())
}

/// A reason naming an unknown `type` value. The name is client text, which may be logged
/// (at `debug`): it is shown only when it reads as a type name, at most 40 ASCII letters,
/// digits and `_ - . /`, and otherwise as its length alone, so no prose can reach a log
/// through it.
pub(crate) fn unknown(place: &'static str, name: Option<&[u8]>) -> NoKeys {
    const SHOWN: usize = 40;
    let name = name.unwrap_or_default();
    let type_name = name.len() <= SHOWN
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
    let name = if type_name {
        String::from_utf8_lossy(name).into_owned()
    } else {
        format!("({} bytes, not a type name)", name.len())
    };
    NoKeys::UnknownType {
        place,
        name: name.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_type_is_named_only_when_it_reads_as_a_type_name() {
        let shown = |name: &[u8]| unknown("content part", Some(name)).to_string();
        assert_eq!(
            shown(b"input_audio"),
            r#"unknown content part type "input_audio""#
        );
        assert_eq!(
            shown(b"my secret prompt text"),
            r#"unknown content part type "(21 bytes, not a type name)""#
        );
        assert_eq!(
            shown(&[b'a'; 41]),
            r#"unknown content part type "(41 bytes, not a type name)""#
        );
        assert_eq!(
            unknown("input item", None).to_string(),
            r#"unknown input item type """#
        );
    }

    #[test]
    fn deferred_text_reads_back_whole_whatever_the_run_sizes() {
        let text: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut deferred = Deferred::default();
        for run in text.chunks(997) {
            deferred.text(run);
        }
        let mut back = super::super::scan::OwnedText(Vec::new());
        deferred.write_to(&mut back);
        assert_eq!(back.0, text);
        let capacity: usize = deferred.chunks.iter().map(Vec::capacity).sum();
        assert!(capacity <= text.len() + DEFERRED_CHUNK_BYTES, "{capacity}");
    }
}
