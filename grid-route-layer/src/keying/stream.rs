//! The canonical stream and its chained block keys.
//!
//! A prompt is written as a *canonical stream*: decoded text interleaved with two-byte
//! markers `0xFF, code`. `0xFF` never occurs in UTF-8 and the scanner refuses a raw `0xFF`
//! byte, so no text can forge a marker; a digest always follows its marker at a fixed
//! length, so the stream reads back one way only.
//!
//! The stream is cut into [`BLOCK_BYTES`] blocks and each block's value is chained on the
//! previous one with a keyed SipHash, so a value stands for the whole prefix before it.
//! Two segments are chained separately and joined at the end:
//!
//! - the *preamble* (tool definitions, templates, system text, instructions), padded to a
//!   whole block, and
//! - the *turns* (messages, Responses input, the Completions prompt).
//!
//! Splitting them lets the turns be hashed as they are read even when the body puts
//! `tools` or `model` after `messages` (the OpenAI SDKs do), without reading the
//! messages twice. The final key of a block mixes the namespace (model and `cache_salt`),
//! the preamble's last value and the turn chain's value, so it still stands for everything
//! before it.

use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};

use siphasher::sip::SipHasher13;

use super::keys::PrefixKeys;
use super::scan::TextSink;
use crate::pin::TagKey;

/// Size of one block of the canonical stream.
pub const BLOCK_BYTES: usize = 256;

/// Most keys one request gets.
pub const MAX_KEYS: usize = 512;

/// Keys at every block for the first this many keys (64 KiB of stream)...
const DENSE_KEYS: usize = 256;
/// ...then the stride between keys doubles every this many keys.
const KEYS_PER_STRIDE: usize = 32;

/// The block index that each key ends at: one key a block for the first 256 blocks, then
/// strides of 2, 4, …, 256 blocks, 32 keys each. The last key ends at block 16 575, about
/// 4 MiB into the stream, so prompts that differ anywhere in their first 4 MiB get
/// different keys while no request costs more than 512 keys.
pub(crate) const KEY_BLOCKS: [u32; MAX_KEYS] = key_blocks();

/// Blocks hashed at most: hashing stops at the block of the last key.
pub(crate) const HASHED_BLOCKS: usize = KEY_BLOCKS[MAX_KEYS - 1] as usize + 1;

const fn key_blocks() -> [u32; MAX_KEYS] {
    let mut out = [0u32; MAX_KEYS];
    let mut stride = 1u32;
    let mut i = 1;
    while i < MAX_KEYS {
        if i >= DENSE_KEYS && (i - DENSE_KEYS).is_multiple_of(KEYS_PER_STRIDE) {
            stride *= 2;
        }
        out[i] = out[i - 1] + stride;
        i += 1;
    }
    out
}

/// Stream markers. The numbering is part of the key format of one process only (keys never
/// leave a replica), so it may change between versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Marker {
    // Turns.
    Message = 0x01,
    Text = 0x02,
    Refusal = 0x03,
    Name = 0x04,
    ToolCall = 0x05,
    Arguments = 0x06,
    ToolResult = 0x07,
    ToolError = 0x08,
    // Media: the marker, then a source marker, then an 8-byte digest.
    Image = 0x10,
    Audio = 0x11,
    Video = 0x12,
    File = 0x13,
    Document = 0x14,
    ByUuid = 0x18,
    ByContent = 0x19,
    // Preamble fields.
    Tools = 0x20,
    ChatTemplate = 0x21,
    ChatTemplateKwargs = 0x22,
    Documents = 0x23,
    System = 0x24,
    Instructions = 0x25,
    PromptTemplate = 0x26,
    // Canonical JSON.
    Object = 0x30,
    ObjectEnd = 0x31,
    Array = 0x32,
    ArrayEnd = 0x33,
    Key = 0x34,
    String = 0x35,
    Number = 0x36,
    True = 0x37,
    False = 0x38,
    Null = 0x39,
    /// A value over the canonical limit: its raw bytes' digest follows.
    RawDigest = 0x3A,
}

/// Writes a marker into any sink.
pub(crate) fn marker(sink: &mut impl TextSink, marker: Marker) {
    sink.text(&[0xFF, marker as u8]);
}

