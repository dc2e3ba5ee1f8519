//! The slot engine model: a llama.cpp-like server started with `--parallel N`, in virtual
//! time.
//!
//! - **Slots**: `slots` of them, each running one request at a time and holding, between
//!   requests, the KV cache of the last prompt it ran (as block ids of the trace).
//! - **Which slot**: a request that can start takes the idle slot whose held prompt shares
//!   the longest prefix with its own; when none shares any, the idle slot used least
//!   recently. That is what llama.cpp's server does by default (`get_available_slot`: the
//!   best longest-common-prefix similarity among idle slots, else the least recently used
//!   one); its similarity threshold (`--slot-prompt-similarity`, 0.1 of the prompt) is
//!   modelled only with `llama_cpp_host_cache`, below. Its hit is that shared prefix.
//! - **Host prompt cache** (`host_cache_tokens`, llama.cpp's `--cache-ram`): when a slot
//!   takes a new prompt that does not extend the one it held, the old one is saved to a
//!   cache in host memory of that many tokens, least recently used (saved or restored) out
//!   first; a request whose prefix a saved prompt shares further than the chosen slot's is
//!   restored from it. 0 turns it off.
//! - **llama.cpp's use of the host cache** (`llama_cpp_host_cache`,
//!   `--llama-cpp-host-cache`), instead of the two items above, as its server's
//!   `get_available_slot` does (`tools/server/server-context.cpp`): when a request starts,
//!   every idle slot's prompt is saved to the host cache (`--cache-idle-slots`, on by
//!   default). The request takes the idle slot sharing the longest prefix with it if that
//!   is more than a tenth of its prompt (`--slot-prompt-similarity`), else the least
//!   recently used one. Only when the slot was picked by least recent use, or keeps under
//!   half of the tokens it held (`f_keep < 0.5`), is the host cache searched: a saved
//!   prompt sharing more with the request than the slot does, of which at least a quarter
//!   is kept, is moved into the slot (and out of the cache); with none, the slot starts
//!   empty. Otherwise the slot keeps the shared prefix and drops the rest, whatever the
//!   host cache holds: a conversation whose slot another took finds only what the slot it
//!   lands on shares with it.
//! - **Waiting queue**: requests wait, first come first served, while every slot is busy;
//!   their count is the queue signal (`llamacpp:requests_deferred`).
//! - **Prefill and decode** per slot, side by side: `prefill_overhead_s` plus the uncached
//!   tokens at `prefill_tps`, then `output_tokens / decode_tps`. The slot is busy until the
//!   last token. Slots do not slow each other: on one CPU thread they do, and the speeds to
//!   give are what one slot reaches while the others run (docs/routing.md, "The slot engine model").
//! - **One prefill at a time** (`one_prefill_at_a_time`, `--one-prefill-at-a-time`): the
//!   slots share one prefill line instead, at the engine's `prefill_tps`. The head of the
//!   queue starts only when no prompt is being prefilled, as llama.cpp's server fills each
//!   pass with every slot's prompt tokens and a request arriving during a pass waits for
//!   it; decoding stays side by side. A request waiting only for the line is not deferred.

use std::collections::VecDeque;

use super::engine::{EngineModel, Started};
use super::trace::{TraceRequest, held_tokens};

/// One slot.
#[derive(Debug, Clone)]
struct Slot {
    /// The blocks of the prompt whose KV it holds.
    prompt: Vec<u64>,
    /// The request running in it.
    running: Option<usize>,
    /// When its request ends (its last token), while it runs.
    ends_at: f64,
    /// When it last started a request (least recently used first out).
    used: u64,
    /// Tokens it holds: its last request's prompt and answer.
    tokens: u64,
}

/// How a request would take an idle slot ([`SlotEngine::choose`]).
#[derive(Debug, Clone, Copy)]
struct Choice {
    slot: usize,
    /// Prompt tokens it finds cached, in the slot or restored from the host cache.
    cached: u64,
    /// The saved prompt it is restored from, if one.
    restored: Option<usize>,
}

/// The share of a request's prompt an idle slot must share with it to be picked for
/// that: llama.cpp's `--slot-prompt-similarity` default.
const SLOT_PROMPT_SIMILARITY: f64 = 0.1;

