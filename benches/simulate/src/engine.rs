//! The engine models, in virtual time: [`EngineKind::Batching`], a vLLM-like server with a
//! block prefix cache (below), and [`EngineKind::Slots`], a llama.cpp-like server with a
//! few slots ([`slots`](super::slots)).
//!
//! - **KV cache**: `kv_tokens` of memory in 512-token blocks (the trace's). A block is
//!   named by its trace id, which stands for its whole prefix, so prompts sharing a prefix
//!   share its blocks and count them once. Blocks of started requests are pinned; when a
//!   request ends its blocks stay cached, tail first into an LRU, and are evicted least
//!   recently used first when a new request needs room (vLLM's free-block queue). A
//!   request's hit is the longest run of its leading blocks still resident.
//! - **Waiting queue**: requests wait, first come first served, until the engine starts
//!   them; their count is the queue signal (`vllm:num_requests_waiting`). The head starts
//!   when the prefill line is free, fewer than `max_running` requests are running and its
//!   blocks fit in memory (evicting cached blocks as needed); otherwise everything behind
//!   it waits too.
//! - **Prefill**: one request at a time, `prefill_overhead_s` plus its uncached tokens at
//!   `prefill_tps`. The first token comes at the end of the prefill.
//! - **Decode**: `output_tokens / decode_tps` after the first token, in parallel for every
//!   running request. The request holds its slot and its blocks until then.

use std::collections::{HashMap, VecDeque};

use lru::LruCache;

use super::slots::SlotEngine;
use super::trace::{TRACE_BLOCK_TOKENS, TraceRequest, held_tokens};

/// Which engine a run models (`--engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// vLLM or SGLang: continuous batching over a block prefix cache.
    Batching,
    /// llama.cpp's server with `--parallel N`: N slots, each holding one prompt's cache.
    Slots,
}

/// The engine's parameters (`--engine`, `--kv-tokens`, `--max-running`, `--slots`,
/// `--host-cache-tokens`, `--prefill-tps`, `--prefill-overhead-ms`, `--decode-tps`); see
/// [`EngineModel::default`] for where the defaults come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineModel {
    /// Which engine.
    pub kind: EngineKind,
    /// Slots of a slot engine.
    pub slots: usize,
    /// Tokens of a slot engine's host prompt cache (0: none).
    pub host_cache_tokens: u64,
    /// Whether a slot engine prefills one prompt at a time (`prefill_tps` is then the
    /// engine's, shared by its slots) instead of each slot on its own.
    pub one_prefill_at_a_time: bool,
    /// Whether a slot engine uses its host prompt cache as llama.cpp's server does
    /// (`--llama-cpp-host-cache`; the slots module says how) instead of restoring from it
    /// whenever a saved prompt holds more of a request than the slot it takes.
    pub llama_cpp_host_cache: bool,
    /// Tokens in one block of the trace (`--block-tokens`): a batching engine's cache
    /// block, what a slot engine's host cache counts in.
    pub block_tokens: u64,
    /// KV cache size in tokens.
    pub kv_tokens: u64,
    /// Most requests running (prefilling or decoding) at once.
    pub max_running: usize,
    /// Uncached prompt tokens prefilled a second.
    pub prefill_tps: f64,
    /// Fixed time added to every prefill, seconds.
    pub prefill_overhead_s: f64,
    /// Tokens a second each running request decodes.
    pub decode_tps: f64,
    /// Whether a turn finds the earlier turn's partial last block and answer at the engine
    /// that served it ([`with_answers`](super::trace::with_answers)); without, only whole
    /// trace blocks hit, as the trace's ids alone say. Off by default: every table in
    /// docs/routing.md was made without it ("Answers held for the next turn" measures it).
    pub answers_cached: bool,
}

impl Default for EngineModel {
    /// Llama-3.1-8B in bf16 on one H100 80 GB under vLLM (see `docs/routing.md`, "Engine
    /// model", for the arithmetic and sources).
    fn default() -> Self {
        Self {
            kind: EngineKind::Batching,
            slots: 2,
            host_cache_tokens: 0,
            one_prefill_at_a_time: false,
            llama_cpp_host_cache: false,
            block_tokens: TRACE_BLOCK_TOKENS,
            kv_tokens: 400_000,
            max_running: 256,
            prefill_tps: 20_000.0,
            prefill_overhead_s: 0.02,
            decode_tps: 75.0,
            answers_cached: false,
        }
    }
}

