//! The streaming rewriter that tags a response's own ids in bodies leaving the gateway.

use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use memchr::memmem::Finder;
use memchr::{memchr2, memrchr};

use super::tag::TagStamp;
use scan::JsonScan;

mod scan;
#[cfg(test)]
mod tests;

/// How a body is framed, which decides how the rewriter reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// One JSON document (`application/json`).
    Json,
    /// Server-sent events (`text/event-stream`), one JSON document in each event's data.
    EventStream,
}

impl Framing {
    /// The framing of a `Content-Type` value, or `None` for any other media type.
    ///
    /// ```
    /// use grid_route_layer::pin::Framing;
    ///
    /// assert_eq!(Framing::from_content_type("application/json; charset=utf-8"), Some(Framing::Json));
    /// assert_eq!(Framing::from_content_type("Text/Event-Stream"), Some(Framing::EventStream));
    /// assert_eq!(Framing::from_content_type("text/plain"), None);
    /// ```
    pub fn from_content_type(value: &str) -> Option<Self> {
        let media_type = value.split(';').next().unwrap_or_default().trim();
        if media_type.eq_ignore_ascii_case("application/json") {
            Some(Self::Json)
        } else if media_type.eq_ignore_ascii_case("text/event-stream") {
            Some(Self::EventStream)
        } else {
            None
        }
    }
}

/// Tags the response's own ids in a body as it streams through, one chunk at a time.
///
/// A string value is tagged when its key is `id`, `previous_response_id`, `response_id`,
/// `conversation` or `conversation_id`, it sits in a *tag object* (the top object of the
/// document or of an SSE event's data, or an object reached from it only through keys
/// `response` and `conversation`), it starts with `resp_` or `conv_`, and
/// [`TagStamp::tag`] would tag it. Everything else passes through byte for byte: ids in
/// arrays (output items, conversation items) or under other keys (`metadata`, `tools`,
/// `input`, generated text), other ids (`msg_…`), nulls, values that are already tags,
/// and values written with a backslash escape (ids are plain ASCII; an escaped one is left
/// as the engine wrote it).
///
/// In an event stream only `data:` lines are read (several `data:` lines of one event
/// join into one document); event names, `id:` fields and comments pass untouched, and
/// so does data that is not JSON, such as `[DONE]`. LF, CRLF and CR line endings are all
/// read. A leading byte-order mark is not skipped: the first line is then not recognised.
///
/// The output is the same whatever the chunk boundaries. The rewriter holds back at most
/// one possibly-split id part, never more than
/// [`MAX_ENGINE_ID_BYTES`](super::MAX_ENGINE_ID_BYTES) bytes, never a whole body. When it
/// cannot follow the JSON (malformed input, nesting deeper than 256), it passes the rest of
/// that document or event through untouched. Unchanged spans are returned as slices of the
/// input, without copying.
#[derive(Debug)]
pub struct IdRewriter {
    framing: Framing,
    json: JsonScan,
    line: Line,
    /// The last byte was a CR ending a line: an LF right after it belongs to it.
    after_cr: bool,
}

/// Where an SSE line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// The line so far matches the first n bytes of `data` (0: nothing read yet).
    Name(u8),
    /// In the value of a `data:` line.
    Data,
    /// In any other line: another field or a comment.
    Other,
}

/// `"resp_` and `"conv_`: every tagged value starts with one of them.
static RESP_QUOTE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"resp_"));
static CONV_QUOTE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"conv_"));

/// Length of `"resp_`.
const QUOTED_PREFIX_LEN: usize = 6;

impl IdRewriter {
    /// A rewriter that writes `stamp` into the ids of one body framed as `framing`.
    pub fn new(stamp: TagStamp, framing: Framing) -> Self {
        Self {
            framing,
            json: JsonScan::new(stamp),
            line: Line::Name(0),
            after_cr: false,
        }
    }

