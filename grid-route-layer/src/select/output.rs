//! [`OutputScan`]: where an answer's output begins, found chunk by chunk.

use std::fmt;

use http::HeaderMap;
use http::header::CONTENT_TYPE;

use crate::pin::Framing;

/// The events a Responses API stream opens with before the engine has generated anything
/// (OpenAI's and vLLM's `response.created` and `response.in_progress`, and
/// `response.queued`).
const OPENING_EVENTS: [&[u8]; 3] = [
    b"response.created",
    b"response.in_progress",
    b"response.queued",
];

/// The longest of [`OPENING_EVENTS`]: a name split across two chunks is found with this
/// many bytes less one kept from the first.
const LONGEST_OPENING: usize = {
    let mut longest = 0;
    let mut i = 0;
    while i < OPENING_EVENTS.len() {
        if OPENING_EVENTS[i].len() > longest {
            longest = OPENING_EVENTS[i].len();
        }
        i += 1;
    }
    longest
};

/// The longest field prefix a line is told by (`event:`, `retry:`).
const FIELD_HEAD: usize = 6;

/// What the line being read is, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LineKind {
    /// Too few of its bytes read to tell (none, or part of a field's name).
    #[default]
    Unread,
    /// An `event:` or `data:` line: it is read to its end for an opening event's name.
    Named,
    /// A comment, `id:` or `retry:`: no output.
    Ignored,
}

/// Finds the first chunk of an answer's body that carries some of its output, chunk by
/// chunk: any line but a blank one, an SSE comment, `id:`, `retry:`, or the `event:` and
/// `data:` lines of an event that names one of the events a Responses stream opens with
/// before prefilling (`response.created`, `response.in_progress`, `response.queued`, in
/// its `event:` line or its data). Those come as soon as the engine takes the request,
/// so taking them for the first token would count a stream, and time its first token,
/// before the engine prefilled anything. A JSON answer and every other stream carry output
/// from their first chunk.
///
/// A line may be split across chunks anywhere: `response.created` echoes the request's
/// instructions and tools, so with a long system prompt it spans several. The scan keeps
/// what it needs from one chunk to the next (the line's first bytes and the last 19 of a
/// named line), a few dozen bytes whatever the line's length, and an `event:` or `data:`
/// line counts as output only once it has ended. A data line whose output text contains
/// an opening event's name is taken for an opening one: the next output counts instead.
/// Lines end at `\n` (`\r\n` included); a stream ending its lines with a lone `\r`, which
/// the SSE format allows and no engine sends, is one line that never ends: its request
/// counts whole until its answer ends, and teaches no prefill speed.
/// Whether an answer with these `headers` is a server-sent event stream (its media type
/// read as [`Framing`] reads it), whose head vLLM, SGLang and llama.cpp send before they
/// prefill and whose output [`OutputScan`] finds.
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(Framing::from_content_type)
        == Some(Framing::EventStream)
}

#[derive(Clone, Default)]
pub(crate) struct OutputScan {
    kind: LineKind,
    /// The line's first bytes, while [`LineKind::Unread`].
    head: [u8; FIELD_HEAD],
    head_len: usize,
    /// The last bytes of a [`LineKind::Named`] line read so far.
    tail: [u8; LONGEST_OPENING - 1],
    tail_len: usize,
    /// Whether the named line read so far names an opening event.
    names_opening: bool,
    /// Whether the event being read (up to its blank line) is an opening event.
    opening_event: bool,
    found: bool,
}