/// Writes a marker and the 8-byte digest that follows it.
pub(crate) fn digest(sink: &mut impl TextSink, marker: Marker, digest: u64) {
    let mut bytes = [0u8; 10];
    bytes[0] = 0xFF;
    bytes[1] = marker as u8;
    bytes[2..].copy_from_slice(&digest.to_le_bytes());
    sink.text(&bytes);
}

/// Domain separation for the keyed hash's uses.
#[derive(Clone, Copy)]
#[repr(u64)]
enum Domain {
    Preamble = 1,
    Turns = 2,
    Namespace = 3,
    PreambleKey = 4,
    TurnKey = 5,
    TextDigest = 6,
    RawDigest = 7,
    NhKey = 8,
    Block = 9,
    Session = 10,
    Thread = 11,
}

/// The secret that seeds every key. Keys are only comparable within one `KeySeed`;
/// clients cannot predict them.
///
/// A gateway replica alone uses a [`random`](Self::random) seed. Replicas that share what
/// they learned (a shared index) must key a prompt alike, so they derive the seed from the
/// tag key they already share ([`from_tag_key`](Self::from_tag_key)); a
/// [`fingerprint`](Self::fingerprint) tells them whether a peer's keys are comparable to
/// their own without revealing either the seed or the tag key.
///
/// The keyed hash is SipHash-1-3 from the `siphasher` crate rather than the standard
/// library's `DefaultHasher`: the standard library does not promise that its algorithm
/// stays the same between Rust releases, and replicas built by different compilers must
/// still agree on keys.
#[derive(Clone)]
pub struct KeySeed {
    sip_key: [u64; 2],
    nh_key: [u64; NH_KEY_WORDS],
    fingerprint: u64,
}

/// Words of the NH key: one per word of a block.
const NH_KEY_WORDS: usize = BLOCK_BYTES / 8;

/// The HMAC label of the seed derived from a tag key. The tag key's other uses (id tag
/// macs, the fingerprint below) start with different labels, so no output of one is an
/// output of another.
const SEED_LABEL: &[u8] = b"grid-route/keying-seed/v1\0";
/// The HMAC label of a derived seed's fingerprint.
const FINGERPRINT_LABEL: &[u8] = b"grid-route/keying-seed-fingerprint/v1\0";

impl KeySeed {
    /// A fresh random seed, for a replica that shares nothing.
    pub fn random() -> Self {
        let state = RandomState::new();
        let draw = |i: u64| state.hash_one(i);
        Self::from_parts([draw(0), draw(1)], draw(2))
    }

    /// The seed every replica holding `tag_key` derives alike: the SipHash key is the
    /// first 16 bytes of HMAC-SHA256(tag key, a keying label), the NH key is expanded from
    /// it, and the fingerprint is the first 8 bytes of HMAC-SHA256(tag key, a different
    /// label). HMAC is a PRF, so neither the seed nor the fingerprint reveals the tag key
    /// or each other, and knowing the seed forges no id tag.
    ///
    /// ```
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    /// use grid_route_layer::pin::TagKey;
    ///
    /// let tag_key = TagKey::from_bytes(&[7; 32]).unwrap();
    /// let (a, b) = (KeySeed::from_tag_key(&tag_key), KeySeed::from_tag_key(&tag_key));
    /// assert_eq!(a.fingerprint(), b.fingerprint());
    /// let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(600));
    /// let keys = |seed| key_body(seed, Api::Completions, body.as_bytes()).unwrap();
    /// assert_eq!(keys(&a).keys(), keys(&b).keys());
    /// assert_ne!(KeySeed::random().fingerprint(), a.fingerprint());
    /// ```
    pub fn from_tag_key(tag_key: &TagKey) -> Self {
        let seed = tag_key.derive(SEED_LABEL);
        let fingerprint = tag_key.derive(FINGERPRINT_LABEL);
        Self::from_parts(
            [le_u64(&seed[..8]), le_u64(&seed[8..16])],
            le_u64(&fingerprint[..8]),
        )
    }

    fn from_parts(sip_key: [u64; 2], fingerprint: u64) -> Self {
        let mut seed = Self {
            sip_key,
            nh_key: [0; NH_KEY_WORDS],
            fingerprint,
        };
        for (i, word) in (0u64..).zip(0..NH_KEY_WORDS) {
            let mut h = seed.hasher(Domain::NhKey);
            h.write_u64(i);
            seed.nh_key[word] = h.finish();
        }
        seed
    }