    /// Rewrites a whole body at once; the same as one [`push`](Self::push) and
    /// [`finish`](Self::finish).
    pub fn rewrite(stamp: TagStamp, framing: Framing, body: Bytes) -> Bytes {
        let mut rewriter = Self::new(stamp, framing);
        let head = rewriter.push(body);
        let tail = rewriter.finish();
        if tail.is_empty() {
            head
        } else {
            let mut whole = BytesMut::with_capacity(head.len() + tail.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(&tail);
            whole.freeze()
        }
    }

    /// Takes the next chunk of the body and returns what can be sent on now, which may be
    /// empty (when the chunk ends inside a possible id).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        // The emitter owns the chunk, to hand out slices of it; scanning reads a second
        // handle to the same buffer.
        let input = chunk.clone();
        let mut emit = Emit::new(chunk);
        match self.framing {
            Framing::Json => self.push_json(&input, &mut emit),
            Framing::EventStream => self.push_event_stream(&input, &mut emit),
        }
        self.json.end_chunk(&input, &mut emit);
        emit.finish()
    }

    /// Ends the body and returns the bytes still held back. Pushing after `finish` starts
    /// a new body.
    pub fn finish(&mut self) -> Bytes {
        let mut emit = Emit::new(Bytes::new());
        self.json.reset(&mut emit);
        self.line = Line::Name(0);
        self.after_cr = false;
        emit.finish()
    }

    fn push_json(&mut self, input: &[u8], emit: &mut Emit) {
        let mut i = 0;
        while i < input.len() && !self.json.is_inert() {
            i = self.json.scan(input, i, input.len(), emit);
        }
    }

    /// Reads an event stream, skipping whole events that cannot hold a tagged value.
    ///
    /// Skipping is sound because an insertion always follows `"resp_` or `"conv_` in this
    /// chunk when no candidate is open, and a blank line (`\n\n` or `\n\r\n`) starts a new
    /// event in a known state, whatever came before. Only the stretch from the last event
    /// start before such a prefix, and the chunk's last event, are read byte by byte.
    fn push_event_stream(&mut self, input: &[u8], emit: &mut Emit) {
        let mut next = NextPrefix::default();
        let mut i = 0;
        while i < input.len() {
            let mut limit = input.len();
            if self.json.is_resolved() {
                let prefix_at = next.at_or_after(input, i);
                if let Some(start) = last_event_start(input, i, prefix_at) {
                    self.json.reset(emit);
                    self.line = Line::Name(0);
                    self.after_cr = false;
                    i = start;
                }
                limit = input.len().min(prefix_at + QUOTED_PREFIX_LEN);
            }
            i = self.read_lines(input, i, limit, emit);
        }
    }

    /// Reads SSE lines in `input[i..limit]`; returns `limit`, or earlier just after a
    /// candidate id was decided.
    fn read_lines(&mut self, input: &[u8], mut i: usize, limit: usize, emit: &mut Emit) -> usize {
        while i < limit {
            if self.after_cr {
                self.after_cr = false;
                if input[i] == b'\n' {
                    i += 1;
                    continue;
                }
            }
            match self.line {
                Line::Data => {
                    let line_end = memchr2(b'\n', b'\r', &input[i..limit]).map_or(limit, |k| i + k);
                    if !self.json.is_inert() {
                        let stop = self.json.scan(input, i, line_end, emit);
                        if stop < line_end {
                            return stop;
                        }
                    }
                    if line_end == limit {
                        return limit;
                    }
                    self.json.line_break(emit);
                    self.end_line(input[line_end]);
                    i = line_end + 1;
                }
                Line::Other => match memchr2(b'\n', b'\r', &input[i..limit]) {
                    None => return limit,
                    Some(k) => {
                        self.end_line(input[i + k]);
                        i += k + 1;
                    }
                },
                Line::Name(matched) => {
                    let b = input[i];
                    i += 1;
                    let matched = usize::from(matched);
                    if b == b'\n' || b == b'\r' {
                        if matched == 0 {
                            // A blank line ends the event.
                            self.json.reset(emit);
                        } else if matched == 4 {
                            // `data` alone: a data line with an empty value.
                            self.json.line_break(emit);
                        }
                        self.end_line(b);
                    } else if matched < 4 && b == b"data"[matched] {
                        self.line = Line::Name(matched as u8 + 1);
                    } else if matched == 4 && b == b':' {
                        self.line = Line::Data;
                    } else {
                        self.line = Line::Other;
                    }
                }
            }
        }
        i
    }