impl OutputScan {
    /// Reads the next chunk of the body; `true` once the body has carried output, in this
    /// chunk or an earlier one.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> bool {
        if !self.found {
            for segment in chunk.split_inclusive(|&b| b == b'\n') {
                let (text, ends) = match segment.strip_suffix(b"\n") {
                    Some(text) => (text, true),
                    None => (segment, false),
                };
                if self.read(text, ends) {
                    self.found = true;
                    break;
                }
            }
        }
        self.found
    }

    /// Reads `text`, the next piece of the current line, which ends here when `ends`.
    /// Returns whether the line is output.
    fn read(&mut self, mut text: &[u8], ends: bool) -> bool {
        if self.kind == LineKind::Unread {
            let take = (FIELD_HEAD - self.head_len).min(text.len());
            self.head[self.head_len..self.head_len + take].copy_from_slice(&text[..take]);
            self.head_len += take;
            text = &text[take..];
            let head = &self.head[..self.head_len];
            let field = [&b"event:"[..], b"data:", b"id:", b"retry:", b":"]
                .into_iter()
                .find(|field| head.starts_with(field));
            match field {
                Some(b"event:" | b"data:") => {
                    let name = field.map_or(0, <[u8]>::len);
                    self.kind = LineKind::Named;
                    // What of the head follows the field's name is the line's text.
                    let after = self.head;
                    self.search(&after[name..self.head_len]);
                }
                Some(_) => self.kind = LineKind::Ignored,
                None if head.is_empty() || head == b"\r" => {
                    if ends {
                        // A blank line ends the event.
                        self.opening_event = false;
                    }
                }
                None => {
                    let could_be_a_field = [&b"event:"[..], b"data:", b"id:", b"retry:"]
                        .iter()
                        .any(|field| field.starts_with(head));
                    if !could_be_a_field || ends {
                        return true;
                    }
                }
            }
        }
        if self.kind == LineKind::Named {
            self.search(text);
        }
        if ends {
            let output = self.kind == LineKind::Named && !self.names_opening && !self.opening_event;
            if self.kind == LineKind::Named && self.names_opening {
                self.opening_event = true;
            }
            self.kind = LineKind::Unread;
            self.head_len = 0;
            self.tail_len = 0;
            self.names_opening = false;
            return output;
        }
        false
    }

    /// Looks for an opening event's name in `text`, the next bytes of a named line, and
    /// in the bytes that span it and the line's bytes before it.
    fn search(&mut self, text: &[u8]) {
        if self.names_opening || text.is_empty() {
            return;
        }
        let names = |bytes: &[u8]| {
            OPENING_EVENTS
                .iter()
                .any(|event| bytes.windows(event.len()).any(|w| w == *event))
        };
        // The tail before `text` and `text`'s first bytes: a name split between them.
        let mut joint = [0u8; 2 * (LONGEST_OPENING - 1)];
        let lead = text.len().min(LONGEST_OPENING - 1);
        joint[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        joint[self.tail_len..self.tail_len + lead].copy_from_slice(&text[..lead]);
        self.names_opening = names(&joint[..self.tail_len + lead]) || names(text);
        // Keep the last bytes of the tail and `text` together.
        let keep = LONGEST_OPENING - 1;
        if text.len() >= keep {
            self.tail.copy_from_slice(&text[text.len() - keep..]);
            self.tail_len = keep;
        } else {
            let mut all = [0u8; 2 * (LONGEST_OPENING - 1)];
            all[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            all[self.tail_len..self.tail_len + text.len()].copy_from_slice(text);
            let len = self.tail_len + text.len();
            let from = len.saturating_sub(keep);
            self.tail[..len - from].copy_from_slice(&all[from..len]);
            self.tail_len = len - from;
        }
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl OutputScan {
    /// Where the output is found when a body comes as `chunks`: the end of the chunk it is
    /// found in, counting bytes from the body's start; `None` when no chunk carries any.
    pub(crate) fn found_at<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Option<usize> {
        let mut scan = Self::default();
        let mut read = 0;
        chunks.into_iter().find_map(|chunk| {
            read += chunk.len();
            scan.feed(chunk).then_some(read)
        })
    }
}

/// Without the bytes it keeps: they are the answer's text, which may echo the prompt.
impl fmt::Debug for OutputScan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputScan")
            .field("line", &self.kind)
            .field("opening_event", &self.opening_event)
            .field("found", &self.found)
            .finish_non_exhaustive()
    }
}
