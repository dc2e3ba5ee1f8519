//! A minimal JSON reader over a byte slice: just enough structure to walk the four request
//! formats without building a value tree.
//!
//! Strings are decoded straight into a [`TextSink`] (no intermediate `String`), values the
//! keying does not read are skipped, and every value can be handed back as a [`Span`].
//!
//! The input must hold no `0xFF` byte (`key_body` refuses such a body before reading it):
//! `0xFF` never occurs in UTF-8, and the canonical stream uses it to start its markers, so
//! decoded text can never forge one.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

/// Where a JSON value sits in the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl Span {
    pub(crate) fn range(self) -> Range<usize> {
        self.start..self.end
    }

    pub(crate) fn len(self) -> usize {
        self.end - self.start
    }
}

/// Why the body could not be read as JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unreadable {
    pub(crate) offset: usize,
    pub(crate) expected: &'static str,
}

pub(crate) type ScanResult<T> = Result<T, Unreadable>;

/// Receives decoded string text, run by run.
pub(crate) trait TextSink {
    fn text(&mut self, bytes: &[u8]);

    /// Whether the sink keeps nothing more and only counts bytes (a block chain that has
    /// every key): strings are then measured, not copied.
    fn counting_only(&self) -> bool {
        false
    }

    /// How many bytes the sink would like the next write to hold: a block chain asks for
    /// the rest of its current block, so that whole blocks arrive in one write and can be
    /// hashed where they lie.
    fn preferred_write(&self) -> usize {
        Gather::BYTES
    }

    /// Counts `n` bytes of text without their content; only called when
    /// [`TextSink::counting_only`] holds.
    fn count(&mut self, n: u64) {
        let _ = n;
    }

    /// A turn (a message, an input item) starts with the next write. Only the turns' block
    /// chain keeps track, to tell where the prompt a turn of the model's answered ended.
    fn turn_starts(&mut self) {}

    /// The turn started last is read; `by_model` when the model said it (an assistant
    /// message, a tool call or reasoning it made), not the client (a tool's result).
    fn turn_ends(&mut self, by_model: bool) {
        let _ = by_model;
    }
}

/// The kind of the next value, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

