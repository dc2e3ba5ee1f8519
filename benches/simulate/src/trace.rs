//! The trace: Mooncake FAST'25 JSONL, one request a line.
//!
//! `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [..]}`,
//! where `hash_ids` has one id per 512-token block of the prompt (the last may be partial)
//! and an id stands for the whole prefix up to its block, so equal ids are a reusable
//! prefix. Any file in this format is accepted; a line that is not is refused with its
//! number, and nothing is simulated.
//!
//! One field beyond Mooncake's may follow: `"conversation": id`, the same number on every
//! turn of one conversation, which `scripts/arena` writes for the runs it replays. Then
//! every line names one, and each request continues the one before it in its
//! conversation; Mooncake's traces name none, and the conversations are derived from the
//! blocks ([`derive_continued`]).

use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use grid_route_layer::keying::{BLOCK_BYTES, PrefixKeys, SessionKey};
use serde::Deserialize;

/// Tokens in one trace block: the Mooncake release's block size, and the default of
/// `--block-tokens` (another trace may cut its prompts finer).
pub const TRACE_BLOCK_TOKENS: u64 = 512;

/// Bytes of prompt text per token, the library's own price
/// ([`BYTES_PER_TOKEN`](grid_route_layer::affinity::BYTES_PER_TOKEN)), so one trace block
/// is 2 KiB of text.
const BYTES_PER_TOKEN: u64 = grid_route_layer::affinity::BYTES_PER_TOKEN as u64;

/// Keying blocks in one 512-token trace block: 512 tokens × 4 bytes / 256 bytes = 8.
pub const KEY_BLOCKS_PER_TRACE_BLOCK: u64 = key_blocks_per_trace_block(TRACE_BLOCK_TOKENS);

/// The smallest trace block: one keying block of text (256 bytes at 4 bytes a token).
pub const MIN_BLOCK_TOKENS: u64 = BLOCK_BYTES as u64 / BYTES_PER_TOKEN;

/// Keying blocks in a trace block of `block_tokens` (a multiple of [`MIN_BLOCK_TOKENS`]).
pub const fn key_blocks_per_trace_block(block_tokens: u64) -> u64 {
    block_tokens * BYTES_PER_TOKEN / BLOCK_BYTES as u64
}

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival, milliseconds from the start of the trace.
    pub arrival_ms: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// One id per `block_tokens` prompt block, each standing for the prefix up to its
    /// block.
    pub blocks: Vec<u64>,
    /// Tokens in one block of this trace ([`TRACE_BLOCK_TOKENS`] for Mooncake's).
    pub block_tokens: u64,
    /// What this prompt finds at the engine that served the earlier turn it extends, past
    /// that turn's full blocks ([`with_answers`] sets it); `None` as read, and for a prompt
    /// that extends no earlier turn with its answer.
    pub extends: Option<Extends>,
    /// The conversation the trace says the request belongs to (the `conversation` field);
    /// `None` in a trace that names none.
    pub conversation: Option<u64>,
}

/// What a prompt finds, past its leading blocks, at the engine that served the earlier turn
/// it extends: that turn's partial last block and its answer. The trace names the block
/// after the earlier turn's full blocks anew (its text grew), so block ids alone cannot
/// see that the engine holds its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extends {
    /// The earlier turn's full blocks, which this prompt begins with.
    pub full_blocks: usize,
    /// The earlier turn's last block: an engine holding it (in its cache, or as the prompt
    /// a slot last ran) holds the answer too.
    pub last_block: u64,
    /// Tokens past the full blocks found there: the earlier turn's partial block and its
    /// answer.
    pub tokens: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
    #[serde(default)]
    conversation: Option<u64>,
}

/// A trace that cannot be read: the line (from 1) and what is wrong with it, or an I/O
/// error.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Line `line` is not a request in the trace format.
    #[error("line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file could not be read.
    #[error("cannot read the trace: {0}")]
    Io(std::io::Error),
    /// The file holds no request.
    #[error("the trace holds no request")]
    Empty,
}

