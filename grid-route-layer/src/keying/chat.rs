//! OpenAI Chat Completions `messages`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{
    self, Found, Rendered, defer, marked, marked_string, media, media_digest, read_object, unknown,
    write_rendered,
};

const NAME: usize = 2;
const TOOL_CALLS: usize = 3;
const FUNCTION_CALL: usize = 4;
/// Role and content first, as [`walk::message`] reads them.
const MESSAGE_FIELDS: [&[u8]; 5] = [
    b"role",
    b"content",
    b"name",
    b"tool_calls",
    b"function_call",
];

/// Writes each message: role, content, then `name`, tool calls and the legacy
/// `function_call`. `tool_call_id`, `reasoning_content`/`reasoning` and unknown fields are
/// ignored. Content met before the role is rendered aside and written after it.
///
/// Returns whether the messages open a conversation: none is the model's (role
/// `assistant`, or a `tool` or `function` result answering one).
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
            MESSAGE_FIELDS,
            out,
            |s, out| content(seed, s, out),
            |s, d| content(seed, s, d),
        )?;
        if let Some(span) = found.span(NAME) {
            marked_string(buf, Marker::Name, span, out)?;
        }
        if let Some(span) = found.span(TOOL_CALLS) {
            tool_calls(seed, &mut Scanner::at(buf, span), out)?;
        }
        if let Some(span) = found.span(FUNCTION_CALL) {
            function(seed, &mut Scanner::at(buf, span), out)?;
        }
        opens &= !walk::is_answer(buf, &found, walk::ROLE);
        out.turn_ends(walk::is_models(buf, &found, walk::ROLE));
    }
    Ok(opens)
}

/// A string, or an array of parts; a string keys like one text part holding it.
fn content(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    walk::content(s, out, |s, out| part(seed, s, out))
}

const TYPE: usize = 0;
const TEXT: usize = 1;
const REFUSAL: usize = 2;
const UUID: usize = 3;
/// Media fields, in the order of [`MEDIA`]: each part type keeps its source under a field
/// of the same name.
const FIRST_MEDIA: usize = 4;
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
/// Media part types: their stream marker and where in their source object the content is.
const MEDIA: [(Marker, &[&[u8]]); 5] = [
    (Marker::Image, &[b"url"]),
    (Marker::Audio, &[b"data"]),
    (Marker::Audio, &[b"url"]),
    (Marker::Video, &[b"url"]),
    (Marker::File, &[b"file_id", b"file_data"]),
];

fn part(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let mut early: Option<Rendered> = None;
    let mut sources = [None; MEDIA.len()];
    let found = read_object(s, PART_FIELDS, |i, found: &Found<9>, s| {
        let kind = found.small_string(buf, TYPE);
        match i {
            TEXT => match kind.as_deref() {
                Some(b"text") => marked(s, Marker::Text, out)?,
                None => early = Some(defer(s, |s, d| marked(s, Marker::Text, d))?),
                Some(_) => return Ok(false),
            },
            i if i >= FIRST_MEDIA => {
                sources[i - FIRST_MEDIA] = Some(media_digest(seed, s, MEDIA[i - FIRST_MEDIA].1)?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let kind = found.small_string(buf, TYPE);
    let kind = kind.as_deref();
    if kind == Some(b"text") {
        match early {
            Some(rendered) => write_rendered(rendered, out)?,
            None if found.seen(TEXT) => {}
            None => return Err(NoKeys::unreadable("a text part's text")),
        }
        return Ok(());
    }
    if kind == Some(b"refusal") {
        let text = found
            .span(REFUSAL)
            .ok_or(NoKeys::unreadable("a refusal part's text"))?;
        return marked_string(buf, Marker::Refusal, text, out);
    }
    let Some(m) = PART_FIELDS[FIRST_MEDIA..]
        .iter()
        .position(|name| Some(*name) == kind)
    else {
        return Err(unknown("content part", kind));
    };
    media(seed, buf, MEDIA[m].0, found.span(UUID), sources[m], out)
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