    /// A 64-bit tag of this seed: equal for seeds that key alike, and telling nothing
    /// about the seed itself. Replicas sharing an index stamp their events with it and
    /// ignore events keyed under another seed.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn hasher(&self, domain: Domain) -> SipHasher13 {
        let mut h = SipHasher13::new_with_keys(self.sip_key[0], self.sip_key[1]);
        h.write_u64(domain as u64);
        h
    }

    /// The namespace of a request: its model and `cache_salt` (each may be absent).
    pub(crate) fn namespace(&self, model: Option<&[u8]>, salt: Option<&[u8]>) -> u64 {
        let mut h = self.hasher(Domain::Namespace);
        for part in [model, salt] {
            match part {
                Some(bytes) => {
                    h.write_u8(1);
                    // A fixed width, so replicas on 32- and 64-bit hosts key alike.
                    h.write_u64(bytes.len() as u64);
                    h.write(bytes);
                }
                None => h.write_u8(0),
            }
        }
        h.finish()
    }

    /// The key of a session id (`prompt_cache_key`, Anthropic `metadata.user_id`, a session
    /// header) in `namespace`: ids from any of those places that are equal key alike.
    pub(crate) fn session(&self, namespace: u64, id: &[u8]) -> u64 {
        let mut h = self.hasher(Domain::Session);
        h.write_u64(namespace);
        h.write_u64(id.len() as u64);
        h.write(id);
        h.finish()
    }

    /// The thread key of a stream that ends at turn-chain value `tail` (see
    /// [`BlockChain::tail`]), in `namespace` after a preamble whose last block value is
    /// `preamble`: equal for two prompts exactly when their streams are.
    pub(crate) fn thread(&self, namespace: u64, preamble: u64, tail: u64) -> u64 {
        let mut h = self.hasher(Domain::Thread);
        h.write_u64(namespace);
        h.write_u64(preamble);
        h.write_u64(tail);
        h.finish()
    }

    /// A sink whose digest is a keyed hash of the decoded text written to it.
    pub(crate) fn text_digest(&self) -> DigestSink {
        DigestSink(self.hasher(Domain::TextDigest))
    }

    /// A keyed digest of raw bytes, as sent.
    pub(crate) fn raw_digest(&self, bytes: &[u8]) -> u64 {
        let mut h = self.hasher(Domain::RawDigest);
        h.write(bytes);
        h.finish()
    }

    /// The mask that turns a segment's block values into one request's keys: keyed by
    /// the namespace and (for turns) the preamble's last value. Block values are already
    /// keyed SipHash outputs, so one masking per request is enough to keep namespaces apart.
    fn key_mask(&self, domain: Domain, namespace: u64, preamble: u64) -> u64 {
        let mut h = self.hasher(domain);
        h.write_u64(namespace);
        h.write_u64(preamble);
        h.finish()
    }
}

/// The little-endian `u64` of 8 bytes.
fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

impl Default for KeySeed {
    fn default() -> Self {
        Self::random()
    }
}

impl fmt::Debug for KeySeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySeed(..)")
    }
}

/// A keyed digest of text written in runs.
pub(crate) struct DigestSink(SipHasher13);

impl DigestSink {
    pub(crate) fn finish(&self) -> u64 {
        self.0.finish()
    }
}

