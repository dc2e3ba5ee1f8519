//! OpenAI Responses `input`.

use super::canonical;
use super::keys::NoKeys;
use super::scan::{Kind, Scanner, TextSink};
use super::stream::{KeySeed, Marker, marker};
use super::walk::{
    self, Found, Rendered, defer, marked, marked_string, media, media_digest, open_message,
    read_object, unknown, write_rendered,
};

/// Writes the input: a string keys as one user message holding it; an array is read item
/// by item. Returns whether the input opens a conversation: a string does, an array when
/// none of its items is the model's (see [`item`]).
pub(super) fn input(
    seed: &KeySeed,
    s: &mut Scanner<'_>,
    out: &mut impl TextSink,
) -> Result<bool, NoKeys> {
    match s.peek_kind()? {
        Kind::String => {
            marker(out, Marker::Message);
            out.text(b"user");
            marker(out, Marker::Text);
            s.string(out)?;
            Ok(true)
        }
        Kind::Array => {
            let mut opens = true;
            let mut items = s.begin_array()?;
            while s.next_item(&mut items)? {
                out.turn_starts();
                let read = item(seed, s, out)?;
                opens &= !read.answers;
                out.turn_ends(read.by_model);
            }
            Ok(opens)
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
///
/// Returns what the item says of the conversation ([`Item`]).
fn item(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<Item, NoKeys> {
    let buf = s.buf();
    let mut early: Option<Rendered> = None;
    let mut streamed_message = false;
    let found = read_object(s, ITEM_FIELDS, |i, found: &Found<6>, s| {
        let kind = found.small_string(buf, TYPE);
        match (i, kind.as_deref()) {
            (CONTENT, None | Some(b"message")) if found.seen(ROLE) => {
                open_message(buf, found.span(ROLE), out)?;
                content(seed, s, out)?;
                streamed_message = true;
            }
            (CONTENT, None) => early = Some(defer(s, |s, d| content(seed, s, d))?),
            (OUTPUT, Some(b"function_call_output")) => {
                marker(out, Marker::ToolResult);
                content(seed, s, out)?;
            }
            (OUTPUT, None) => {
                early = Some(defer(s, |s, d| {
                    marker(d, Marker::ToolResult);
                    content(seed, s, d)
                })?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let kind = found.small_string(buf, TYPE);
    let kind = match kind.as_deref() {
        None if found.seen(ROLE) => &b"message"[..],
        None => return Err(unknown("input item", None)),
        Some(kind) => kind,
    };
    if streamed_message && kind != b"message" {
        return Err(NoKeys::unreadable("message content only in a message item"));
    }
    match kind {
        b"message" => {
            if !streamed_message {
                open_message(buf, found.span(ROLE), out)?;
                if let Some(rendered) = early {
                    write_rendered(rendered, out)?;
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
        b"function_call_output" => match early {
            Some(rendered) => write_rendered(rendered, out)?,
            None if found.seen(OUTPUT) => {}
            None => marker(out, Marker::ToolResult),
        },
        b"reasoning" => {}
        b"item_reference" => {
            return Err(NoKeys::StoredState {
                field: "item_reference",
            });
        }
        other => return Err(unknown("input item", Some(other))),
    }
    Ok(Item {
        answers: match kind {
            b"message" => walk::is_answer(buf, &found, ROLE),
            _ => true,
        },
        by_model: match kind {
            b"message" => walk::is_models(buf, &found, ROLE),
            b"function_call" | b"reasoning" => true,
            _ => false,
        },
    })
}

/// What an input item says of the conversation.
struct Item {
    /// The item is the model's or answers it (an `assistant` message, a function call or
    /// its output, reasoning): the input does not open a conversation.
    answers: bool,
    /// The model made the item (an `assistant` message, a function call, reasoning): the
    /// prompt before it is one the model answered.
    by_model: bool,
}

/// A string, or an array of content parts; a string keys like one text part holding it.
fn content(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    walk::content(s, out, |s, out| part(seed, s, out))
}

const PART_TYPE: usize = 0;
const TEXT: usize = 1;
const REFUSAL: usize = 2;
/// Media sources, digested as they are met: `image_url`, `file_id`, `file_data`,
/// `file_url`, `input_audio`.
const FIRST_SOURCE: usize = 3;
const IMAGE_URL: usize = 3;
const FILE_ID: usize = 4;
const FILE_DATA: usize = 5;
const FILE_URL: usize = 6;
const INPUT_AUDIO: usize = 7;
/// vLLM's stable media id: a media part with one keys by it, whatever its source.
const UUID: usize = 8;
const PART_FIELDS: [&[u8]; 9] = [
    b"type",
    b"text",
    b"refusal",
    b"image_url",
    b"file_id",
    b"file_data",
    b"file_url",
    b"input_audio",
    b"uuid",
];

/// One content part. `input_text` and `output_text` key alike (an assistant turn replayed
/// as input is the same text); annotations and logprobs are ignored.
fn part(seed: &KeySeed, s: &mut Scanner<'_>, out: &mut impl TextSink) -> Result<(), NoKeys> {
    let buf = s.buf();
    let mut early: Option<Rendered> = None;
    let mut sources = [None; UUID - FIRST_SOURCE];
    let found = read_object(s, PART_FIELDS, |i, found: &Found<9>, s| {
        let kind = found.small_string(buf, PART_TYPE);
        match (i, kind.as_deref()) {
            (TEXT, Some(b"input_text" | b"output_text")) => marked(s, Marker::Text, out)?,
            (TEXT, None) => early = Some(defer(s, |s, d| marked(s, Marker::Text, d))?),
            (TEXT | REFUSAL | PART_TYPE | UUID, _) => return Ok(false),
            (source, _) => {
                sources[source - FIRST_SOURCE] = Some(media_digest(seed, s, &[b"data"])?);
            }
        }
        Ok(true)
    })?;
    let source = |fields: &[usize]| fields.iter().find_map(|&f| sources[f - FIRST_SOURCE]);
    match found.small_string(buf, PART_TYPE).as_deref() {
        Some(b"input_text" | b"output_text") => match early {
            Some(rendered) => write_rendered(rendered, out)?,
            None if found.seen(TEXT) => {}
            None => return Err(NoKeys::unreadable("a text part's text")),
        },
        Some(b"refusal") => {
            let text = found
                .span(REFUSAL)
                .ok_or(NoKeys::unreadable("a refusal part's text"))?;
            marked_string(buf, Marker::Refusal, text, out)?;
        }
        Some(b"input_image") => media(
            seed,
            buf,
            Marker::Image,
            found.span(UUID),
            source(&[IMAGE_URL, FILE_ID]),
            out,
        )?,
        Some(b"input_file") => media(
            seed,
            buf,
            Marker::File,
            found.span(UUID),
            source(&[FILE_ID, FILE_DATA, FILE_URL]),
            out,
        )?,
        Some(b"input_audio") => media(
            seed,
            buf,
            Marker::Audio,
            found.span(UUID),
            source(&[INPUT_AUDIO]),
            out,
        )?,
        other => return Err(unknown("content part", other)),
    }
    Ok(())
}
