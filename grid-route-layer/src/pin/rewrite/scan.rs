//! An incremental JSON scanner that follows just enough structure to find the values to
//! tag, fed one slice at a time.
//!
//! It never builds a value: it keeps a stack of container kinds (one bit each, at most
//! [`MAX_DEPTH`] deep), how many of the outer objects are *tag objects* (the top object and
//! objects reached from it only through `response`/`conversation`), the class of the last
//! key, and, while a candidate id is open, where it started. String contents are skipped
//! with `memchr`. Input it cannot follow makes it inert for the rest of the document.

use memchr::memchr2;

use super::Emit;
use crate::pin::tag::{
    IdKind, MAX_ID_PART_BYTES, PREFIX_LEN, TagStamp, is_taggable_unreserved_part, is_unreserved,
};

/// Deepest nesting followed; deeper documents are passed through untouched.
/// (serde_json refuses documents deeper than 128.)
pub(super) const MAX_DEPTH: usize = 256;

/// Longest key worth remembering: `previous_response_id`.
const KEY_BUF_BYTES: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyClass {
    Other,
    /// `id`, `previous_response_id`, `response_id`, `conversation_id`: a string is an id.
    Id,
    /// `response`: an object is a tag object.
    Response,
    /// `conversation`: a string is an id, an object is a tag object.
    Conversation,
}

/// What the next value is, given where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// The document itself: an object here is the top tag object.
    Top,
    /// Anything that is never tagged.
    Plain,
    /// A member of a tag object whose key names an id.
    Id,
    /// A `response` member of a tag object.
    Response,
    /// A `conversation` member of a tag object.
    Conversation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a value; `slot` says what it would be.
    Value,
    /// In an object, before a key (or `}`).
    Key,
    /// Inside a key of a tag object; its bytes go to `key`.
    KeyText,
    /// Inside a key that does not matter.
    KeySkip,
    KeySkipEscape,
    /// After a key, before `:`.
    Colon,
    /// After a value, before `,` or a closing bracket.
    AfterValue,
    /// Inside a string value that is never tagged.
    Str,
    StrEscape,
    /// Inside a string at an id position, `matched` bytes of a prefix read so far
    /// (`kind` is known once the first byte matched).
    Prefix {
        kind: Option<IdKind>,
        matched: u8,
    },
    /// After a full prefix, reading the id part; see `hold_from` and `held`.
    Hold,
    /// Inside a number or literal.
    Scalar,
    /// The document is complete, or could not be followed: nothing more is tagged.
    Inert,
}

#[derive(Debug)]
pub(super) struct JsonScan {
    stamp: TagStamp,
    state: State,
    slot: Slot,
    key_class: KeyClass,
    /// Container kinds, one bit per level: set for an object.
    stack: [u64; MAX_DEPTH / 64],
    depth: usize,
    /// How many of the outermost containers are tag objects. Tag objects are only opened
    /// inside tag objects, so they always form the bottom of the stack.
    chain: usize,
    key: [u8; KEY_BUF_BYTES],
    key_len: usize,
    /// While holding: where the id part starts in the current chunk, or `None` when it
    /// started in an earlier chunk (its bytes so far are then in `held`).
    hold_from: Option<usize>,
    held: Vec<u8>,
}

impl JsonScan {
    pub(super) fn new(stamp: TagStamp) -> Self {
        Self {
            stamp,
            state: State::Value,
            slot: Slot::Top,
            key_class: KeyClass::Other,
            stack: [0; MAX_DEPTH / 64],
            depth: 0,
            chain: 0,
            key: [0; KEY_BUF_BYTES],
            key_len: 0,
            hold_from: None,
            held: Vec::new(),
        }
    }

    /// Whether no candidate id is open, so that a span without `"resp_`/`"conv_` in it
    /// cannot change the output.
    pub(super) fn is_resolved(&self) -> bool {
        !matches!(self.state, State::Prefix { .. } | State::Hold)
    }

    /// Whether an id part is open (some of it may be held back).
    pub(super) fn is_holding(&self) -> bool {
        self.state == State::Hold
    }

    pub(super) fn is_inert(&self) -> bool {
        self.state == State::Inert
    }

    /// Starts a new document, releasing any held bytes untagged.
    pub(super) fn reset(&mut self, emit: &mut Emit) {
        if self.state == State::Hold {
            self.release(emit, false);
        }
        self.state = State::Value;
        self.slot = Slot::Top;
        self.depth = 0;
        self.chain = 0;
    }

    /// An SSE line break between two `data:` lines: JSON whitespace, but no id or key of
    /// interest spans it.
    pub(super) fn line_break(&mut self, emit: &mut Emit) {
        match self.state {
            State::Prefix { .. } | State::StrEscape => self.state = State::Str,
            State::Hold => {
                self.release(emit, false);
                self.state = State::Str;
            }
            State::KeyText | State::KeySkipEscape => {
                self.key_class = KeyClass::Other;
                self.state = State::KeySkip;
            }
            State::Scalar => self.value_done(),
            _ => {}
        }
    }