impl EngineModel {
    /// Memory blocks of `kv_tokens`.
    pub fn capacity_blocks(&self) -> usize {
        (self.kv_tokens / self.block_tokens) as usize
    }

    /// Blocks a request holds while it runs: its prompt blocks, and more for the output
    /// once it outgrows them.
    pub fn blocks_needed(request: &TraceRequest) -> usize {
        let total = (request.input_tokens + request.output_tokens).div_ceil(request.block_tokens);
        (total as usize).max(request.blocks.len())
    }

    /// Seconds to prefill `uncached_tokens`.
    pub fn prefill_seconds(&self, uncached_tokens: u64) -> f64 {
        self.prefill_overhead_s + uncached_tokens as f64 / self.prefill_tps
    }
}

/// A request the engine has started: when its first token comes, and its cache hit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    /// The request's position in the trace.
    pub request: usize,
    /// Prompt tokens found in the cache.
    pub cached_tokens: u64,
    /// When the prefill ends and the first token comes.
    pub first_token_at: f64,
}

/// One engine's state, of either kind.
#[derive(Debug)]
pub enum Engine {
    /// A batching engine.
    Batching(BatchingEngine),
    /// A slot engine.
    Slots(SlotEngine),
}

impl Engine {
    /// An idle engine of `model`'s kind with an empty cache.
    pub fn new(model: EngineModel) -> Self {
        match model.kind {
            EngineKind::Batching => Self::Batching(BatchingEngine::new(model)),
            EngineKind::Slots => Self::Slots(SlotEngine::new(model)),
        }
    }

    /// Requests waiting to start: the queue signal the gateway polls.
    pub fn waiting(&self) -> usize {
        match self {
            Self::Batching(e) => e.waiting(),
            Self::Slots(e) => e.waiting(),
        }
    }

    /// The requests it runs at once when it has a few slots, as its `/props` page tells
    /// the gateway (llama.cpp's `total_slots`); `None` for a batching engine.
    pub fn slots(&self) -> Option<usize> {
        match self {
            Self::Batching(_) => None,
            Self::Slots(e) => Some(e.slots()),
        }
    }

    /// Prompt tokens of `request` the engine would find cached if it started now.
    pub fn cached_tokens(&self, request: &TraceRequest) -> u64 {
        match self {
            Self::Batching(e) => e.cached_tokens(request),
            Self::Slots(e) => e.cached_tokens(request),
        }
    }

    /// Seconds from `now` to `request`'s first token if it were sent here now (the
    /// oracle's estimate).
    pub fn predicted_ttft(&self, request: &TraceRequest, now: f64, trace: &[TraceRequest]) -> f64 {
        match self {
            Self::Batching(e) => e.predicted_ttft(request, now),
            Self::Slots(e) => e.predicted_ttft(request, now, trace),
        }
    }

    /// Queues `request` (trace position `id`).
    pub fn enqueue(&mut self, id: usize, request: &TraceRequest) {
        match self {
            Self::Batching(e) => e.enqueue(id, request),
            Self::Slots(e) => e.enqueue(id),
        }
    }

    /// Starts the next waiting request if it can start at `now`.
    pub fn start_next(&mut self, trace: &[TraceRequest], now: f64) -> Option<Started> {
        match self {
            Self::Batching(e) => e.start_next(trace, now),
            Self::Slots(e) => e.start_next(trace, now),
        }
    }

    /// Request `id`'s prefill has ended (its first token).
    pub fn end_prefill(&mut self, _id: usize) {
        match self {
            Self::Batching(e) => e.end_prefill(),
            Self::Slots(e) => e.end_prefill(),
        }
    }

    /// Request `id` (`request`) has decoded its last token.
    pub fn finish(&mut self, id: usize, request: &TraceRequest) {
        match self {
            Self::Batching(e) => e.finish(request),
            Self::Slots(e) => e.finish(id),
        }
    }
}

