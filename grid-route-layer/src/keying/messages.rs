//! Anthropic Messages `messages` and `system`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{
    self, Found, Rendered, defer, marked, marked_string, media, media_digest, read_object, unknown,
    write_rendered,
};

/// Writes each message: its role, then its content (rendered aside when it comes first).
///
/// Returns whether the messages open a conversation: none has the role `assistant`.
pub(super) fn messages(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<bool, NoKeys> {
    let buf = s.buf();
    let mut opens = true;
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        out.turn_starts();
        let found = walk::message(
            s,
            [b"role", b"content"],
            out,
            |s, out| content(seed, s, out),
            |s, d| content(seed, s, d),
        )?;
        opens &= !walk::is_answer(buf, &found, walk::ROLE);
        out.turn_ends(walk::is_models(buf, &found, walk::ROLE));
    }
    Ok(opens)
}

/// The top-level `system`, when it is an array: text blocks only.
pub(super) fn system_blocks(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    if s.peek_kind()? != Kind::Array {
        return Err(NoKeys::unreadable(
            "a string or an array of text blocks as system",
        ));
    }
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        if block(seed, s, out)? != BlockKind::Text {
            return Err(NoKeys::UnknownType {
                place: "system block",
                name: "(not text)".into(),
            });
        }
    }
    Ok(())
}

/// A string, or an array of content blocks; a string keys like one text part holding it.
fn content(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    walk::content(s, out, |s, out| block(seed, s, out).map(drop))
}

const TYPE: usize = 0;
const TEXT: usize = 1;
const SOURCE: usize = 2;
const NAME: usize = 3;
const INPUT: usize = 4;
const RESULT: usize = 5;
const IS_ERROR: usize = 6;
const UUID: usize = 7;
const BLOCK_FIELDS: [&[u8]; 8] = [
    b"type",
    b"text",
    b"source",
    b"name",
    b"input",
    b"content",
    b"is_error",
    b"uuid",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Text,
    Other,
}

/// One content block. `thinking` and `redacted_thinking` blocks are ignored, as are ids
/// (`id`, `tool_use_id`), `cache_control` and `citations`.
///
/// A `tool_result` is framed as the result marker, its content (a string or blocks), then
/// an error marker when `is_error` is true, so a failed and a successful result with the
/// same text key apart.
fn block(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<BlockKind, NoKeys> {
    let buf = s.buf();
    let mut early: Option<Rendered> = None;
    let mut source = None;
    let found = read_object(s, BLOCK_FIELDS, |i, found: &Found<8>, s| {
        let kind = found.small_string(buf, TYPE);
        match (i, kind.as_deref()) {
            (TEXT, Some(b"text")) => marked(s, Marker::Text, out)?,
            (TEXT, None) => early = Some(defer(s, |s, d| marked(s, Marker::Text, d))?),
            (RESULT, Some(b"tool_result")) => {
                marker(out, Marker::ToolResult);
                content(seed, s, out)?;
            }
            (RESULT, None) => {
                early = Some(defer(s, |s, d| {
                    marker(d, Marker::ToolResult);
                    content(seed, s, d)
                })?);
            }
            (SOURCE, _) => source = Some(media_digest(seed, s, &[b"data", b"url", b"file_id"])?),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let kind = found.small_string(buf, TYPE);
    let write_early = |early: Option<Rendered>, out: &mut _, what| match early {
        Some(rendered) => write_rendered(rendered, out),
        None if found.seen(what) => Ok(()),
        None => Err(NoKeys::unreadable("a text block's text")),
    };
    match kind.as_deref() {
        Some(b"text") => {
            write_early(early, out, TEXT)?;
            return Ok(BlockKind::Text);
        }
        Some(b"image") => media(seed, buf, Marker::Image, found.span(UUID), source, out)?,
        Some(b"document") => media(seed, buf, Marker::Document, found.span(UUID), source, out)?,
        Some(b"tool_use") => {
            let name = found
                .span(NAME)
                .ok_or(NoKeys::unreadable("a tool_use name"))?;
            marked_string(buf, Marker::ToolCall, name, out)?;
            marker(out, Marker::Arguments);
            if let Some(input) = found.span(INPUT) {
                canonical::json_value(seed, &mut Scanner::at(buf, input), None, out)?;
            }
        }
        Some(b"tool_result") => {
            if found.seen(RESULT) {
                write_early(early, out, RESULT)?;
            } else {
                marker(out, Marker::ToolResult);
            }
            if let Some(span) = found.span(IS_ERROR)
                && Scanner::at(buf, span).boolean()?
            {
                marker(out, Marker::ToolError);
            }
        }
        Some(b"thinking" | b"redacted_thinking") => {}
        other => return Err(unknown("content block", other)),
    }
    Ok(BlockKind::Other)
}
