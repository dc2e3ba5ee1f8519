//! OpenAI Responses `input`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{Found, marked_string, media, open_message, read_object, unknown};

/// Writes the input: a string keys as one user message holding it; an array is read item
/// by item.
pub(super) fn input(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<(), NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Message);
            out.text(b"user");
            marker(out, Marker::Text);
            s.string(out)?;
            Ok(())
        }
        Kind::Array => {
            let mut items = s.begin_array()?;
            while s.next_item(&mut items)? {
                item(seed, s, out)?;
            }
            Ok(())
        }
        _ => Err(NoKeys::unreadable("a string or an array as input")),
    }
}

const TYPE: usize = 0;
const ROLE: usize = 1;
const CONTENT: usize = 2;
const NAME: usize = 3;
const ARGUMENTS: usize = 4;
const OUTPUT: usize = 5;
const ITEM_FIELDS: [&[u8]; 6] = [
    b"type",
    b"role",
    b"content",
    b"name",
    b"arguments",
    b"output",
];

/// One input item.
///
/// - `message` (or no `type` with a `role`): role, then content.
/// - `function_call`: the name, then the arguments in canonical form.
/// - `function_call_output`: the result marker, then the output (a string, or parts);
///   `call_id` is ignored, so the output keys by what it says, not by which call asked.
/// - `reasoning`: ignored.
/// - `item_reference`: names stored state, so the request gets no keys.
/// - Any other type: no keys. Item ids and statuses are ignored.
fn item(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let found = read_object(s, ITEM_FIELDS, |i, found: &Found<6>, s| {
        let kind = found.small_string(buf, TYPE);
        match (i, kind.as_deref()) {
            (CONTENT, None | Some(b"message")) if found.seen(ROLE) => {
                open_message(buf, found.span(ROLE), out)?;
                content(seed, s, out)?;
                Ok(true)
            }
            (OUTPUT, Some(b"function_call_output")) => {
                marker(out, Marker::ToolResult);
                content(seed, s, out)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    })?;
    let kind = found.small_string(buf, TYPE);
    let kind = match kind.as_deref() {
        None if found.seen(ROLE) => &b"message"[..],
        None => return Err(unknown("input item", None)),
        Some(kind) => kind,
    };
    if found.streamed(CONTENT) && kind != b"message" {
        return Err(NoKeys::unreadable("message content only in a message item"));
    }
    match kind {
        b"message" => {
            if !found.streamed(CONTENT) {
                open_message(buf, found.span(ROLE), out)?;
                if let Some(span) = found.span(CONTENT) {
                    content(seed, &mut Scanner::at(buf, span), out)?;
                }
            }
        }
        b"function_call" => {
            let name = found
                .span(NAME)
                .ok_or(NoKeys::unreadable("a function_call name"))?;
            marked_string(buf, Marker::ToolCall, name, out)?;
            marker(out, Marker::Arguments);
            if let Some(args) = found.span(ARGUMENTS) {
                canonical::arguments(seed, buf, args, out)?;
            }
        }
        b"function_call_output" => {
            if !found.streamed(OUTPUT) {
                marker(out, Marker::ToolResult);
                if let Some(span) = found.span(OUTPUT) {
                    content(seed, &mut Scanner::at(buf, span), out)?;
                }
            }
        }
        b"reasoning" => {}
        b"item_reference" => {
            return Err(NoKeys::StoredState {
                field: "item_reference",
            });
        }
        other => return Err(unknown("input item", Some(other))),
    }
    Ok(())
}

/// A string, or an array of content parts; a string keys like one text part.
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
        _ => return Err(NoKeys::unreadable("string or array content")),
    }
    Ok(())
}

const PART_TYPE: usize = 0;
const TEXT: usize = 1;
const REFUSAL: usize = 2;
const IMAGE_URL: usize = 3;
const FILE_ID: usize = 4;
const FILE_DATA: usize = 5;
const FILE_URL: usize = 6;
const INPUT_AUDIO: usize = 7;
const PART_FIELDS: [&[u8]; 8] = [
    b"type",
    b"text",
    b"refusal",
    b"image_url",
    b"file_id",
    b"file_data",
    b"file_url",
    b"input_audio",
];

/// One content part. `input_text` and `output_text` key alike (an assistant turn replayed
/// as input is the same text); annotations and logprobs are ignored.
fn part(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let found = read_object(s, PART_FIELDS, |i, found: &Found<8>, s| {
        let kind = found.small_string(buf, PART_TYPE);
        if i == TEXT && matches!(kind.as_deref(), Some(b"input_text" | b"output_text")) {
            marker(out, Marker::Text);
            super::walk::string(s, out)?;
            return Ok(true);
        }
        Ok(false)
    })?;
    let first = |fields: &[usize]| fields.iter().find_map(|&f| found.span(f));
    match found.small_string(buf, PART_TYPE).as_deref() {
        Some(b"input_text" | b"output_text") => {
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
        Some(b"input_image") => {
            media(
                seed,
                buf,
                Marker::Image,
                None,
                first(&[IMAGE_URL, FILE_ID]),
                &[],
                out,
            )?;
        }
        Some(b"input_file") => media(
            seed,
            buf,
            Marker::File,
            None,
            first(&[FILE_ID, FILE_DATA, FILE_URL]),
            &[],
            out,
        )?,
        Some(b"input_audio") => {
            media(
                seed,
                buf,
                Marker::Audio,
                None,
                found.span(INPUT_AUDIO),
                &[b"data"],
                out,
            )?;
        }
        other => return Err(unknown("content part", other)),
    }
    Ok(())
}