/// One batching engine's state.
#[derive(Debug)]
pub struct BatchingEngine {
    model: EngineModel,
    capacity: usize,
    /// Resident blocks and how many running requests use each (0: cached only).
    resident: HashMap<u64, u32>,
    /// Resident blocks no running request uses, least recently used first out.
    evictable: LruCache<u64, ()>,
    /// Output blocks of running requests (private, never cached).
    private: usize,
    waiting: VecDeque<usize>,
    /// Estimated prefill seconds of the waiting requests (priced at their arrival).
    waiting_prefill_s: f64,
    running: usize,
    /// When the prefill in progress ends (no prefill: in the past).
    line_free_at: f64,
    prefilling: bool,
}

impl BatchingEngine {
    /// An idle engine with an empty cache.
    pub fn new(model: EngineModel) -> Self {
        Self {
            model,
            capacity: model.capacity_blocks(),
            resident: HashMap::new(),
            evictable: LruCache::unbounded(),
            private: 0,
            waiting: VecDeque::new(),
            waiting_prefill_s: 0.0,
            running: 0,
            line_free_at: 0.0,
            prefilling: false,
        }
    }

    /// Requests waiting to start: the queue signal the gateway polls.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Prompt tokens of `request` the cache holds now: its longest resident prefix, and the
    /// answer of the turn it extends when that turn's last block is resident too (the
    /// answer's blocks are taken to live and go with it).
    pub fn cached_tokens(&self, request: &TraceRequest) -> u64 {
        let held = request
            .blocks
            .iter()
            .take_while(|id| self.resident.contains_key(id))
            .count();
        held_tokens(request, held, |last| self.resident.contains_key(&last))
    }

    /// Seconds from `now` to `request`'s first token if it were sent here now, with the
    /// cache as it is now: the prefill in progress, the waiting requests' prefills, and its
    /// own. Slots and memory are not waited for (the oracle's estimate).
    pub fn predicted_ttft(&self, request: &TraceRequest, now: f64) -> f64 {
        let line = (self.line_free_at - now).max(0.0);
        let own = self
            .model
            .prefill_seconds(request.input_tokens - self.cached_tokens(request));
        line + self.waiting_prefill_s + own
    }

    /// Queues `request` (trace position `id`).
    pub fn enqueue(&mut self, id: usize, request: &TraceRequest) {
        self.waiting_prefill_s += self
            .model
            .prefill_seconds(request.input_tokens - self.cached_tokens(request));
        self.waiting.push_back(id);
    }

    /// Starts the head of the queue if it can start at `now`: the prefill line is free, a
    /// slot is free and its blocks fit (cached blocks are evicted to make room).
    pub fn start_next(&mut self, trace: &[TraceRequest], now: f64) -> Option<Started> {
        if self.prefilling || self.running >= self.model.max_running {
            return None;
        }
        let &id = self.waiting.front()?;
        let request = &trace[id];
        let private = EngineModel::blocks_needed(request) - request.blocks.len();
        let (mut new, mut reused_evictable) = (private, 0);
        for block in &request.blocks {
            match self.resident.get(block) {
                None => new += 1,
                Some(0) => reused_evictable += 1,
                Some(_) => {}
            }
        }
        let mut free = self
            .capacity
            .saturating_sub(self.resident.len() + self.private);
        if new > free + (self.evictable.len() - reused_evictable) {
            return None;
        }
        self.waiting.pop_front();
        let cached_tokens = self.cached_tokens(request);
        let seconds = self
            .model
            .prefill_seconds(request.input_tokens - cached_tokens);
        self.waiting_prefill_s = if self.waiting.is_empty() {
            // Start from a clean sum so rounding does not accumulate.
            0.0
        } else {
            (self.waiting_prefill_s - seconds).max(0.0)
        };
        // The earlier turn's answer it found was used now: the last to go.
        if let Some(extends) = request.extends {
            self.evictable.promote(&extends.last_block);
        }
        // Pin what is resident first, so that making room never evicts the request's own
        // blocks; then evict for the rest. Ids within a request are distinct (the trace
        // reader refuses repeats), so each block is counted once.
        for block in &request.blocks {
            if let Some(refs) = self.resident.get_mut(block) {
                if *refs == 0 {
                    self.evictable.pop(block);
                }
                *refs += 1;
            }
        }
        while free < new {
            let Some((block, ())) = self.evictable.pop_lru() else {
                break;
            };
            self.resident.remove(&block);
            free += 1;
        }
        for &block in &request.blocks {
            self.resident.entry(block).or_insert(1);
        }
        self.private += private;
        self.running += 1;
        self.prefilling = true;
        self.line_free_at = now + seconds;
        Some(Started {
            request: id,
            cached_tokens,
            first_token_at: self.line_free_at,
        })
    }