/// Reads JSON from a byte slice, one token at a time.
pub(crate) struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// A scanner over one value of `buf`, found earlier as `span`.
    pub(crate) fn at(buf: &'a [u8], span: Span) -> Self {
        Self {
            buf: &buf[..span.end],
            pos: span.start,
        }
    }

    pub(crate) fn buf(&self) -> &'a [u8] {
        self.buf
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Goes back to a position returned by [`Scanner::position`].
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos;
    }

    fn fail<T>(&self, expected: &'static str) -> ScanResult<T> {
        Err(Unreadable {
            offset: self.pos,
            expected,
        })
    }

    fn skip_ws(&mut self) {
        while let Some(&b) = self.buf.get(self.pos) {
            if matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// The kind of the next value, without consuming it.
    pub(crate) fn peek_kind(&mut self) -> ScanResult<Kind> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(b'{') => Ok(Kind::Object),
            Some(b'[') => Ok(Kind::Array),
            Some(b'"') => Ok(Kind::String),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b't' | b'f') => Ok(Kind::Bool),
            Some(b'n') => Ok(Kind::Null),
            Some(_) => self.fail("a JSON value"),
            None => self.fail("a JSON value, found the end of the body"),
        }
    }

    fn eat(&mut self, byte: u8, expected: &'static str) -> ScanResult<()> {
        self.skip_ws();
        if self.buf.get(self.pos) == Some(&byte) {
            self.pos += 1;
            Ok(())
        } else {
            self.fail(expected)
        }
    }

    /// Requires that nothing but whitespace follows.
    pub(crate) fn finish(&mut self) -> ScanResult<()> {
        self.skip_ws();
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            self.fail("the end of the body after the top-level value")
        }
    }

    /// Consumes `{`; then call [`Scanner::next_key`] until it returns `None`.
    pub(crate) fn begin_object(&mut self) -> ScanResult<Fields> {
        self.eat(b'{', "an object")?;
        Ok(Fields { first: true })
    }

    /// The next key of the object (its value is next), or `None` after the closing `}`.
    pub(crate) fn next_key(&mut self, fields: &mut Fields) -> ScanResult<Option<Cow<'a, [u8]>>> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(b'}') => {
                self.pos += 1;
                return Ok(None);
            }
            Some(b',') if !fields.first => self.pos += 1,
            _ if fields.first => {}
            _ => return self.fail("',' or '}' in an object"),
        }
        fields.first = false;
        self.skip_ws();
        if self.buf.get(self.pos) != Some(&b'"') {
            return self.fail("an object key");
        }
        let key = self.small_string()?;
        self.eat(b':', "':' after an object key")?;
        Ok(Some(key))
    }

    /// Consumes `[`; then call [`Scanner::next_item`] before each element.
    pub(crate) fn begin_array(&mut self) -> ScanResult<Items> {
        self.eat(b'[', "an array")?;
        Ok(Items { first: true })
    }

    /// Whether another element follows (positioned at it), consuming the `]` when not.
    pub(crate) fn next_item(&mut self, items: &mut Items) -> ScanResult<bool> {
        self.skip_ws();
        match self.buf.get(self.pos) {
            Some(b']') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b',') if !items.first => {
                self.pos += 1;
                Ok(true)
            }
            Some(_) if items.first => {
                items.first = false;
                Ok(true)
            }
            _ => self.fail("',' or ']' in an array"),
        }
    }

    /// Decodes a string expected to be short (a key, a role, a type): borrowed when it has
    /// no escapes.
    pub(crate) fn small_string(&mut self) -> ScanResult<Cow<'a, [u8]>> {
        self.skip_ws();
        if self.buf.get(self.pos) != Some(&b'"') {
            return self.fail("a string");
        }
        let start = self.pos + 1;
        let rest = &self.buf[start..];
        match find_quote_or_escape(rest) {
            Some(n) if rest[n] == b'"' => {
                self.pos = start + n + 1;
                Ok(Cow::Borrowed(&rest[..n]))
            }
            Some(_) => {
                let mut owned = OwnedText(Vec::new());
                self.string(&mut owned)?;
                Ok(Cow::Owned(owned.0))
            }
            None => {
                self.pos = self.buf.len();
                self.fail("the closing quote of a string")
            }
        }
    }

    /// Decodes a string into `sink`. JSON escapes are decoded; a lone surrogate is written
    /// in its generalised UTF-8 form, so distinct escapes stay distinct.
    ///
    /// The loop reads eight bytes at a time and stores them into a small buffer as it
    /// checks them, so finding the end of a run and copying it are one step; the sink sees
    /// one write per [`Gather::BYTES`]. Prompts escape a quote or a newline every few dozen
    /// bytes, where a search-then-copy pays its setup again for every run.
    pub(crate) fn string(&mut self, sink: &mut impl TextSink) -> ScanResult<()> {
        if sink.counting_only() {
            return self.count_string(sink);
        }
        self.eat(b'"', "a string")?;
        let buf = self.buf;
        let pos = self.pos;
        // Short plain strings (roles, names, types) go to the sink as they are.
        let head = &buf[pos..buf.len().min(pos + SHORT_RUN_BYTES)];
        if let Some(n) = find_quote_or_escape(head)
            && head[n] == b'"'
        {
            sink.text(&head[..n]);
            self.pos = pos + n + 1;
            return Ok(());
        }
        // One gather buffer a thread, reused: zeroing a fresh one for every string costs
        // more than the strings of a typical message take to decode.
        GATHER.with(|cell| match cell.try_borrow_mut() {
            Ok(mut gather) => self.decode_rest(&mut gather, sink),
            Err(_) => self.decode_rest(&mut Gather::default(), sink),
        })
    }

    /// Decodes the rest of a string whose opening quote was read, through `gather`.
    fn decode_rest(&mut self, gather: &mut Gather, sink: &mut impl TextSink) -> ScanResult<()> {
        let buf = self.buf;
        let mut pos = self.pos;
        let out = &mut gather.bytes;
        // The fill is a local so that the hot loop keeps it in a register.
        let mut len = 0usize;
        let mut limit = sink.preferred_write().clamp(1, Gather::BYTES);
        loop {
            // Sixteen bytes at a time are stored whole; at a quote or a backslash the store
            // is trimmed to the bytes before it.
            let mut at_special = false;
            while len < limit {
                let Some(chunk) = buf.get(pos..pos + 16) else {
                    break;
                };
                let mut pair = [0u8; 16];
                pair.copy_from_slice(chunk);
                let pair = u128::from_le_bytes(pair);
                let hits = u128::from(quote_or_escape(pair as u64))
                    | u128::from(quote_or_escape((pair >> 64) as u64)) << 64;
                out[len..len + 16].copy_from_slice(&pair.to_le_bytes());
                if hits != 0 {
                    let n = (hits.trailing_zeros() / 8) as usize;
                    len += n;
                    pos += n;
                    at_special = true;
                    break;
                }
                len += 16;
                pos += 16;
            }
            if len >= limit {
                // Hand on exactly what the sink asked for; the few bytes past it move down.
                sink.text(&out[..limit]);
                out.copy_within(limit..len, 0);
                len -= limit;
                limit = sink.preferred_write().clamp(1, Gather::BYTES);
                if !at_special {
                    continue;
                }
            }
            if !at_special {
                // Fewer than sixteen bytes are left: look at them one by one.
                let rest = &buf[pos..];
                let Some(n) = rest.iter().position(|&b| matches!(b, b'"' | b'\\')) else {
                    self.pos = buf.len();
                    return self.fail("the closing quote of a string");
                };
                if len + n > out.len() {
                    sink.text(&out[..len]);
                    len = 0;
                }
                out[len..len + n].copy_from_slice(&rest[..n]);
                len += n;
                pos += n;
            }
            // The search stops only at a quote or a backslash. `len` is at most
            // `Gather::BYTES + 15` here, so a one-byte escape fits in the slack; the next
            // round hands on whatever went past the limit.
            if buf[pos] == b'"' {
                sink.text(&out[..len]);
                self.pos = pos + 1;
                return Ok(());
            }
            let code = buf.get(pos + 1).copied().unwrap_or_default();
            let simple = SIMPLE_ESCAPES[usize::from(code)];
            if simple != 0 {
                out[len] = simple;
                len += 1;
                pos += 2;
            } else {
                self.pos = pos;
                let mut decoded = [0u8; 4];
                let n = self.escape(&mut decoded)?;
                if len + n > out.len() {
                    sink.text(&out[..len]);
                    len = 0;
                }
                out[len..len + n].copy_from_slice(&decoded[..n]);
                len += n;
                pos = self.pos;
            }
        }
    }

    /// Measures a string's decoded length for a sink that only counts: runs are found with
    /// the fast search and not copied.
    fn count_string(&mut self, sink: &mut impl TextSink) -> ScanResult<()> {
        self.eat(b'"', "a string")?;
        loop {
            let rest = &self.buf[self.pos..];
            let Some(n) = find_quote_or_escape(rest) else {
                self.pos = self.buf.len();
                return self.fail("the closing quote of a string");
            };
            sink.count(n as u64);
            self.pos += n;
            if rest[n] == b'"' {
                self.pos += 1;
                return Ok(());
            }
            let mut decoded = [0u8; 4];
            let len = self.escape(&mut decoded)?;
            sink.count(len as u64);
        }
    }

    /// Decodes the escape at the position into `out`, returning its length.
    #[inline]
    fn escape(&mut self, out: &mut [u8; 4]) -> ScanResult<usize> {
        let Some(&code) = self.buf.get(self.pos + 1) else {
            return self.fail("an escape sequence");
        };
        let simple = match code {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => return self.unicode_escape(out),
            _ => return self.fail("a valid escape sequence"),
        };
        out[0] = simple;
        self.pos += 2;
        Ok(1)
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.buf.get(at..at + 4)?;
        digits.iter().try_fold(0u32, |acc, &d| {
            let v = char::from(d).to_digit(16)?;
            Some(acc << 4 | v)
        })
    }

    fn unicode_escape(&mut self, out: &mut [u8; 4]) -> ScanResult<usize> {
        let Some(first) = self.hex4(self.pos + 2) else {
            return self.fail("four hex digits after \\u");
        };
        self.pos += 6;
        let mut code = first;
        if (0xD800..0xDC00).contains(&first)
            && self.buf.get(self.pos..self.pos + 2) == Some(b"\\u")
            && let Some(second) = self.hex4(self.pos + 2)
            && (0xDC00..0xE000).contains(&second)
        {
            code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
            self.pos += 6;
        }
        Ok(encode_utf8_lenient(code, out).len())
    }

    /// Skips a string without decoding it.
    fn skip_string(&mut self) -> ScanResult<()> {
        self.pos += 1;
        loop {
            let rest = &self.buf[self.pos..];
            let Some(n) = find_quote_or_escape(rest) else {
                self.pos = self.buf.len();
                return self.fail("the closing quote of a string");
            };
            if rest[n] == b'"' {
                self.pos += n + 1;
                return Ok(());
            }
            // A backslash escapes the byte after it; one that ends the body escapes
            // nothing, and stepping over it would leave the position past the end.
            if n + 1 == rest.len() {
                self.pos = self.buf.len();
                return self.fail("an escape sequence");
            }
            self.pos += n + 2;
        }
    }

    /// Skips one value of any kind and returns where it was.
    ///
    /// Containers are skipped by counting brackets outside strings; the skip checks less
    /// than a full parse (it does not match `[` with `]`), which is enough to find where a
    /// value ends. A value that is read later is checked then.
    pub(crate) fn skip_value(&mut self) -> ScanResult<Span> {
        let kind = self.peek_kind()?;
        let start = self.pos;
        match kind {
            Kind::String => self.skip_string()?,
            Kind::Object | Kind::Array => self.skip_container()?,
            Kind::Number => self.skip_number()?,
            Kind::Bool | Kind::Null => self.skip_literal()?,
        }
        Ok(Span {
            start,
            end: self.pos,
        })
    }

    fn skip_container(&mut self) -> ScanResult<()> {
        let mut depth = 0usize;
        while let Some(&b) = self.buf.get(self.pos) {
            match b {
                b'"' => {
                    self.skip_string()?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
        self.fail("the end of an object or array")
    }

    fn skip_number(&mut self) -> ScanResult<()> {
        let start = self.pos;
        while let Some(b) = self.buf.get(self.pos) {
            if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                self.pos += 1;
            } else {
                break;
            }
        }
        if self.pos == start {
            return self.fail("a number");
        }
        Ok(())
    }

    fn skip_literal(&mut self) -> ScanResult<()> {
        for literal in [&b"true"[..], b"false", b"null"] {
            if self.buf[self.pos..].starts_with(literal) {
                self.pos += literal.len();
                return Ok(());
            }
        }
        self.fail("true, false or null")
    }

    /// Consumes an empty array (`[]`, any whitespace inside) if it is next.
    pub(crate) fn empty_array(&mut self) -> ScanResult<bool> {
        if self.peek_kind()? != Kind::Array {
            return Ok(false);
        }
        let start = self.pos;
        self.pos += 1;
        self.skip_ws();
        if self.buf.get(self.pos) == Some(&b']') {
            self.pos += 1;
            Ok(true)
        } else {
            self.pos = start;
            Ok(false)
        }
    }

    /// Consumes `null` if it is next.
    pub(crate) fn null(&mut self) -> ScanResult<bool> {
        if self.peek_kind()? == Kind::Null {
            self.skip_literal()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads a `true`/`false` value.
    pub(crate) fn boolean(&mut self) -> ScanResult<bool> {
        self.skip_ws();
        if self.buf[self.pos..].starts_with(b"true") {
            self.pos += 4;
            Ok(true)
        } else if self.buf[self.pos..].starts_with(b"false") {
            self.pos += 5;
            Ok(false)
        } else {
            self.fail("true or false")
        }
    }

    /// The raw text of a number.
    pub(crate) fn number(&mut self) -> ScanResult<&'a [u8]> {
        self.skip_ws();
        let start = self.pos;
        self.skip_number()?;
        Ok(&self.buf[start..self.pos])
    }
}

/// What each single-character escape (`\\n`, `\\"`, ...) decodes to; 0 for `\\u` and
/// invalid escapes.
const SIMPLE_ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table[b'/' as usize] = b'/';
    table[b'b' as usize] = 0x08;
    table[b'f' as usize] = 0x0c;
    table[b'n' as usize] = b'\n';
    table[b'r' as usize] = b'\r';
    table[b't' as usize] = b'\t';
    table
};

/// How far into a string the word-at-a-time search looks before handing the rest to
/// `memchr`'s vector search. Prompts escape a quote or a newline every few dozen bytes, and
/// for runs that short the vector search's setup costs more than it saves.
const SHORT_RUN_BYTES: usize = 32;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `word` that is zero (exact for the lowest such byte, which
/// is the only one used).
#[inline]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// Finds the first byte of `hay` for which `is_special` holds, testing words with `mask`.
fn find_special(
    hay: &[u8],
    mask: impl Fn(u64) -> u64,
    is_special: impl Fn(u8) -> bool,
    long: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    let head = &hay[..hay.len().min(SHORT_RUN_BYTES)];
    let mut words = head.chunks_exact(8);
    for (i, word) in words.by_ref().enumerate() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let hits = mask(u64::from_le_bytes(bytes));
        if hits != 0 {
            return Some(i * 8 + (hits.trailing_zeros() / 8) as usize);
        }
    }
    let checked = head.len() - words.remainder().len();
    if let Some(n) = words.remainder().iter().position(|&b| is_special(b)) {
        return Some(checked + n);
    }
    if head.len() < hay.len() {
        return long(&hay[head.len()..]).map(|n| head.len() + n);
    }
    None
}

/// High bits marking the `"` and `\\` bytes of a word (exact for the lowest one).
#[inline]
fn quote_or_escape(word: u64) -> u64 {
    zero_bytes(word ^ (ONES * u64::from(b'"'))) | zero_bytes(word ^ (ONES * u64::from(b'\\')))
}

/// The first `"` or `\\`.
fn find_quote_or_escape(hay: &[u8]) -> Option<usize> {
    find_special(
        hay,
        quote_or_escape,
        |b| b == b'"' || b == b'\\',
        |rest| memchr::memchr2(b'"', b'\\', rest),
    )
}

/// Iteration state of an object; see [`Scanner::next_key`].
pub(crate) struct Fields {
    first: bool,
}

/// Iteration state of an array; see [`Scanner::next_item`].
pub(crate) struct Items {
    first: bool,
}

thread_local! {
    static GATHER: RefCell<Gather> = RefCell::new(Gather::default());
}

/// The buffer decoded text is gathered in before it goes to the sink: writes of about
/// [`Gather::BYTES`] instead of one per run between escapes. Sixteen bytes of slack let a
/// whole pair of words, or a decoded escape, be stored past the flush mark.
struct Gather {
    bytes: [u8; Gather::BYTES + 16],
}

impl Gather {
    const BYTES: usize = 256;
}

impl Default for Gather {
    fn default() -> Self {
        Self {
            bytes: [0; Self::BYTES + 16],
        }
    }
}

/// Collects decoded text into a vector (for short strings and re-parsed arguments).
pub(crate) struct OwnedText(pub(crate) Vec<u8>);

impl TextSink for OwnedText {
    fn text(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// UTF-8 encoding that also accepts surrogate code points (generalised UTF-8), so a lone
/// `\ud800` decodes to its own byte sequence rather than failing or aliasing U+FFFD.
fn encode_utf8_lenient(code: u32, out: &mut [u8; 4]) -> &[u8] {
    if code < 0x80 {
        out[0] = code as u8;
        &out[..1]
    } else if code < 0x800 {
        out[0] = 0xC0 | (code >> 6) as u8;
        out[1] = 0x80 | (code & 0x3F) as u8;
        &out[..2]
    } else if code < 0x10000 {
        out[0] = 0xE0 | (code >> 12) as u8;
        out[1] = 0x80 | ((code >> 6) & 0x3F) as u8;
        out[2] = 0x80 | (code & 0x3F) as u8;
        &out[..3]
    } else {
        out[0] = 0xF0 | (code >> 18) as u8;
        out[1] = 0x80 | ((code >> 12) & 0x3F) as u8;
        out[2] = 0x80 | ((code >> 6) & 0x3F) as u8;
        out[3] = 0x80 | (code & 0x3F) as u8;
        &out[..4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: &str) -> ScanResult<Vec<u8>> {
        let mut out = OwnedText(Vec::new());
        Scanner::new(json.as_bytes()).string(&mut out)?;
        Ok(out.0)
    }

    #[test]
    fn escapes_decode_to_the_text_they_stand_for() {
        assert_eq!(
            decode(r#""caf\u00e9 \/ \"q\" \n""#).unwrap(),
            "café / \"q\" \n".as_bytes()
        );
        assert_eq!(decode(r#""\ud83d\ude00""#).unwrap(), "😀".as_bytes());
    }

    #[test]
    fn a_lone_surrogate_decodes_to_its_own_bytes() {
        assert_eq!(decode(r#""\ud800""#).unwrap(), [0xED, 0xA0, 0x80]);
        assert_ne!(
            decode(r#""\ud800""#).unwrap(),
            decode(r#""\ufffd""#).unwrap()
        );
    }

    #[test]
    fn quotes_and_escapes_are_found_at_every_offset() {
        for len in 0..80 {
            for at in 0..len {
                for special in [b'"', b'\\'] {
                    let mut hay = vec![0xFF; len];
                    hay[at] = special;
                    assert_eq!(find_quote_or_escape(&hay), Some(at), "{len} {at} {special}");
                }
            }
            assert_eq!(find_quote_or_escape(&vec![0x7F; len]), None);
        }
    }

    #[test]
    fn skipping_finds_the_end_of_nested_values() {
        let body = br#"{"a":[1,{"b":"x]}\"y"}],"c":true} tail"#;
        let mut s = Scanner::new(body);
        let span = s.skip_value().unwrap();
        assert_eq!(
            &body[span.range()],
            &br#"{"a":[1,{"b":"x]}\"y"}],"c":true}"#[..]
        );
    }

    #[test]
    fn truncated_input_is_unreadable() {
        for body in [
            &br#"{"a":"#[..],
            br#"{"a":"x"#,
            b"[",
            br#"{"a":[1,2"#,
            // Found by the `reference` fuzz target: a backslash ending the body.
            br#"{"a":"\"#,
            br#"{"a":"x\"#,
            br#"["\"#,
        ] {
            assert!(Scanner::new(body).skip_value().is_err(), "{body:?}");
        }
    }

    #[test]
    fn objects_and_arrays_iterate_their_members() {
        let body = br#" { "k" : [ 1 , "two" ] , "n" : null } "#;
        let mut s = Scanner::new(body);
        let mut fields = s.begin_object().unwrap();
        assert_eq!(&*s.next_key(&mut fields).unwrap().unwrap(), b"k");
        let mut items = s.begin_array().unwrap();
        assert!(s.next_item(&mut items).unwrap());
        assert_eq!(s.number().unwrap(), b"1");
        assert!(s.next_item(&mut items).unwrap());
        assert_eq!(&*s.small_string().unwrap(), b"two");
        assert!(!s.next_item(&mut items).unwrap());
        assert_eq!(&*s.next_key(&mut fields).unwrap().unwrap(), b"n");
        assert!(s.null().unwrap());
        assert!(s.next_key(&mut fields).unwrap().is_none());
        s.finish().unwrap();
    }
}