impl TextSink for DigestSink {
    fn text(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

/// One segment of the canonical stream, hashed block by block as it is written.
///
/// Text arrives in runs (between escapes, around markers) and is copied into a block
/// buffer. A full block is compressed with NH — the universal hash of UMAC, here with
/// 64-bit halves under the per-process key, so two different blocks collide with
/// probability at most 2⁻⁶⁴ for a key the client does not know — and the 128-bit sum is
/// chained onto the previous block's value with keyed SipHash. NH costs one multiply per
/// sixteen bytes, a fraction of running SipHash over every byte.
pub(crate) struct BlockChain {
    fresh: SipHasher13,
    nh_key: [u64; NH_KEY_WORDS],
    previous: u64,
    block: [u8; BLOCK_BYTES],
    in_block: usize,
    values: Vec<u64>,
    bytes: u64,
    /// [`tail`](Self::tail) where the turn being read started.
    turn_started: Option<u64>,
    /// Whether the last turn read was the model's.
    model_spoke_last: bool,
    /// [`tail`](Self::tail) where the last run of the model's turns started: the end of
    /// the prompt those turns answered.
    before_last_answer: Option<u64>,
}

impl BlockChain {
    fn new(seed: &KeySeed, domain: Domain) -> Self {
        Self {
            fresh: seed.hasher(Domain::Block),
            nh_key: seed.nh_key,
            previous: domain as u64,
            block: [0; BLOCK_BYTES],
            in_block: 0,
            values: Vec::new(),
            bytes: 0,
            turn_started: None,
            model_spoke_last: false,
            before_last_answer: None,
        }
    }

    pub(crate) fn preamble(seed: &KeySeed) -> Self {
        Self::new(seed, Domain::Preamble)
    }

    pub(crate) fn turns(seed: &KeySeed) -> Self {
        Self::new(seed, Domain::Turns)
    }

    /// A turn chain sized for a body of `body_bytes`: the stream is at most about the
    /// body's size, so the block values never reallocate while it is read.
    pub(crate) fn turns_for(seed: &KeySeed, body_bytes: usize) -> Self {
        let mut chain = Self::turns(seed);
        chain.values = Vec::with_capacity((body_bytes / BLOCK_BYTES + 1).min(HASHED_BLOCKS));
        chain
    }

    /// Stream bytes written so far (hashed or not).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn full(&self) -> bool {
        self.values.len() >= HASHED_BLOCKS
    }

    /// The chain's value for the stream written so far, its partial last block padded as
    /// [`end_block`](Self::end_block) would pad it; `None` once the chain only counts.
    /// Two streams have equal tails exactly when they are equal (up to the hash's
    /// collisions), however their text arrived in runs.
    pub(crate) fn tail(&self) -> Option<u64> {
        if self.full() {
            return None;
        }
        if self.in_block == 0 {
            return Some(self.previous);
        }
        let mut block = [0u8; BLOCK_BYTES];
        block[..self.in_block].copy_from_slice(&self.block[..self.in_block]);
        Some(link(
            &self.fresh,
            &self.nh_key,
            self.previous,
            &block,
            self.in_block,
        ))
    }

    /// [`tail`](Self::tail) before the last run of the model's turns: the end of the
    /// prompt that run answered, when the turns hold one.
    pub(crate) fn before_last_answer(&self) -> Option<u64> {
        self.before_last_answer
    }

    fn end_block(&mut self) {
        if self.in_block < BLOCK_BYTES {
            // A short (padded) block is zero-filled; its length goes into the chain below.
            self.block[self.in_block..].fill(0);
        }
        let value = link(
            &self.fresh,
            &self.nh_key,
            self.previous,
            &self.block,
            self.in_block,
        );
        self.push(value);
        self.in_block = 0;
    }

    fn push(&mut self, value: u64) {
        self.previous = value;
        self.values.push(value);
    }

    /// The preamble's block values, its partial last block padded to a whole one.
    fn into_padded_values(mut self) -> Vec<u64> {
        if self.in_block > 0 && !self.full() {
            self.end_block();
        }
        self.values
    }
}

/// The value of a block (`len` bytes of text, zero-padded to a whole block) chained on
/// `previous`: NH of the block, then keyed SipHash of the previous value, the NH sum and
/// the length.
fn link(
    fresh: &SipHasher13,
    nh_key: &[u64; NH_KEY_WORDS],
    previous: u64,
    block: &[u8],
    len: usize,
) -> u64 {
    let sum = nh(block, nh_key);
    let mut words = [0u8; 32];
    for (slot, word) in
        words
            .chunks_exact_mut(8)
            .zip([previous, sum as u64, (sum >> 64) as u64, len as u64])
    {
        slot.copy_from_slice(&word.to_le_bytes());
    }
    let mut h = *fresh;
    h.write(&words);
    h.finish()
}

/// NH over one block with 64-bit halves: the sum, mod 2¹²⁸, of
/// `(m[2i] + k[2i]) * (m[2i+1] + k[2i+1])` over the block's 64-bit words, additions mod
/// 2⁶⁴. For two different blocks and a random key the sums collide with probability at
/// most 2⁻⁶⁴, at one 64×64→128 multiply per sixteen bytes.
fn nh(block: &[u8], key: &[u64; NH_KEY_WORDS]) -> u128 {
    let mut sum = 0u128;
    for (pair, k) in block.chunks_exact(16).zip(key.chunks_exact(2)) {
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&pair[..8]);
        hi.copy_from_slice(&pair[8..]);
        let a = u64::from_le_bytes(lo).wrapping_add(k[0]);
        let b = u64::from_le_bytes(hi).wrapping_add(k[1]);
        sum = sum.wrapping_add(u128::from(a) * u128::from(b));
    }
    sum
}

