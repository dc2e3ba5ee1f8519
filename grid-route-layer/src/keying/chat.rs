//! OpenAI Chat Completions `messages`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{Found, marked_string, media, open_message, read_object, unknown};

const ROLE: usize = 0;
const CONTENT: usize = 1;
const NAME: usize = 2;
const TOOL_CALLS: usize = 3;
const FUNCTION_CALL: usize = 4;
const MESSAGE_FIELDS: [&[u8]; 5] = [
    b"role",
    b"content",
    b"name",
    b"tool_calls",
    b"function_call",
];

/// Writes each message: role, content, then `name`, tool calls and the legacy
/// `function_call`. `tool_call_id`, `reasoning_content`/`reasoning` and unknown fields are
/// ignored.
pub(super) fn messages(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    let buf = s.buf();
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        let found = read_object(s, MESSAGE_FIELDS, |i, found: &Found<5>, s| {
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
        if let Some(span) = found.span(NAME) {
            marked_string(buf, Marker::Name, span, out)?;
        }
        if let Some(span) = found.span(TOOL_CALLS) {
            tool_calls(seed, &mut Scanner::at(buf, span), out)?;
        }
        if let Some(span) = found.span(FUNCTION_CALL) {
            function(seed, &mut Scanner::at(buf, span), out)?;
        }
    }
    Ok(())
}

/// A string, or an array of parts; a string keys like one text part holding it.
fn content(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Text);
            s.string(out)?;
        }
        Kind::Array => {
            let mut items = s.begin_array()?;
            while s.next_item(&mut items)? {
                part(seed, s, out)?;
            }
        }
        _ => return Err(NoKeys::unreadable("string or array message content")),
    }
    Ok(())
}

const TYPE: usize = 0;
const TEXT: usize = 1;
const REFUSAL: usize = 2;
const UUID: usize = 3;
const IMAGE_URL: usize = 4;
const INPUT_AUDIO: usize = 5;
const AUDIO_URL: usize = 6;
const VIDEO_URL: usize = 7;
const FILE: usize = 8;
const PART_FIELDS: [&[u8]; 9] = [
    b"type",
    b"text",
    b"refusal",
    b"uuid",
    b"image_url",
    b"input_audio",
    b"audio_url",
    b"video_url",
    b"file",
];

fn part(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let found = read_object(s, PART_FIELDS, |i, found: &Found<9>, s| {
        if i == TEXT && found.small_string(buf, TYPE).as_deref() == Some(b"text") {
            marker(out, Marker::Text);
            super::walk::string(s, out)?;
            return Ok(true);
        }
        Ok(false)
    })?;
    let kind = found.small_string(buf, TYPE);
    let uuid = found.span(UUID);
    match kind.as_deref() {
        Some(b"text") => {
            if !found.streamed(TEXT) {
                let text = found
                    .span(TEXT)
                    .ok_or(NoKeys::unreadable("a text part's text"))?;
                marked_string(buf, Marker::Text, text, out)?;
            }
        }
        Some(b"refusal") => {
            let text = found
                .span(REFUSAL)
                .ok_or(NoKeys::unreadable("a refusal part's text"))?;
            marked_string(buf, Marker::Refusal, text, out)?;
        }
        Some(b"image_url") => media(
            seed,
            buf,
            Marker::Image,
            uuid,
            found.span(IMAGE_URL),
            &[b"url"],
            out,
        )?,
        Some(b"input_audio") => {
            media(
                seed,
                buf,
                Marker::Audio,
                uuid,
                found.span(INPUT_AUDIO),
                &[b"data"],
                out,
            )?;
        }
        Some(b"audio_url") => media(
            seed,
            buf,
            Marker::Audio,
            uuid,
            found.span(AUDIO_URL),
            &[b"url"],
            out,
        )?,
        Some(b"video_url") => media(
            seed,
            buf,
            Marker::Video,
            uuid,
            found.span(VIDEO_URL),
            &[b"url"],
            out,
        )?,
        Some(b"file") => media(
            seed,
            buf,
            Marker::File,
            uuid,
            found.span(FILE),
            &[b"file_id", b"file_data"],
            out,
        )?,
        other => return Err(unknown("content part", other)),
    }
    Ok(())
}

const CALL_TYPE: usize = 0;
const CALL_FUNCTION: usize = 1;

fn tool_calls(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let mut items = s.begin_array()?;
    while s.next_item(&mut items)? {
        let found = read_object(s, [b"type", b"function"], |_, _: &Found<2>, _| Ok(false))?;
        match found.small_string(buf, CALL_TYPE).as_deref() {
            None | Some(b"function") => {
                let span = found
                    .span(CALL_FUNCTION)
                    .ok_or(NoKeys::unreadable("a tool call's function"))?;
                function(seed, &mut Scanner::at(buf, span), out)?;
            }
            other => return Err(unknown("tool call", other)),
        }
    }
    Ok(())
}

/// A function call: its name, then its arguments in canonical form. Call ids are ignored.
fn function(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let found = read_object(s, [b"name", b"arguments"], |_, _: &Found<2>, _| Ok(false))?;
    let name = found
        .span(0)
        .ok_or(NoKeys::unreadable("a function's name"))?;
    marked_string(buf, Marker::ToolCall, name, out)?;
    marker(out, Marker::Arguments);
    if let Some(args) = found.span(1) {
        canonical::arguments(seed, buf, args, out)?;
    }
    Ok(())
}
