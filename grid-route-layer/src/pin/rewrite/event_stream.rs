//! Reading server-sent events: lines, fields, events, and skipping what cannot matter.
//!
//! Only `data:` lines feed the JSON scanner; a blank line ends an event and starts a new
//! document. Most events of a Responses stream are text deltas that hold no id, so the
//! reader skips them whole:
//!
//! - An insertion always follows a `"resp_` or `"conv_` (no candidate open means the
//!   prefix lies ahead), and a blank line (`\n\n` or `\n\r\n`) starts the next event in a
//!   known state whatever came before. So the reader searches the chunk for the prefixes
//!   once, jumps to the last event start before each, and reads byte by byte only from
//!   there.
//! - After the chunk's last prefix, the rest of the chunk would have to be read for the
//!   state to carry into the next chunk. Instead it is left *unread*: the next chunk shows
//!   whether the event ends before any prefix (then the unread bytes are dropped, never
//!   read) or not (then they are read first). Unread bytes were sent on already; the
//!   reader keeps handles to them (no copy), at most [`MAX_UNREAD_BYTES`], and reads them
//!   when that is exceeded.

use bytes::Bytes;
use memchr::{memchr2, memrchr};

use super::prefix::{PREFIXES, QUOTED_PREFIX_LEN};
use super::{Emit, IdRewriter};

/// Most bytes kept unread across chunks; beyond, they are read. (The end of one chunk is
/// always left unread, so a single chunk larger than this is kept whole.)
pub(super) const MAX_UNREAD_BYTES: usize = 64 << 10;

/// Where an SSE line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Line {
    /// The line so far matches the first n bytes of `data` (0: nothing read yet).
    Name(u8),
    /// In the value of a `data:` line.
    Data,
    /// In any other line: another field or a comment.
    Other,
}

/// The unread end of the stream so far. It holds no `"resp_`/`"conv_` (none straddles two
/// of its segments either), and no candidate id was open where it starts, so reading it
/// would write nothing; the state stands where it starts.
#[derive(Debug, Default)]
pub(super) struct Unread {
    segments: Vec<Bytes>,
    len: usize,
    /// Its last bytes, to find a prefix that straddles into the next chunk.
    tail: [u8; QUOTED_PREFIX_LEN - 1],
    tail_len: usize,
}

impl Unread {
    pub(super) fn clear(&mut self) {
        self.segments.clear();
        self.len = 0;
        self.tail_len = 0;
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, segment: Bytes) {
        if segment.is_empty() {
            return;
        }
        let keep = self.tail.len();
        let mut joined = [0; 2 * (QUOTED_PREFIX_LEN - 1)];
        joined[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        let take = segment.len().min(keep);
        joined[self.tail_len..self.tail_len + take]
            .copy_from_slice(&segment[segment.len() - take..]);
        let joined_len = self.tail_len + take;
        self.tail_len = joined_len.min(keep);
        self.tail[..self.tail_len].copy_from_slice(&joined[joined_len - self.tail_len..joined_len]);
        self.len += segment.len();
        self.segments.push(segment);
    }

    /// Whether a prefix starts in the unread bytes and ends in `next`.
    fn straddles_prefix(&self, next: &[u8]) -> bool {
        let mut window = [0; 2 * QUOTED_PREFIX_LEN];
        window[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        let take = next.len().min(QUOTED_PREFIX_LEN);
        window[self.tail_len..self.tail_len + take].copy_from_slice(&next[..take]);
        PREFIXES
            .find(&window[..self.tail_len + take])
            .is_some_and(|at| at < self.tail_len)
    }
}

impl IdRewriter {
    /// Reads an event stream chunk; see the module docs for what is skipped.
    pub(super) fn push_event_stream(&mut self, chunk: &Bytes, emit: &mut Emit) {
        let input: &[u8] = chunk;
        let mut next = NextPrefix::default();
        let mut i = 0;
        if !self.unread.is_empty() {
            i = self.resume_unread(chunk, &mut next);
        }
        while i < input.len() {
            let mut limit = input.len();
            if self.json.is_resolved() {
                let prefix_at = next.at_or_after(input, i);
                if prefix_at == input.len() {
                    // Nothing ahead needs reading now; the next chunk may show it never
                    // does.
                    self.unread.push(chunk.slice(i..));
                    return;
                }
                if let Some(start) = last_event_start(input, i, prefix_at) {
                    self.start_event(emit);
                    i = start;
                }
                limit = prefix_at + QUOTED_PREFIX_LEN;
            }
            i = self.read_lines(input, i, limit, emit);
        }
    }

    /// Decides on the unread bytes before `chunk` and returns where reading `chunk`
    /// starts: after the last event start before its first prefix (the unread bytes then
    /// never need reading), at its end (it joins the unread bytes), or at 0 once the
    /// unread bytes are read.
    fn resume_unread(&mut self, chunk: &Bytes, next: &mut NextPrefix) -> usize {
        let input: &[u8] = chunk;
        if !self.unread.straddles_prefix(input) {
            let prefix_at = next.at_or_after(input, 0);
            if let Some(start) = last_event_start(input, 0, prefix_at) {
                self.unread.clear();
                // No candidate is open, so starting over writes nothing.
                self.start_event(&mut Emit::new(Bytes::new()));
                return start;
            }
            if prefix_at == input.len() && self.unread.len + input.len() <= MAX_UNREAD_BYTES {
                self.unread.push(chunk.clone());
                return input.len();
            }
        }
        self.read_unread();
        0
    }

    /// Brings the state up to the end of the unread bytes. They hold no prefix, so
    /// reading them writes nothing.
    fn read_unread(&mut self) {
        let segments = std::mem::take(&mut self.unread.segments);
        self.unread.clear();
        for segment in segments {
            let mut discard = Emit::new(segment.clone());
            let mut i = 0;
            while i < segment.len() {
                i = self.read_lines(&segment, i, segment.len(), &mut discard);
            }
            debug_assert!(!self.json.is_holding(), "unread bytes held a prefix");
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

    /// The state after a blank line: a new event, at the start of a line.
    fn start_event(&mut self, emit: &mut Emit) {
        self.json.reset(emit);
        self.line = Line::Name(0);
        self.after_cr = false;
    }

    fn end_line(&mut self, terminator: u8) {
        self.line = Line::Name(0);
        self.after_cr = terminator == b'\r';
    }
}

/// The next `"resp_`/`"conv_` in a chunk, remembered so each is searched for once.
#[derive(Default)]
struct NextPrefix {
    at: Option<usize>,
}

impl NextPrefix {
    /// Position of the next prefix at or after `from`, or `input.len()` when none is left.
    /// Each push searches one `input`.
    fn at_or_after(&mut self, input: &[u8], from: usize) -> usize {
        match self.at {
            Some(at) if at >= from => at,
            _ => {
                let at = PREFIXES
                    .find(&input[from..])
                    .map_or(input.len(), |k| from + k);
                self.at = Some(at);
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
