//! The streaming rewriter that tags a response's own ids in bodies leaving the gateway.

use bytes::{Bytes, BytesMut};

use super::tag::TagStamp;
use event_stream::{Line, Unread};
use scan::JsonScan;

mod event_stream;
mod prefix;
mod scan;
#[cfg(test)]
mod tests;

/// How a body is framed, which decides how the rewriter reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
///
/// In an event stream, events that hold no `"resp_`/`"conv_` are skipped without parsing.
/// To skip the end of a chunk, the rewriter keeps handles to bytes it already returned
/// (never delaying them): at most 64 KiB, or the end of the last chunk if larger.
#[derive(Debug)]
pub struct IdRewriter {
    framing: Framing,
    json: JsonScan,
    line: Line,
    /// The last byte was a CR ending a line: an LF right after it belongs to it.
    after_cr: bool,
    /// The end of an event stream chunk left unread; see `event_stream`.
    unread: Unread,
}

impl IdRewriter {
    /// A rewriter that writes `stamp` into the ids of one body framed as `framing`.
    pub fn new(stamp: TagStamp, framing: Framing) -> Self {
        Self {
            framing,
            json: JsonScan::new(stamp),
            line: Line::Name(0),
            after_cr: false,
            unread: Unread::default(),
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
        // Unread bytes were sent already and hold no id.
        self.unread.clear();
        emit.finish()
    }

    fn push_json(&mut self, input: &[u8], emit: &mut Emit) {
        let mut i = 0;
        while i < input.len() && !self.json.is_inert() {
            i = self.json.scan(input, i, input.len(), emit);
        }
    }
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
    pub(super) fn new(chunk: Bytes) -> Self {
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