    /// The prefill in progress has ended.
    pub fn end_prefill(&mut self) {
        self.prefilling = false;
    }

    /// `request` has decoded its last token: its slot and blocks are free, its prompt
    /// blocks stay cached, the tail least recent.
    pub fn finish(&mut self, request: &TraceRequest) {
        for &block in request.blocks.iter().rev() {
            if let Some(refs) = self.resident.get_mut(&block) {
                *refs -= 1;
                if *refs == 0 {
                    self.evictable.put(block, ());
                }
            }
        }
        self.private -= EngineModel::blocks_needed(request) - request.blocks.len();
        self.running -= 1;
    }
}

#[cfg(test)]
// Hand-computed times are sums of exactly representable values.
#[allow(clippy::float_cmp)]
pub(crate) mod tests {
    use super::*;

    /// A request of the engines' tests (the slot engine's too): arriving at 0, 512-token
    /// blocks.
    pub(crate) fn request(input_tokens: u64, output_tokens: u64, blocks: &[u64]) -> TraceRequest {
        TraceRequest {
            arrival_ms: 0,
            input_tokens,
            output_tokens,
            blocks: blocks.to_vec(),
            block_tokens: crate::trace::TRACE_BLOCK_TOKENS,
            extends: None,
            conversation: None,
        }
    }

    /// 1000 tokens/s prefill, 0.5 s overhead, 10 tokens/s decode, `blocks` of memory.
    fn model(blocks: u64) -> EngineModel {
        EngineModel {
            kind: EngineKind::Batching,
            slots: 2,
            host_cache_tokens: 0,
            one_prefill_at_a_time: false,
            llama_cpp_host_cache: false,
            block_tokens: TRACE_BLOCK_TOKENS,
            kv_tokens: blocks * TRACE_BLOCK_TOKENS,
            max_running: 4,
            prefill_tps: 1000.0,
            prefill_overhead_s: 0.5,
            decode_tps: 10.0,
            answers_cached: false,
        }
    }

    #[test]
    fn a_cold_engine_prefills_the_whole_prompt() {
        let trace = [request(1500, 10, &[1, 2, 3])];
        let mut engine = BatchingEngine::new(model(16));
        engine.enqueue(0, &trace[0]);
        assert_eq!(engine.waiting(), 1);
        let started = engine.start_next(&trace, 2.0).unwrap();
        // 0.5 s + 1500 / 1000 s.
        assert_eq!(
            started,
            Started {
                request: 0,
                cached_tokens: 0,
                first_token_at: 4.0
            }
        );
        assert_eq!(engine.waiting(), 0);
    }

    #[test]
    fn a_warm_engine_prefills_only_the_uncached_tail() {
        let trace = [request(1024, 10, &[1, 2]), request(1500, 10, &[1, 2, 3])];
        let mut engine = BatchingEngine::new(model(16));
        engine.enqueue(0, &trace[0]);
        engine.start_next(&trace, 0.0).unwrap();
        engine.end_prefill();
        engine.finish(&trace[0]);
        assert_eq!(engine.cached_tokens(&trace[1]), 1024);
        engine.enqueue(1, &trace[1]);
        let started = engine.start_next(&trace, 10.0).unwrap();
        // 0.5 s + (1500 - 1024) / 1000 s.
        assert_eq!(started.cached_tokens, 1024);
        assert!((started.first_token_at - 10.976).abs() < 1e-9);
    }