    fn end_line(&mut self, terminator: u8) {
        self.line = Line::Name(0);
        self.after_cr = terminator == b'\r';
    }
}

/// The next `"resp_`/`"conv_` in a chunk, remembered so each is searched for once.
#[derive(Default)]
struct NextPrefix {
    resp: Option<usize>,
    conv: Option<usize>,
}

impl NextPrefix {
    /// Position of the next prefix at or after `from`, or `input.len()` when none is left.
    fn at_or_after(&mut self, input: &[u8], from: usize) -> usize {
        let resp = Self::refresh(&mut self.resp, &RESP_QUOTE, input, from);
        let conv = Self::refresh(&mut self.conv, &CONV_QUOTE, input, from);
        resp.min(conv)
    }

    fn refresh(slot: &mut Option<usize>, finder: &Finder<'_>, input: &[u8], from: usize) -> usize {
        match *slot {
            Some(at) if at >= from => at,
            _ => {
                let at = finder
                    .find(&input[from..])
                    .map_or(input.len(), |k| from + k);
                *slot = Some(at);
                at
            }
        }
    }
}

/// Where the last event that starts in `input[from..to]` starts: the position just after
/// the last blank line `\n\n` or `\n\r\n` that lies wholly in that span.
fn last_event_start(input: &[u8], from: usize, to: usize) -> Option<usize> {
    let mut end = to;
    while let Some(k) = memrchr(b'\n', &input[from..end]) {
        let lf = from + k;
        let blank = (lf > from && input[lf - 1] == b'\n')
            || (lf >= from + 2 && input[lf - 1] == b'\r' && input[lf - 2] == b'\n');
        if blank {
            return Some(lf + 1);
        }
        end = lf;
    }
    None
}

/// The output of one push: slices of the input chunk, with stamps and held bytes written
/// in between. Stays a slice of the chunk (no copy) until something is written.
pub(super) struct Emit {
    chunk: Bytes,
    /// Bytes of the chunk before `mark` are written (or held).
    mark: usize,
    out: Out,
}

enum Out {
    Empty,
    Slice(usize, usize),
    Buf(BytesMut),
}

impl Emit {
    fn new(chunk: Bytes) -> Self {
        Self {
            chunk,
            mark: 0,
            out: Out::Empty,
        }
    }

    /// Writes the chunk's bytes from the mark up to `to`.
    pub(super) fn copy_to(&mut self, to: usize) {
        if to <= self.mark {
            return;
        }
        let from = self.mark;
        self.mark = to;
        self.out = match std::mem::replace(&mut self.out, Out::Empty) {
            Out::Empty => Out::Slice(from, to),
            Out::Slice(start, end) if end == from => Out::Slice(start, to),
            Out::Slice(start, end) => {
                let mut buf = self.new_buf();
                buf.extend_from_slice(&self.chunk[start..end]);
                buf.extend_from_slice(&self.chunk[from..to]);
                Out::Buf(buf)
            }
            Out::Buf(mut buf) => {
                buf.extend_from_slice(&self.chunk[from..to]);
                Out::Buf(buf)
            }
        };
    }

    /// Moves the mark to `to` without writing: those bytes are held.
    pub(super) fn skip_to(&mut self, to: usize) {
        self.mark = to;
    }

    /// Writes `bytes` that are not in the chunk.
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut buf = match std::mem::replace(&mut self.out, Out::Empty) {
            Out::Empty => self.new_buf(),
            Out::Slice(start, end) => {
                let mut buf = self.new_buf();
                buf.extend_from_slice(&self.chunk[start..end]);
                buf
            }
            Out::Buf(buf) => buf,
        };
        buf.extend_from_slice(bytes);
        self.out = Out::Buf(buf);
    }

    fn new_buf(&self) -> BytesMut {
        // Room for the chunk and a few stamps.
        BytesMut::with_capacity(self.chunk.len() + 256)
    }

    fn finish(mut self) -> Bytes {
        self.copy_to(self.chunk.len());
        match self.out {
            Out::Empty => Bytes::new(),
            Out::Slice(start, end) => self.chunk.slice(start..end),
            Out::Buf(buf) => buf.freeze(),
        }
    }
}