impl TextSink for BlockChain {
    #[inline]
    fn text(&mut self, mut bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        // Once every key's block is hashed the rest only counts toward the length.
        while !bytes.is_empty() && self.values.len() < HASHED_BLOCKS {
            if self.in_block == 0 && bytes.len() >= BLOCK_BYTES {
                // A whole block in the input is hashed where it lies.
                let (block, rest) = bytes.split_at(BLOCK_BYTES);
                let value = link(&self.fresh, &self.nh_key, self.previous, block, BLOCK_BYTES);
                self.push(value);
                bytes = rest;
                continue;
            }
            let take = (BLOCK_BYTES - self.in_block).min(bytes.len());
            self.block[self.in_block..self.in_block + take].copy_from_slice(&bytes[..take]);
            self.in_block += take;
            bytes = &bytes[take..];
            if self.in_block == BLOCK_BYTES {
                self.end_block();
            }
        }
    }

    fn preferred_write(&self) -> usize {
        BLOCK_BYTES - self.in_block
    }

    fn counting_only(&self) -> bool {
        self.values.len() >= HASHED_BLOCKS
    }

    fn count(&mut self, n: u64) {
        self.bytes += n;
    }

    fn turn_starts(&mut self) {
        self.turn_started = self.tail();
    }

    fn turn_ends(&mut self, by_model: bool) {
        if by_model && !self.model_spoke_last {
            self.before_last_answer = self.turn_started;
        }
        self.model_spoke_last = by_model;
    }
}

/// The thread keys of a request (see [`KeySeed::thread`]): its whole prompt's, and the
/// prompt's its last run of the model's turns answered. `None` where the stream ran past
/// the hashed blocks, or (`follows`) holds no turn of the model's. No `Debug`: like a key,
/// a thread stands for prompt text.
#[derive(Clone, Copy)]
pub(crate) struct Threads {
    pub(crate) own: Option<u64>,
    pub(crate) follows: Option<u64>,
}