    #[test]
    fn a_turn_finds_the_earlier_turns_tail_and_answer_while_its_last_block_is_resident() {
        let earlier = request(1124, 50, &[1, 2, 3]);
        let trace = crate::trace::with_answers(&[
            earlier.clone(),
            request(2048, 10, &[1, 2, 4, 5]),
            request(500, 1, &[7]),
        ]);
        let mut engine = BatchingEngine::new(model(5));
        engine.enqueue(0, &trace[0]);
        engine.start_next(&trace, 0.0).unwrap();
        engine.end_prefill();
        engine.finish(&trace[0]);
        // Its two full blocks, the 100-token tail and the 50-token answer.
        assert_eq!(engine.cached_tokens(&trace[1]), 1174);
        engine.enqueue(1, &trace[1]);
        let started = engine.start_next(&trace, 10.0).unwrap();
        assert_eq!(started.cached_tokens, 1174);
        // 0.5 s + (2048 - 1174) / 1000 s.
        assert!((started.first_token_at - 11.374).abs() < 1e-9);
        engine.end_prefill();
        engine.finish(&trace[1]);
        // Memory for five blocks: the third request (one block, with its answer) evicts the
        // least recent, block 3 (the next turn's were used later), and the tail goes with it.
        engine.enqueue(2, &trace[2]);
        engine.start_next(&trace, 20.0).unwrap();
        assert_eq!(engine.cached_tokens(&trace[1]), 2048, "its own blocks");
        let again = crate::trace::with_answers(&[earlier, request(2048, 10, &[1, 2, 8, 9])]);
        assert_eq!(engine.cached_tokens(&again[1]), 1024, "the tail is gone");
    }

    #[test]
    fn at_capacity_the_least_recently_used_blocks_go_tail_first() {
        // Four blocks of memory. A ran and finished (blocks 1, 2 cached), then B (3, 4).
        let trace = [
            request(1000, 1, &[1, 2]),
            request(1000, 1, &[3, 4]),
            request(500, 1, &[5]),
            request(1000, 1, &[1, 2]),
            request(1000, 1, &[3, 4]),
        ];
        let mut engine = BatchingEngine::new(model(4));
        for id in [0, 1] {
            engine.enqueue(id, &trace[id]);
            engine.start_next(&trace, 0.0).unwrap();
            engine.end_prefill();
            engine.finish(&trace[id]);
        }
        // C needs one block: A's tail (block 2) is the least recent and goes.
        engine.enqueue(2, &trace[2]);
        engine.start_next(&trace, 1.0).unwrap();
        engine.end_prefill();
        assert_eq!(
            engine.cached_tokens(&trace[3]),
            512,
            "A keeps its head block"
        );
        assert_eq!(engine.cached_tokens(&trace[4]), 1000, "B is whole");
    }

    #[test]
    fn a_full_engine_queues_and_the_queue_is_the_waiting_count() {
        let trace = [request(1000, 10, &[1, 2]), request(1000, 10, &[3, 4])];
        let mut engine = BatchingEngine::new(model(16));
        engine.enqueue(0, &trace[0]);
        engine.enqueue(1, &trace[1]);
        assert_eq!(engine.waiting(), 2);
        let first = engine.start_next(&trace, 0.0).unwrap();
        assert_eq!(first.first_token_at, 1.5);
        // One prefill at a time: the second waits for the line.
        assert_eq!(engine.start_next(&trace, 0.0), None);
        assert_eq!(engine.waiting(), 1);
        // The oracle's estimate for a third, cold 1000-token prompt at 0.5 s: 1.0 s left
        // of the prefill in progress, 1.5 s for the waiting one, 1.5 s of its own.
        let third = request(1000, 10, &[5, 6]);
        assert_eq!(engine.predicted_ttft(&third, 0.5), 4.0);
        engine.end_prefill();
        let second = engine.start_next(&trace, 1.5).unwrap();
        assert_eq!(second.first_token_at, 3.0);
        assert_eq!(engine.waiting(), 0);
    }

    #[test]
    fn memory_held_by_running_requests_makes_the_head_wait() {
        // Three blocks of memory; the first request holds two (one prompt, one output).
        let trace = [request(500, 100, &[1]), request(1024, 1, &[2, 3])];
        let mut engine = BatchingEngine::new(model(3));
        engine.enqueue(0, &trace[0]);
        engine.start_next(&trace, 0.0).unwrap();
        engine.end_prefill();
        engine.enqueue(1, &trace[1]);
        assert_eq!(
            engine.start_next(&trace, 1.0),
            None,
            "needs 2 blocks, 1 free"
        );
        engine.finish(&trace[0]);
        assert!(engine.start_next(&trace, 2.0).is_some());
    }
}