/// A prompt saved in host memory: its blocks and their tokens.
#[derive(Debug, Clone)]
struct Saved {
    blocks: Vec<u64>,
    tokens: u64,
    used: u64,
}

/// One slot engine's state.
#[derive(Debug)]
pub struct SlotEngine {
    model: EngineModel,
    slots: Vec<Slot>,
    waiting: VecDeque<usize>,
    host: Vec<Saved>,
    host_tokens: u64,
    clock: u64,
    /// With one prefill at a time, when the prompt being prefilled gets its first token:
    /// nothing else starts until then.
    prefill_ends: Option<f64>,
}

/// Blocks `a` and `b` share from the start.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens of `request` a slot or saved prompt holding `prompt` (after its answer) holds:
/// the blocks they share, and the answer of the turn `request` extends when `prompt` is
/// that turn's.
fn shared_tokens(prompt: &[u64], request: &TraceRequest) -> u64 {
    let shared = common_prefix(prompt, &request.blocks);
    held_tokens(request, shared, |last| prompt.last() == Some(&last))
}

/// Whether `request` begins with all of `prompt` and its answer, so a slot holding it keeps
/// it and prefills only the rest.
fn extends_whole(prompt: &[u64], request: &TraceRequest) -> bool {
    let shared = common_prefix(prompt, &request.blocks);
    shared == prompt.len()
        || request
            .extends
            .is_some_and(|e| shared == e.full_blocks && prompt.last() == Some(&e.last_block))
}

impl SlotEngine {
    /// An idle engine with empty slots and an empty host cache.
    pub fn new(model: EngineModel) -> Self {
        Self {
            model,
            slots: vec![
                Slot {
                    prompt: Vec::new(),
                    running: None,
                    ends_at: 0.0,
                    used: 0,
                    tokens: 0,
                };
                model.slots.max(1)
            ],
            waiting: VecDeque::new(),
            host: Vec::new(),
            host_tokens: 0,
            clock: 0,
            prefill_ends: None,
        }
    }

    /// Its slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Requests waiting for a slot: those queued beyond the idle slots (a request
    /// waiting only for the prefill in progress has a slot to take when it ends).
    pub fn waiting(&self) -> usize {
        let idle = self.slots.iter().filter(|s| s.running.is_none()).count();
        self.waiting.len().saturating_sub(idle)
    }