/// Reads a whole trace of 512-token blocks. Blank lines are skipped; requests must come in
/// arrival order.
pub fn read_trace(input: impl BufRead) -> Result<Vec<TraceRequest>, TraceError> {
    read_trace_of_blocks(input, TRACE_BLOCK_TOKENS)
}

/// Reads a whole trace whose `hash_ids` stand for blocks of `block_tokens` tokens (a
/// multiple of [`MIN_BLOCK_TOKENS`], as `--block-tokens` checks).
pub fn read_trace_of_blocks(
    input: impl BufRead,
    block_tokens: u64,
) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests: Vec<TraceRequest> = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(TraceError::Io)?;
        if line.trim().is_empty() {
            continue;
        }
        let malformed = |reason: String| TraceError::Malformed {
            line: line_no,
            reason,
        };
        let parsed: Line = serde_json::from_str(&line).map_err(|e| malformed(e.to_string()))?;
        let request = TraceRequest {
            arrival_ms: parsed.timestamp,
            input_tokens: parsed.input_length,
            output_tokens: parsed.output_length,
            blocks: parsed.hash_ids,
            block_tokens,
            extends: None,
            conversation: parsed.conversation,
        };
        if request.input_tokens == 0 {
            return Err(malformed("input_length is 0".into()));
        }
        let expected = request.input_tokens.div_ceil(block_tokens);
        if request.blocks.len() as u64 != expected {
            return Err(malformed(format!(
                "{} hash_ids for input_length {} (expected {expected}, one per {block_tokens} tokens)",
                request.blocks.len(),
                request.input_tokens
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(request.blocks.len());
        if let Some(repeated) = request.blocks.iter().find(|&&id| !seen.insert(id)) {
            return Err(malformed(format!("hash_ids repeats {repeated}")));
        }
        if let Some(first) = requests.first()
            && first.conversation.is_some() != request.conversation.is_some()
        {
            return Err(malformed(if first.conversation.is_some() {
                "no conversation, where the first request names one".into()
            } else {
                "a conversation, where the first request names none".into()
            }));
        }
        if let Some(previous) = requests.last()
            && previous.arrival_ms > request.arrival_ms
        {
            return Err(malformed(format!(
                "timestamp {} is before the previous line's {}",
                request.arrival_ms, previous.arrival_ms
            )));
        }
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(requests)
}

impl TraceRequest {
    /// The prefix keys the gateway would compute for this prompt: each 512-token trace
    /// block is 2 KiB of text, eight 256-byte keying blocks (a 64-token one is one), whose
    /// digests are derived from the block's id (which already stands for its whole prefix)
    /// and the position inside it. A partial last block gives only its full keying blocks,
    /// as a gateway would.
    pub fn keys(&self) -> Option<PrefixKeys> {
        let text_blocks = self.input_tokens * BYTES_PER_TOKEN / BLOCK_BYTES as u64;
        let per = key_blocks_per_trace_block(self.block_tokens);
        let digests: Vec<u64> = self
            .blocks
            .iter()
            .flat_map(|&id| (0..per).map(move |part| block_digest(id, part, per)))
            .take(text_blocks as usize)
            .collect();
        PrefixKeys::from_block_digests(&digests)
    }

    /// Prompt tokens that block `i` holds (the last block may be partial).
    pub fn block_tokens(&self, i: usize) -> u64 {
        let start = i as u64 * self.block_tokens;
        self.input_tokens
            .saturating_sub(start)
            .min(self.block_tokens)
    }

    /// Prompt tokens in the first `blocks` blocks.
    pub fn prefix_tokens(&self, blocks: usize) -> u64 {
        (blocks as u64 * self.block_tokens).min(self.input_tokens)
    }
}

/// The request each request continues: the one before it in its conversation where the
/// trace names conversations, else as [`derive_continued`] derives them from the blocks.
pub fn continued_of(trace: &[TraceRequest]) -> Vec<Option<usize>> {
    if trace.first().is_none_or(|r| r.conversation.is_none()) {
        return derive_continued(trace);
    }
    let mut latest: HashMap<u64, usize> = HashMap::new();
    trace
        .iter()
        .enumerate()
        .map(|(id, r)| r.conversation.and_then(|c| latest.insert(c, id)))
        .collect()
}

/// Each request's session: the first request of its conversation (see
/// [`continued_of`]), from the request each one continues.
pub fn sessions_of(continued: &[Option<usize>]) -> Vec<usize> {
    let mut sessions: Vec<usize> = Vec::with_capacity(continued.len());
    for (id, earlier) in continued.iter().enumerate() {
        let session = earlier.map_or(id, |earlier| sessions[earlier]);
        sessions.push(session);
    }
    sessions
}

/// The request each request continues, derived from the blocks (Mooncake traces carry no
/// session id): a request whose blocks begin with the whole of an earlier request's full
/// blocks continues that request, and each request is continued at most once, by the first
/// that extends it; any other request starts a conversation.
///
/// Continued at most once, because a conversation is a chain of turns: a request holding
/// only a prompt many others share (the bundled trace's requests all begin with one
/// system-prompt block) would otherwise make one conversation of everything after it. A
/// partial last block is left out: the next turn extends its text, so its id changes.
///
/// A request whose full blocks end at a block an earlier request went past (a head others
/// share, such as that system prompt) is continued by nobody: the request extending it
/// could be its next turn or any other conversation's first, and the trace cannot tell
/// which. Linking it to the first one would send an unrelated conversation back to where
/// that request was answered, which a gateway's thread (the prompt to the byte) never
/// does; left unlinked, its real next turn goes unfollowed, which errs towards the
/// gateway without threads.
pub fn derive_continued(trace: &[TraceRequest]) -> Vec<Option<usize>> {
    // The last full block of each earlier prompt not yet continued, to that request.
    let mut ends: HashMap<u64, usize> = HashMap::new();
    // Blocks some earlier request's full blocks went past.
    let mut heads: HashSet<u64> = HashSet::new();
    let mut continued = Vec::with_capacity(trace.len());
    for (id, request) in trace.iter().enumerate() {
        let full = (request.input_tokens / request.block_tokens) as usize;
        let full = full.min(request.blocks.len());
        let blocks = &request.blocks[..full];
        let earlier = blocks.iter().rev().find_map(|block| ends.remove(block));
        if let Some((&last, passed)) = blocks.split_last() {
            heads.extend(passed.iter().copied());
            if !heads.contains(&last) {
                ends.insert(last, id);
            }
        }
        continued.push(earlier);
    }
    continued
}

/// `trace` with each continuing turn's [`Extends`]: a request that continues an earlier one
/// (see [`continued_of`]) and grew by at least that turn's answer is taken to hold, right
/// after that turn's full blocks, the turn's partial last block and its answer, as a chat
/// client sends its history back. An engine that served the earlier turn caches those tokens
/// too (vLLM and SGLang cache generated tokens' blocks; a llama.cpp slot keeps the prompt it
/// ran with its answer). A turn that grew by less rewrote its history (or dropped the
/// answer) and is credited its full blocks only.
pub fn with_answers(trace: &[TraceRequest]) -> Vec<TraceRequest> {
    let continued = continued_of(trace);
    trace
        .iter()
        .zip(&continued)
        .map(|(request, earlier)| {
            let extends = earlier.and_then(|earlier| {
                let earlier = &trace[earlier];
                let full_blocks = (earlier.input_tokens / earlier.block_tokens) as usize;
                let held = earlier.input_tokens + earlier.output_tokens;
                let &last_block = earlier.blocks.last()?;
                (full_blocks > 0 && request.input_tokens >= held).then(|| Extends {
                    full_blocks,
                    last_block,
                    tokens: held - earlier.prefix_tokens(full_blocks),
                })
            });
            TraceRequest {
                extends,
                ..request.clone()
            }
        })
        .collect()
}

/// Tokens of `request` a cache finds when it holds the request's first `shared` blocks:
/// those, and, when they are exactly the full blocks of the turn the request extends and
/// `holds_last` says the cache holds that turn's last block, that turn's tail and answer.
pub(crate) fn held_tokens(
    request: &TraceRequest,
    shared: usize,
    holds_last: impl FnOnce(u64) -> bool,
) -> u64 {
    let tokens = request.prefix_tokens(shared);
    match request.extends {
        Some(e) if shared == e.full_blocks && holds_last(e.last_block) => {
            (tokens + e.tokens).min(request.input_tokens)
        }
        _ => tokens,
    }
}

/// The session key a gateway would derive for conversation `session` (see
/// [`sessions_of`]): any fixed spread of the number does, as keys only compare.
pub fn session_key(session: usize) -> SessionKey {
    SessionKey::from_digest(mix64(session as u64 ^ 0x7365_7373_696f_6e21))
}

/// The thread a gateway would key for request `id`'s whole prompt (`Prompt::thread`), which
/// the request continuing it names as the prompt it follows (`PrefixKeys::follows`).
pub fn thread_key(id: usize) -> SessionKey {
    SessionKey::from_digest(mix64(id as u64 ^ 0x7468_7265_6164_2121))
}

/// The digest of keying block `part` (of `per`) of trace block `id`: [`mix64`] over both, so different
/// ids or parts give unrelated 64-bit values (the index's hasher passes keys through and
/// wants them spread), the same on every run.
fn block_digest(id: u64, part: u64, per: u64) -> u64 {
    mix64(id.wrapping_mul(per).wrapping_add(part))
}

/// splitmix64's output function (Steele, Lea and Flood 2014; constants from Vigna's
/// reference), used as a hash: a bijection on 64 bits whose outputs look unrelated for
/// neighbouring inputs. Not a random stream: the simulator draws those from seeded
/// `fastrand::Rng`s.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(blocks: &[u64], input_tokens: u64) -> TraceRequest {
        TraceRequest {
            arrival_ms: 0,
            input_tokens,
            output_tokens: 1,
            blocks: blocks.to_vec(),
            block_tokens: TRACE_BLOCK_TOKENS,
            extends: None,
            conversation: None,
        }
    }

    /// The counts docs/routing.md ("Threads and sessions") gives for the bundled trace.
    #[test]
    fn the_bundled_trace_derives_the_conversations_the_docs_count() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/traces/mooncake_conversation_trace.jsonl");
        let file = std::fs::File::open(path).unwrap();
        let trace = read_trace(std::io::BufReader::new(file)).unwrap();
        let sessions = sessions_of(&derive_continued(&trace));
        let mut turns: HashMap<usize, usize> = HashMap::new();
        for &session in &sessions {
            *turns.entry(session).or_default() += 1;
        }
        let longer: Vec<usize> = turns.values().copied().filter(|&n| n >= 2).collect();
        assert_eq!(trace.len(), 12_031);
        assert_eq!(turns.len(), 8_108);
        assert_eq!(longer.len(), 2_023);
        assert_eq!(longer.iter().sum::<usize>(), 5_946);
    }

    #[test]
    fn a_request_that_extends_an_earlier_whole_prompt_continues_its_conversation() {
        let trace = [
            // A conversation: two full blocks and a partial third.
            request(&[1, 2, 3], 2 * 512 + 100),
            // Another, sharing only its first block (a system prompt).
            request(&[1, 9], 2 * 512),
            // The first one's next turn: its two full blocks, then more (the partial
            // block's id changed with its text).
            request(&[1, 2, 4, 5], 4 * 512),
            // The second one's next turn.
            request(&[1, 9, 7], 3 * 512),
            // The first one's third turn, extending the second turn's whole prompt.
            request(&[1, 2, 4, 5, 6], 5 * 512),
            // Shares the system prompt and one more block with no whole earlier prompt.
            request(&[1, 8], 2 * 512),
            // Extends the first one's first turn, which its second turn already continued:
            // a conversation of its own.
            request(&[1, 2, 3], 3 * 512),
            // Holds the system prompt alone (and a partial block): any later conversation
            // could be its next turn.
            request(&[1, 10], 512 + 40),
            // Extends the system prompt: a conversation of its own, not request 7's.
            request(&[1, 11], 2 * 512),
        ];
        let continued = derive_continued(&trace);
        assert_eq!(
            continued,
            [
                None,
                None,
                Some(0),
                Some(1),
                Some(2),
                None,
                None,
                None,
                None
            ]
        );
        assert_eq!(sessions_of(&continued), [0, 1, 0, 1, 0, 5, 6, 7, 8]);
        assert_ne!(thread_key(0), session_key(0));
        assert_eq!(session_key(0), session_key(0));
        assert_ne!(session_key(0), session_key(1));
    }

    #[test]
    fn a_trace_naming_conversations_links_each_turn_to_the_one_before_in_its_own() {
        let trace = read(concat!(
            "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2], \"conversation\": 7}\n",
            "{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 3], \"conversation\": 8}\n",
            // Its blocks do not begin with the first request's: derived, it would begin a
            // conversation of its own.
            "{\"timestamp\": 2, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [4, 5], \"conversation\": 7}\n",
            "{\"timestamp\": 3, \"input_length\": 1536, \"output_length\": 1, \"hash_ids\": [4, 5, 6], \"conversation\": 7}\n",
        ))
        .unwrap();
        assert_eq!(trace[0].conversation, Some(7));
        assert_eq!(continued_of(&trace), [None, None, Some(0), Some(2)]);
        assert_eq!(derive_continued(&trace), [None, None, None, Some(2)]);
        assert_eq!(sessions_of(&continued_of(&trace)), [0, 1, 0, 0]);
        // Every line names one, or none does.
        let named = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1], \"conversation\": 0}";
        let unnamed =
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}";
        assert_eq!(
            read(&format!("{named}\n{unnamed}\n"))
                .unwrap_err()
                .to_string(),
            "line 2: no conversation, where the first request names one"
        );
        assert_eq!(
            read(&format!("{unnamed}\n{named}\n"))
                .unwrap_err()
                .to_string(),
            "line 2: a conversation, where the first request names none"
        );
    }

    #[test]
    fn a_turn_that_grew_by_its_answer_extends_the_earlier_turns_tail_and_answer() {
        let turn = |blocks: &[u64], input_tokens, output_tokens| TraceRequest {
            output_tokens,
            ..request(blocks, input_tokens)
        };
        let trace = with_answers(&[
            // Two full blocks, 100 tokens in a partial third, a 50-token answer.
            turn(&[1, 2, 3], 2 * 512 + 100, 50),
            // Its next turn: the two full blocks, then (renamed) the tail, the answer and
            // a question, in two more blocks.
            turn(&[1, 2, 4, 5], 4 * 512, 600),
            // The next: grew by less than the 600-token answer (its history was cut).
            turn(&[1, 2, 4, 5, 6], 5 * 512, 10),
            // Continues the third, whose prompt is whole blocks: its answer alone.
            turn(&[1, 2, 4, 5, 6, 7], 6 * 512, 10),
        ]);
        let extends: Vec<_> = trace.iter().map(|r| r.extends).collect();
        assert_eq!(
            extends,
            [
                None,
                Some(Extends {
                    full_blocks: 2,
                    last_block: 3,
                    tokens: 150
                }),
                None,
                Some(Extends {
                    full_blocks: 5,
                    last_block: 6,
                    tokens: 10
                }),
            ]
        );
        // The cache holding the earlier turn's full blocks and its last block finds the
        // tail and the answer; without the last block, or short of the full blocks, not.
        assert_eq!(held_tokens(&trace[1], 2, |last| last == 3), 2 * 512 + 150);
        assert_eq!(held_tokens(&trace[1], 2, |_| false), 2 * 512);
        assert_eq!(held_tokens(&trace[1], 1, |_| true), 512);
        // As read, a trace has no answers to find.
        assert_eq!(
            held_tokens(&request(&[1, 2, 4, 5], 4 * 512), 2, |_| true),
            1024
        );
    }

    fn read(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
        read_trace(text.as_bytes())
    }

    #[test]
    fn a_line_in_the_mooncake_format_is_one_request() {
        let trace = read(
            "{\"timestamp\": 27482, \"input_length\": 1030, \"output_length\": 52, \"hash_ids\": [46, 47, 2353]}\n\n",
        )
        .unwrap();
        assert_eq!(
            trace,
            [TraceRequest {
                arrival_ms: 27_482,
                input_tokens: 1030,
                output_tokens: 52,
                blocks: vec![46, 47, 2353],
                block_tokens: crate::trace::TRACE_BLOCK_TOKENS,
                extends: None,
                conversation: None,
            }]
        );
        assert_eq!(trace[0].block_tokens(2), 6);
        assert_eq!(trace[0].prefix_tokens(2), 1024);
        assert_eq!(trace[0].prefix_tokens(3), 1030);
    }

    #[test]
    fn a_malformed_line_is_refused_with_its_number() {
        let good =
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}";
        for (bad, what) in [
            ("{\"timestamp\": 1, \"input_length\": 10}", "missing field"),
            ("not json", "expected"),
            (
                "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, 2]}",
                "2 hash_ids for input_length 10",
            ),
            (
                "{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}",
                "input_length is 0",
            ),
            (
                "{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
                "invalid value",
            ),
            (
                "{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [4, 4]}",
                "hash_ids repeats 4",
            ),
        ] {
            let error = read(&format!("{good}\n{good}\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("line 3: "), "{error}");
            assert!(error.contains(what), "{error}");
        }
        let late =
            "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}";
        let error = read(&format!("{late}\n{good}\n")).unwrap_err().to_string();
        assert_eq!(error, "line 2: timestamp 0 is before the previous line's 5");
        assert_eq!(
            read("\n").unwrap_err().to_string(),
            "the trace holds no request"
        );
    }

    #[test]
    fn each_trace_block_is_eight_keying_blocks_and_equal_ids_share_keys() {
        let request = |input_tokens, blocks: &[u64]| TraceRequest {
            arrival_ms: 0,
            input_tokens,
            output_tokens: 1,
            blocks: blocks.to_vec(),
            block_tokens: crate::trace::TRACE_BLOCK_TOKENS,
            extends: None,
            conversation: None,
        };
        let first = request(1024, &[1, 2]).keys().unwrap();
        assert_eq!(first.len(), 16);
        assert_eq!(first.total_covered_bytes(), 4096);
        // The next turn of the conversation: same two blocks, then 100 more tokens.
        let second = request(1124, &[1, 2, 3]).keys().unwrap();
        assert_eq!(
            second.len(),
            17,
            "100 tokens = 400 bytes = one full keying block"
        );
        assert!(second.as_slice().starts_with(first.as_slice()));
        let other = request(1024, &[1, 9]).keys().unwrap();
        assert_eq!(other.as_slice()[..8], first.as_slice()[..8]);
        assert_ne!(other.as_slice()[8], first.as_slice()[8]);
        // Under one keying block of text: no keys, like a gateway.
        assert!(request(50, &[4]).keys().is_none());
    }
}