/// Joins the two segments into the request's keys and thread keys.
pub(crate) fn join(
    seed: &KeySeed,
    namespace: u64,
    preamble: BlockChain,
    turns: &BlockChain,
) -> (PrefixKeys, Threads) {
    let preamble = preamble.into_padded_values();
    let preamble_blocks = preamble.len();
    let last_preamble = preamble.last().copied().unwrap_or(0);
    let thread = |tail: Option<u64>| tail.map(|tail| seed.thread(namespace, last_preamble, tail));
    let threads = Threads {
        own: thread(turns.tail()),
        follows: thread(turns.before_last_answer()),
    };
    let hashed = preamble_blocks + turns.values.len();
    let blocks = preamble_blocks as u64 + turns.bytes / BLOCK_BYTES as u64;
    let preamble_mask = seed.key_mask(Domain::PreambleKey, namespace, 0);
    let turn_mask = seed.key_mask(Domain::TurnKey, namespace, last_preamble);
    let keys = KEY_BLOCKS
        .iter()
        .map(|&b| b as usize)
        .take_while(|&b| b < hashed)
        .map(|b| {
            if b < preamble_blocks {
                preamble[b] ^ preamble_mask
            } else {
                turns.values[b - preamble_blocks] ^ turn_mask
            }
        })
        .collect();
    (PrefixKeys::new(keys, blocks), threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag_key(byte: u8) -> TagKey {
        TagKey::from_bytes(&[byte; 32]).unwrap()
    }

    #[test]
    fn replicas_with_one_tag_key_derive_one_seed_and_fingerprint() {
        let (a, b) = (
            KeySeed::from_tag_key(&tag_key(1)),
            KeySeed::from_tag_key(&tag_key(1)),
        );
        assert_eq!(a.sip_key, b.sip_key);
        assert_eq!(a.nh_key, b.nh_key);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.namespace(Some(b"m"), None), b.namespace(Some(b"m"), None));
    }

    #[test]
    fn another_tag_key_or_a_random_seed_has_another_fingerprint() {
        let one = KeySeed::from_tag_key(&tag_key(1));
        let two = KeySeed::from_tag_key(&tag_key(2));
        assert_ne!(one.fingerprint(), two.fingerprint());
        assert_ne!(one.sip_key, two.sip_key);
        assert_ne!(
            KeySeed::random().fingerprint(),
            KeySeed::random().fingerprint()
        );
    }

    #[test]
    fn the_seed_and_its_fingerprint_are_separate_derivations_of_the_tag_key() {
        let key = tag_key(3);
        let seed = KeySeed::from_tag_key(&key);
        let seed_bytes = key.derive(SEED_LABEL);
        let fingerprint_bytes = key.derive(FINGERPRINT_LABEL);
        assert_ne!(seed_bytes, fingerprint_bytes);
        assert_eq!(seed.sip_key[0], le_u64(&seed_bytes[..8]));
        assert_eq!(seed.fingerprint(), le_u64(&fingerprint_bytes[..8]));
        // Neither is the raw key material.
        assert_ne!(&seed_bytes[..8], &[3; 8]);
        assert_ne!(seed.fingerprint(), seed.sip_key[0]);
        assert_ne!(seed.fingerprint(), seed.sip_key[1]);
    }

    #[test]
    fn keys_are_dense_for_64_kib_then_stride_out_to_about_4_mib() {
        assert_eq!(KEY_BLOCKS[0], 0);
        assert_eq!(KEY_BLOCKS[255], 255);
        assert_eq!(KEY_BLOCKS[256], 257);
        assert_eq!(KEY_BLOCKS[287], 319);
        assert!(KEY_BLOCKS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(HASHED_BLOCKS, 16_576);
        // A key lands past the 512 KiB mark and within every 64 KiB up to 4 MiB.
        let block_of = |kib: u32| kib * 1024 / BLOCK_BYTES as u32;
        assert!(
            KEY_BLOCKS
                .iter()
                .any(|&b| b > block_of(512) && b < block_of(520))
        );
        for window in 0..63 {
            let (lo, hi) = (block_of(window * 64), block_of((window + 1) * 64));
            assert!(KEY_BLOCKS.iter().any(|&b| lo <= b && b < hi), "{window}");
        }
    }

    #[test]
    fn writing_in_runs_hashes_like_writing_at_once() {
        let seed = KeySeed::random();
        let text: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        let mut whole = BlockChain::turns(&seed);
        whole.text(&text);
        let mut runs = BlockChain::turns(&seed);
        for chunk in text.chunks(7) {
            runs.text(chunk);
        }
        assert_eq!(whole.values, runs.values);
        assert_eq!(whole.values.len(), 2000 / BLOCK_BYTES);
    }

    #[test]
    fn keys_from_block_digests_follow_the_stride_of_body_keys() {
        let seed = KeySeed::random();
        for blocks in [1usize, 255, 256, 257, 300, 9_000, 20_000] {
            let mut turns = BlockChain::turns(&seed);
            turns.text(&vec![b'x'; blocks * BLOCK_BYTES]);
            let (body_keys, _) = join(&seed, 0, BlockChain::preamble(&seed), &turns);
            let digests: Vec<u64> = (0..blocks as u64).collect();
            let digest_keys = PrefixKeys::from_block_digests(&digests).unwrap();
            assert_eq!(digest_keys.len(), body_keys.len(), "{blocks}");
            assert_eq!(digest_keys.blocks(), body_keys.blocks(), "{blocks}");
            assert_eq!(
                digest_keys.total_covered_bytes(),
                body_keys.total_covered_bytes(),
                "{blocks}"
            );
            // Each key is the digest of the block it ends at.
            for (i, &key) in digest_keys.as_slice().iter().enumerate() {
                assert_eq!(key, u64::from(KEY_BLOCKS[i]), "{blocks}");
            }
        }
    }

    #[test]
    fn hashing_stops_after_the_last_key_block() {
        let seed = KeySeed::random();
        let mut chain = BlockChain::turns(&seed);
        let run = vec![b'a'; 1 << 20];
        for _ in 0..6 {
            chain.text(&run);
        }
        assert_eq!(chain.values.len(), HASHED_BLOCKS);
        assert_eq!(chain.bytes(), 6 << 20);
    }
}