    /// The idle slot `request` would take, and the prompt tokens it would find cached there
    /// (from the slot or the host cache); `None` when every slot is busy.
    fn choose(&self, request: &TraceRequest) -> Option<Choice> {
        if self.model.llama_cpp_host_cache {
            return self.choose_as_llama_cpp(request);
        }
        let (slot, shared) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.running.is_none())
            .map(|(i, s)| (i, shared_tokens(&s.prompt, request), s.used))
            // The longest shared prefix; among equals (none shared, say) the least used.
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
            .map(|(i, shared, _)| (i, shared))?;
        let restorable = self
            .restorable(request)
            .filter(|&(_, tokens)| tokens > shared);
        Some(Choice {
            slot,
            cached: restorable.map_or(shared, |(_, tokens)| tokens),
            restored: restorable.map(|(i, _)| i),
        })
    }

    /// [`choose`](Self::choose) as llama.cpp's server picks a slot and searches its host
    /// cache (the module's `llama_cpp_host_cache`).
    fn choose_as_llama_cpp(&self, request: &TraceRequest) -> Option<Choice> {
        let idle = || {
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.running.is_none())
        };
        let similar = idle()
            .filter(|(_, s)| !s.prompt.is_empty())
            .map(|(i, s)| (i, shared_tokens(&s.prompt, request), s.used))
            .filter(|&(_, shared, _)| {
                shared as f64 > SLOT_PROMPT_SIMILARITY * request.input_tokens as f64
            })
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)));
        let (slot, shared, search) = if let Some((i, shared, _)) = similar {
            // Keeping under half of what it held, the slot is saved and the cache searched.
            (i, shared, 2 * shared < self.slots[i].tokens)
        } else {
            let (i, s) = idle().min_by_key(|(_, s)| s.used)?;
            (i, shared_tokens(&s.prompt, request), true)
        };
        if !search || self.model.host_cache_tokens == 0 || self.slots[slot].prompt.is_empty() {
            return Some(Choice {
                slot,
                cached: shared,
                restored: None,
            });
        }
        // A saved prompt sharing more than the slot, of which a quarter or more is kept.
        let better = self
            .host
            .iter()
            .enumerate()
            .map(|(i, saved)| (i, shared_tokens(&saved.blocks, request), saved.tokens))
            .filter(|&(_, tokens, held)| tokens > shared && 4 * tokens >= held)
            .max_by_key(|&(_, tokens, _)| tokens);
        Some(Choice {
            slot,
            cached: better.map_or(0, |(_, tokens, _)| tokens),
            restored: better.map(|(i, _, _)| i),
        })
    }

    /// The saved prompt sharing the longest prefix with `request`'s, and how many tokens.
    fn restorable(&self, request: &TraceRequest) -> Option<(usize, u64)> {
        self.host
            .iter()
            .enumerate()
            .map(|(i, saved)| (i, shared_tokens(&saved.blocks, request)))
            .filter(|&(_, tokens)| tokens > 0)
            .max_by_key(|&(_, tokens)| tokens)
    }

    /// Prompt tokens of `request` it would find cached if it started now (0 when every
    /// slot is busy: which slot frees first decides).
    pub fn cached_tokens(&self, request: &TraceRequest) -> u64 {
        self.choose(request).map_or(0, |choice| choice.cached)
    }

    /// Seconds from `now` to `request`'s first token if it were sent here now: the slots
    /// free up in order of their running requests' ends, the waiting requests take them
    /// first (each priced at a cold prefill and its decode), then this one prefills.
    pub fn predicted_ttft(&self, request: &TraceRequest, now: f64, trace: &[TraceRequest]) -> f64 {
        let mut free: Vec<f64> = self
            .slots
            .iter()
            .map(|s| {
                if s.running.is_some() {
                    s.ends_at.max(now)
                } else {
                    now
                }
            })
            .collect();
        // Whether a slot is idle now: the request would take it, holding what it holds,
        // once the line is free.
        let idle_now = free.iter().any(|&at| at <= now);
        let mut line = self.prefill_ends.map_or(now, |ends| ends.max(now));
        for &id in &self.waiting {
            let Some((k, at)) = free
                .iter()
                .copied()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
            else {
                break;
            };
            let queued = &trace[id];
            let first_token = if self.model.one_prefill_at_a_time {
                line = at.max(line) + self.model.prefill_seconds(queued.input_tokens);
                line
            } else {
                at + self.model.prefill_seconds(queued.input_tokens)
            };
            free[k] = first_token + queued.output_tokens as f64 / self.model.decode_tps;
        }
        let start = free.iter().copied().fold(f64::INFINITY, f64::min).max(line);
        let cached = if idle_now && self.waiting.is_empty() {
            self.cached_tokens(request)
        } else {
            0
        };
        start - now + self.model.prefill_seconds(request.input_tokens - cached)
    }

    /// Queues `request` (trace position `id`).
    pub fn enqueue(&mut self, id: usize) {
        self.waiting.push_back(id);
    }

    /// Starts the head of the queue in an idle slot, if one is idle at `now` (and, with
    /// one prefill at a time, no other prompt is being prefilled).
    pub fn start_next(&mut self, trace: &[TraceRequest], now: f64) -> Option<Started> {
        if self.prefill_ends.is_some() {
            return None;
        }
        let &id = self.waiting.front()?;
        let request = &trace[id];
        let Choice {
            slot,
            cached: cached_tokens,
            restored,
        } = self.choose(request)?;
        self.waiting.pop_front();
        if self.model.llama_cpp_host_cache {
            // A restored prompt moves into the slot; then every idle slot is saved (the
            // one taken included), as a new task makes llama.cpp's server do.
            if let Some(i) = restored {
                self.host_tokens -= self.host.swap_remove(i).tokens;
            }
            if self.model.host_cache_tokens > 0 {
                let idle: Vec<Vec<u64>> = self
                    .slots
                    .iter()
                    .filter(|s| s.running.is_none() && !s.prompt.is_empty())
                    .map(|s| s.prompt.clone())
                    .collect();
                for prompt in idle {
                    self.save(prompt);
                }
            }
            self.slots[slot].prompt.clone_from(&request.blocks);
        } else {
            // A prompt restored from the host cache was used now: it is the most recent
            // there.
            if let Some(i) = restored {
                self.clock += 1;
                self.host[i].used = self.clock;
            }
            let old = std::mem::replace(&mut self.slots[slot].prompt, request.blocks.clone());
            // The slot's old prompt is saved unless the new one extends it (the slot keeps
            // it).
            let extended = extends_whole(&old, request);
            if self.model.host_cache_tokens > 0 && !old.is_empty() && !extended {
                self.save(old);
            }
        }
        let first_token_at = now
            + self
                .model
                .prefill_seconds(request.input_tokens - cached_tokens);
        self.clock += 1;
        let s = &mut self.slots[slot];
        s.running = Some(id);
        s.used = self.clock;
        s.tokens = request.input_tokens + request.output_tokens;
        s.ends_at = first_token_at + request.output_tokens as f64 / self.model.decode_tps;
        if self.model.one_prefill_at_a_time {
            self.prefill_ends = Some(first_token_at);
        }
        Some(Started {
            request: id,
            cached_tokens,
            first_token_at,
        })
    }

    /// Saves a slot's prompt to the host cache, evicting the least recently used.
    fn save(&mut self, blocks: Vec<u64>) {
        // Tokens as the trace counts them: whole blocks (the last one's size is not known
        // here, so it counts whole too).
        let tokens = blocks.len() as u64 * self.model.block_tokens;
        if tokens > self.model.host_cache_tokens {
            return;
        }
        self.clock += 1;
        if let Some(same) = self.host.iter_mut().find(|s| s.blocks == blocks) {
            same.used = self.clock;
            return;
        }
        while self.host_tokens + tokens > self.model.host_cache_tokens {
            let Some(oldest) = self
                .host
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.used)
                .map(|(i, _)| i)
            else {
                break;
            };
            self.host_tokens -= self.host.swap_remove(oldest).tokens;
        }
        self.host_tokens += tokens;
        self.host.push(Saved {
            blocks,
            tokens,
            used: self.clock,
        });
    }

    /// The prefill in progress has ended: with one prefill at a time, the next waiting
    /// request may start.
    pub fn end_prefill(&mut self) {
        self.prefill_ends = None;
    }

    /// Trace request `id` has decoded its last token: its slot is idle, holding its prompt.
    pub fn finish(&mut self, id: usize) {
        if let Some(slot) = self.slots.iter_mut().find(|s| s.running == Some(id)) {
            slot.running = None;
        }
    }
}