    /// The chunk ends at `input.len()`: an open id part is carried into `held`.
    pub(super) fn end_chunk(&mut self, input: &[u8], emit: &mut Emit) {
        if self.state == State::Hold {
            let from = self.hold_from.take().unwrap_or(0);
            emit.copy_to(from);
            self.held.extend_from_slice(&input[from..]);
            emit.skip_to(input.len());
        }
    }

    /// Scans `input[i..end]`. Returns `end`, or earlier: just after a candidate id was
    /// decided, so the caller may look for a span to skip.
    pub(super) fn scan(
        &mut self,
        input: &[u8],
        mut i: usize,
        end: usize,
        emit: &mut Emit,
    ) -> usize {
        while i < end {
            i = match self.state {
                State::Inert => return end,
                State::Str | State::KeySkip => self.skip_string(input, i, end),
                State::StrEscape => {
                    self.state = State::Str;
                    i + 1
                }
                State::KeySkipEscape => {
                    self.state = State::KeySkip;
                    i + 1
                }
                State::KeyText => self.key_text(input, i, end),
                State::Prefix { kind, matched } => self.prefix_byte(kind, matched, input[i], i),
                State::Hold => match self.hold(input, i, end, emit) {
                    HoldStep::Open => return end,
                    HoldStep::Decided(next) => return next,
                    HoldStep::Released(next) => next,
                },
                State::Scalar => {
                    let next = input[i..end]
                        .iter()
                        .position(|&b| !is_scalar_byte(b))
                        .map_or(end, |k| i + k);
                    if next < end {
                        self.value_done();
                    }
                    next
                }
                State::Value | State::Key | State::Colon | State::AfterValue => {
                    let b = input[i];
                    if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                        self.structural(b);
                    }
                    i + 1
                }
            };
        }
        i
    }

    /// Skips string contents up to the next quote or backslash.
    fn skip_string(&mut self, input: &[u8], i: usize, end: usize) -> usize {
        let Some(k) = memchr2(b'"', b'\\', &input[i..end]) else {
            return end;
        };
        let at = i + k;
        let in_key = self.state == State::KeySkip;
        match (input[at], in_key) {
            (b'"', false) => self.value_done(),
            (b'"', true) => {
                self.key_class = KeyClass::Other;
                self.state = State::Colon;
            }
            (_, false) => self.state = State::StrEscape,
            (_, true) => self.state = State::KeySkipEscape,
        }
        at + 1
    }

    /// Reads a key of a tag object into `key`, up to its closing quote.
    fn key_text(&mut self, input: &[u8], i: usize, end: usize) -> usize {
        let room = KEY_BUF_BYTES - self.key_len;
        // One byte more than fits: finding no quote in it means the key is too long.
        let window = &input[i..end.min(i + room + 1)];
        let stop = window.iter().position(|&b| b == b'"' || b == b'\\');
        let text = &window[..stop.unwrap_or(window.len()).min(room)];
        self.key[self.key_len..self.key_len + text.len()].copy_from_slice(text);
        self.key_len += text.len();
        match stop {
            Some(k) if window[k] == b'"' => {
                self.key_class = classify(&self.key[..self.key_len]);
                self.state = State::Colon;
                i + k + 1
            }
            Some(k) => {
                self.state = State::KeySkipEscape;
                i + k + 1
            }
            None if window.len() > room => {
                self.state = State::KeySkip;
                i + room
            }
            None => end,
        }
    }

    /// One byte at position `i` of a string that may start with an id prefix.
    fn prefix_byte(&mut self, kind: Option<IdKind>, matched: u8, b: u8, i: usize) -> usize {
        let kind = match kind {
            None => match b {
                b'r' => Some(IdKind::Response),
                b'c' => Some(IdKind::Conversation),
                _ => None,
            },
            Some(kind) => (kind.prefix().as_bytes()[usize::from(matched)] == b).then_some(kind),
        };
        let Some(kind) = kind else {
            // Not an id: the byte is looked at again as part of a plain string.
            self.state = State::Str;
            return i;
        };
        if usize::from(matched) + 1 == PREFIX_LEN {
            self.state = State::Hold;
            self.hold_from = Some(i + 1);
        } else {
            self.state = State::Prefix {
                kind: Some(kind),
                matched: matched + 1,
            };
        }
        i + 1
    }

    /// Reads the id part from `i`: decides it at its closing quote, or releases it as soon
    /// as it cannot be an id.
    fn hold(&mut self, input: &[u8], i: usize, end: usize, emit: &mut Emit) -> HoldStep {
        let from = self.hold_from.unwrap_or(0);
        // Bytes at positions below `cap` still fit the longest id part.
        let cap = from + (MAX_ID_PART_BYTES - self.held.len());
        let mut j = i;
        while j < end && j < cap && is_unreserved(input[j]) {
            j += 1;
        }
        if j == end {
            return HoldStep::Open;
        }
        if input[j] == b'"' {
            self.decide(input, from, j, emit);
            self.value_done();
            return HoldStep::Decided(j + 1);
        }
        // Too long, an escape, or a byte no id holds: not an id. The byte is looked at
        // again as part of a plain string.
        self.release(emit, false);
        self.state = State::Str;
        HoldStep::Released(j)
    }

    /// One structural byte (not whitespace) in a state between tokens.
    fn structural(&mut self, b: u8) {
        match (self.state, b) {
            (State::Value, b'"') => {
                self.state = if matches!(self.slot, Slot::Id | Slot::Conversation) {
                    State::Prefix {
                        kind: None,
                        matched: 0,
                    }
                } else {
                    State::Str
                };
            }
            (State::Value, b'{') => {
                let tag = matches!(self.slot, Slot::Top | Slot::Response | Slot::Conversation);
                self.open(true, tag);
            }
            (State::Value, b'[') => self.open(false, false),
            (State::Value, b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => self.state = State::Scalar,
            (State::Key, b'"') => {
                if self.in_tag_object() {
                    self.key_len = 0;
                    self.state = State::KeyText;
                } else {
                    self.state = State::KeySkip;
                }
            }
            (State::Colon, b':') => {
                self.slot = if self.in_tag_object() {
                    match self.key_class {
                        KeyClass::Other => Slot::Plain,
                        KeyClass::Id => Slot::Id,
                        KeyClass::Response => Slot::Response,
                        KeyClass::Conversation => Slot::Conversation,
                    }
                } else {
                    Slot::Plain
                };
                self.state = State::Value;
            }
            (State::AfterValue, b',') => {
                if self.top_is_object() {
                    self.state = State::Key;
                } else {
                    self.slot = Slot::Plain;
                    self.state = State::Value;
                }
            }
            // Lenient on `[1,]` and `{"a":1,}`: they change nothing that is tagged.
            (State::AfterValue | State::Key, b'}') | (State::AfterValue | State::Value, b']') => {
                self.close(b == b'}');
            }
            _ => self.state = State::Inert,
        }
    }

    fn in_tag_object(&self) -> bool {
        self.depth > 0 && self.chain == self.depth
    }

    fn top_is_object(&self) -> bool {
        let level = self.depth - 1;
        self.stack[level / 64] & (1 << (level % 64)) != 0
    }

    fn open(&mut self, object: bool, tag: bool) {
        if self.depth == MAX_DEPTH {
            self.state = State::Inert;
            return;
        }
        let level = self.depth;
        let bit = 1u64 << (level % 64);
        if object {
            self.stack[level / 64] |= bit;
        } else {
            self.stack[level / 64] &= !bit;
        }
        self.depth += 1;
        if tag {
            self.chain += 1;
        }
        if object {
            self.state = State::Key;
        } else {
            self.slot = Slot::Plain;
            self.state = State::Value;
        }
    }

    fn close(&mut self, object: bool) {
        if self.depth == 0 || self.top_is_object() != object {
            self.state = State::Inert;
            return;
        }
        self.depth -= 1;
        self.chain = self.chain.min(self.depth);
        self.value_done();
    }

    fn value_done(&mut self) {
        self.state = if self.depth == 0 {
            State::Inert
        } else {
            State::AfterValue
        };
    }

    /// The id part ended at the closing quote at `quote`: tag it or release it.
    fn decide(&mut self, input: &[u8], from: usize, quote: usize, emit: &mut Emit) {
        let taggable = if self.held.is_empty() {
            is_taggable_unreserved_part(&input[from..quote])
        } else {
            let carried = self.held.len();
            self.held.extend_from_slice(&input[from..quote]);
            let taggable = is_taggable_unreserved_part(&self.held);
            self.held.truncate(carried);
            taggable
        };
        self.release(emit, taggable);
    }

    /// Ends a hold: writes the stamp (when tagging) at the start of the id part, then any
    /// carried bytes.
    fn release(&mut self, emit: &mut Emit, tag: bool) {
        let from = self.hold_from.take().unwrap_or(0);
        if tag {
            emit.copy_to(from);
            emit.extend(self.stamp.as_str().as_bytes());
        }
        emit.extend(&self.held);
        self.held.clear();
    }
}

/// What reading an id part came to.
enum HoldStep {
    /// The input ended inside the id part.
    Open,
    /// The id part ended; scanning goes on at the position given.
    Decided(usize),
    /// It is not an id; scanning goes on at the position given.
    Released(usize),
}

fn classify(key: &[u8]) -> KeyClass {
    match key {
        b"id" | b"previous_response_id" | b"response_id" | b"conversation_id" => KeyClass::Id,
        b"response" => KeyClass::Response,
        b"conversation" => KeyClass::Conversation,
        _ => KeyClass::Other,
    }
}

fn is_scalar_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}
