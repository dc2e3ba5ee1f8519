//! Anthropic Messages `messages` and `system`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{Found, marked_string, media, open_message, read_object, unknown};

const ROLE: usize = 0;
const CONTENT: usize = 1;

/// Writes each message: its role, then its content.
pub(super) fn messages(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    let buf = s.buf();
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        let found = read_object(s, [b"role", b"content"], |i, found: &Found<2>, s| {
            if i == CONTENT && found.seen(ROLE) {
                open_message(buf, found.span(ROLE), out)?;
                content(seed, s, out)?;
                return Ok(true);
            }
            Ok(false)
        })?;
        if !found.streamed(CONTENT) {
            open_message(buf, found.span(ROLE), out)?;
            if let Some(span) = found.span(CONTENT) {
                content(seed, &mut Scanner::at(buf, span), out)?;
            }
        }
    }
    Ok(())
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
    let buf = s.buf();
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        let start = s.position();
        let found = read_object(s, BLOCK_FIELDS, |_, _: &Found<7>, _| Ok(false))?;
        if found.small_string(buf, TYPE).as_deref() != Some(b"text") {
            return Err(unknown(
                "system block",
                found.small_string(buf, TYPE).as_deref(),
            ));
        }
        s.seek(start);
        block(seed, s, out)?;
    }
    Ok(())
}

/// A string, or an array of content blocks; a string keys like one text block.
fn content(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Text);
            s.string(out)?;
        }
        Kind::Array => {
            let mut items = s.begin_array()?;
            while s.next_item(&mut items)? {
                block(seed, s, out)?;
            }
        }
        _ => return Err(NoKeys::unreadable("string or array message content")),
    }
    Ok(())
}

const TYPE: usize = 0;
const TEXT: usize = 1;
const SOURCE: usize = 2;
const NAME: usize = 3;
const INPUT: usize = 4;
const RESULT: usize = 5;
const IS_ERROR: usize = 6;
const BLOCK_FIELDS: [&[u8]; 7] = [
    b"type",
    b"text",
    b"source",
    b"name",
    b"input",
    b"content",
    b"is_error",
];

/// One content block. `thinking` and `redacted_thinking` blocks are ignored, as are ids
/// (`id`, `tool_use_id`), `cache_control` and `citations`.
///
/// A `tool_result` is framed as the result marker, its content (a string or blocks), then
/// an error marker when `is_error` is true, so a failed and a successful result with the
/// same text key apart.
fn block(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let found = read_object(s, BLOCK_FIELDS, |i, found: &Found<7>, s| {
        let kind = found.small_string(buf, TYPE);
        match (i, kind.as_deref()) {
            (TEXT, Some(b"text")) => {
                marker(out, Marker::Text);
                super::walk::string(s, out)?;
                Ok(true)
            }
            (RESULT, Some(b"tool_result")) => {
                marker(out, Marker::ToolResult);
                content(seed, s, out)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    })?;
    let kind = found.small_string(buf, TYPE);
    match kind.as_deref() {
        Some(b"text") => {
            if !found.streamed(TEXT) {
                let text = found
                    .span(TEXT)
                    .ok_or(NoKeys::unreadable("a text block's text"))?;
                marked_string(buf, Marker::Text, text, out)?;
            }
        }
        Some(b"image") => media(
            seed,
            buf,
            Marker::Image,
            None,
            found.span(SOURCE),
            &[b"data", b"url", b"file_id"],
            out,
        )?,
        Some(b"document") => media(
            seed,
            buf,
            Marker::Document,
            None,
            found.span(SOURCE),
            &[b"data", b"url", b"file_id"],
            out,
        )?,
        Some(b"tool_use") => {
            let name = found
                .span(NAME)
                .ok_or(NoKeys::unreadable("a tool_use name"))?;
            marked_string(buf, Marker::ToolCall, name, out)?;
            marker(out, Marker::Arguments);
            if let Some(input) = found.span(INPUT) {
                canonical::json_value(seed, buf, input, None, out)?;
            }
        }
        Some(b"tool_result") => {
            if !found.streamed(RESULT) {
                marker(out, Marker::ToolResult);
                if let Some(span) = found.span(RESULT) {
                    content(seed, &mut Scanner::at(buf, span), out)?;
                }
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
    Ok(())
}