#[cfg(test)]
// Hand-computed times are sums of exactly representable values.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;
    use crate::engine::EngineKind;
    use crate::engine::tests::request;

    /// Two slots, 1000 tokens/s prefill, 0.5 s overhead, 10 tokens/s decode.
    fn model(host_cache_tokens: u64) -> EngineModel {
        EngineModel {
            kind: EngineKind::Slots,
            slots: 2,
            host_cache_tokens,
            prefill_tps: 1000.0,
            prefill_overhead_s: 0.5,
            decode_tps: 10.0,
            ..EngineModel::default()
        }
    }

    fn run(engine: &mut SlotEngine, trace: &[TraceRequest], id: usize, now: f64) -> Started {
        engine.enqueue(id);
        engine.start_next(trace, now).unwrap()
    }

    #[test]
    fn a_follow_up_takes_the_slot_holding_its_prefix_and_prefills_only_its_tail() {
        let trace = [
            request(1024, 10, &[1, 2]),
            request(1024, 10, &[7, 8]),
            request(1500, 10, &[1, 2, 3]),
        ];
        let mut engine = SlotEngine::new(model(0));
        let a = run(&mut engine, &trace, 0, 0.0);
        assert_eq!((a.cached_tokens, a.first_token_at), (0, 1.524));
        let b = run(&mut engine, &trace, 1, 0.0);
        assert_eq!(b.cached_tokens, 0);
        engine.finish(0);
        engine.finish(1);
        // Both idle: the follow-up of the first takes the first's slot.
        let c = run(&mut engine, &trace, 2, 10.0);
        assert_eq!(c.cached_tokens, 1024);
        assert!((c.first_token_at - 10.976).abs() < 1e-9);
    }

    #[test]
    fn as_llama_cpp_a_turn_landing_on_a_slot_that_keeps_over_half_finds_only_what_it_shares() {
        // Conversations a, b and c behind one two-block system prompt (blocks 1 and 2),
        // on two slots and a host cache.
        let trace = [
            request(1536, 10, &[1, 2, 3]),       // a's first turn
            request(2048, 10, &[1, 2, 3, 4]),    // a's second
            request(1536, 10, &[1, 2, 7]),       // b's first
            request(1536, 10, &[1, 2, 9]),       // c's first
            request(2560, 10, &[1, 2, 3, 4, 5]), // a's third
        ];
        let llama_cpp = EngineModel {
            llama_cpp_host_cache: true,
            ..model(8192)
        };
        let mut engine = SlotEngine::new(llama_cpp);
        assert_eq!(run(&mut engine, &trace, 0, 0.0).cached_tokens, 0);
        engine.finish(0);
        // Slot 0 shares 1,536 of a's second turn and keeps all it held.
        assert_eq!(run(&mut engine, &trace, 1, 10.0).cached_tokens, 1536);
        // Slot 1, empty, is the least recently used.
        assert_eq!(run(&mut engine, &trace, 2, 10.0).cached_tokens, 0);
        engine.finish(1);
        engine.finish(2);
        // c shares the system prompt with both slots and takes the one used least lately,
        // a's, which would keep under half of its 2,058 tokens: the host cache holds
        // nothing sharing more, so the slot starts empty.
        assert_eq!(run(&mut engine, &trace, 3, 20.0).cached_tokens, 0);
        // a's third turn takes b's slot, which keeps 1,024 of its 1,546 tokens: more than
        // half, so the host cache, which holds a's second turn, is not searched.
        let third = &trace[4];
        assert_eq!(engine.cached_tokens(third), 1024);
        // The default model restores a's second turn from the host cache.
        let mut restoring = SlotEngine::new(model(8192));
        for (id, now) in [(0, 0.0), (1, 10.0), (2, 10.0)] {
            run(&mut restoring, &trace, id, now);
            if id == 0 {
                restoring.finish(0);
            }
        }
        restoring.finish(1);
        restoring.finish(2);
        run(&mut restoring, &trace, 3, 20.0);
        assert_eq!(restoring.cached_tokens(third), 2048);
    }

    #[test]
    fn a_turn_extending_a_slots_prompt_and_answer_finds_both_and_the_slot_keeps_them() {
        let trace = crate::trace::with_answers(&[
            request(1124, 50, &[1, 2, 3]),
            request(2048, 10, &[1, 2, 4, 5]),
            request(1124, 1, &[1, 2, 6]),
        ]);
        let mut engine = SlotEngine::new(model(8192));
        run(&mut engine, &trace, 0, 0.0);
        engine.finish(0);
        // The slot holds the first turn's prompt and answer: two full blocks, the 100-token
        // tail and the 50-token answer.
        let next = run(&mut engine, &trace, 1, 10.0);
        assert_eq!(next.cached_tokens, 1174);
        // The slot extended its prompt: nothing was saved to the host cache.
        assert_eq!(engine.host_tokens, 0);
        engine.finish(1);
        // Another conversation behind the same two blocks finds only those.
        assert_eq!(engine.cached_tokens(&trace[2]), 1024);
    }

    #[test]
    fn with_every_slot_busy_a_request_waits_and_counts_as_deferred() {
        let trace = [
            request(512, 10, &[1]),
            request(512, 10, &[2]),
            request(512, 10, &[3]),
        ];
        let mut engine = SlotEngine::new(model(0));
        run(&mut engine, &trace, 0, 0.0);
        run(&mut engine, &trace, 1, 0.0);
        engine.enqueue(2);
        assert_eq!(engine.start_next(&trace, 0.0), None);
        assert_eq!(engine.waiting(), 1);
        // Both slots end at 0.5 + 0.512 + 1.0 = 2.012 s; the waiting one takes the first,
        // a fourth the other, and prefills cold: 2.012 + 1.012 s.
        let fourth = request(512, 10, &[4]);
        assert!((engine.predicted_ttft(&fourth, 0.0, &trace) - 3.024).abs() < 1e-9);
        engine.finish(0);
        let started = engine.start_next(&trace, 2.012).unwrap();
        assert_eq!(started.request, 2);
        assert_eq!(engine.waiting(), 0);
    }

    #[test]
    fn one_prefill_at_a_time_makes_a_request_arriving_during_a_prefill_wait_for_it() {
        let trace = [
            request(1000, 10, &[1, 2]),
            request(500, 10, &[3]),
            request(500, 10, &[4]),
        ];
        let one_at_a_time = EngineModel {
            one_prefill_at_a_time: true,
            ..model(0)
        };
        let mut engine = SlotEngine::new(one_at_a_time);
        let a = run(&mut engine, &trace, 0, 0.0);
        assert_eq!(a.first_token_at, 1.5);
        // A slot is idle, but the engine is prefilling: the second request waits, and as it
        // has a slot to take it is not deferred.
        engine.enqueue(1);
        assert_eq!(engine.start_next(&trace, 0.25), None);
        assert_eq!(engine.waiting(), 0);
        // Predicted from 0.25 s: the prefill in progress, the waiting one's, then its own.
        assert!((engine.predicted_ttft(&trace[2], 0.25, &trace) - 3.25).abs() < 1e-9);
        engine.end_prefill();
        let b = engine.start_next(&trace, 1.5).unwrap();
        assert_eq!((b.request, b.first_token_at), (1, 2.5));
        // Each slot on its own, the same request starts at once.
        let mut engine = SlotEngine::new(model(0));
        run(&mut engine, &trace, 0, 0.0);
        assert_eq!(run(&mut engine, &trace, 1, 0.25).first_token_at, 1.25);
    }

    #[test]
    fn a_new_prompt_takes_the_least_recently_used_idle_slot_and_evicts_its_prompt() {
        let trace = [
            request(512, 1, &[1]),
            request(512, 1, &[2]),
            request(512, 1, &[3]),
            request(512, 1, &[1]),
            request(512, 1, &[2]),
        ];
        let mut engine = SlotEngine::new(model(0));
        for id in [0, 1] {
            run(&mut engine, &trace, id, 0.0);
            engine.finish(id);
        }
        // The third prompt shares nothing: it takes the slot of the first (used first).
        run(&mut engine, &trace, 2, 1.0);
        engine.finish(2);
        assert_eq!(run(&mut engine, &trace, 3, 2.0).cached_tokens, 0, "evicted");
        engine.finish(3);
        assert_eq!(
            run(&mut engine, &trace, 4, 3.0).cached_tokens,
            0,
            "evicted by the 4th"
        );
    }

    #[test]
    fn the_host_cache_restores_a_prompt_a_slot_gave_up() {
        let trace = [
            request(1024, 1, &[1, 2]),
            request(512, 1, &[3]),
            request(512, 1, &[4]),
            request(1500, 1, &[1, 2, 5]),
        ];
        let mut engine = SlotEngine::new(model(4096));
        for id in [0, 1, 2] {
            run(&mut engine, &trace, id, id as f64);
            engine.finish(id);
        }
        // The first prompt's slot went to the third request; the host cache kept it.
        let follow_up = run(&mut engine, &trace, 3, 5.0);
        assert_eq!(follow_up.cached_tokens, 1024);
        // Without the host cache it is gone.
        let mut engine = SlotEngine::new(model(0));
        for id in [0, 1, 2] {
            run(&mut engine, &trace, id, id as f64);
            engine.finish(id);
        }
        assert_eq!(run(&mut engine, &trace, 3, 5.0).cached_tokens, 0);
    }

    #[test]
    fn the_host_cache_holds_at_most_its_tokens_least_recently_used_out() {
        let mut engine = SlotEngine::new(model(1024));
        engine.save(vec![1]);
        engine.save(vec![2]);
        engine.save(vec![3]);
        assert_eq!(engine.host_tokens, 1024);
        let held: Vec<_> = engine.host.iter().map(|s| s.blocks[0]).collect();
        assert!(
            held.contains(&2) && held.contains(&3) && !held.contains(&1),
            "{held:?}"
        );
        // A prompt larger than the whole cache is not saved.
        engine.save(vec![4, 5, 6]);
        assert_eq!(engine.host_tokens, 1024);
    }
}
