//! Engine feedback: what the engines say they served from cache, per cluster.
//!
//! The prefix index predicts which cluster holds a prompt; only the engine knows how much
//! of it it really served from its KV cache. Every answer of the Chat, Completions,
//! Responses and Anthropic APIs says so in its `usage` ([`PromptUsage::of`] lists the
//! fields). [`FeedbackLayer`] sits right outside the balancer, where answers carry
//! [`Served`](crate::route::Served), and reads that usage from every 2xx answer to a
//! `POST` of one of those APIs ([`Api::of_request`](crate::keying::Api::of_request)) as its
//! body passes, without holding any of it back: a copy of a JSON answer (up to
//! [`MAX_JSON_BYTES`]) is parsed when the body ends, and each `data:` line of a
//! server-sent event stream (up to [`MAX_EVENT_LINE_BYTES`]) as it completes, the last
//! usage seen counting. It counts
//! `grid_route_prompt_tokens_total{site,cluster}` and
//! `grid_route_cached_prompt_tokens_total{site,cluster}`, whose ratio is the share of the
//! prompt the engines of a cluster served from cache.
//!
//! # Engine feedback into the index
//!
//! For a sticky or session request, affinity leaves a [`PredictedMatch`](crate::route::PredictedMatch):
//! the depth the serving cluster holds the prompt to. The layer counts what that predicts
//! ([`predicted_tokens`], the matched bytes at 4 bytes a token) in
//! `grid_route_predicted_cached_tokens_total{site,cluster}` and what the engine reported in
//! `grid_route_delivered_cached_tokens_total{site,cluster}`. Built with
//! [`FeedbackLayer::with_affinity`], it also makes the index follow the engine's truth. When the
//! engine delivered less than [`FORGET_BELOW_SHARE`] of the prediction ([`fell_short`]), it
//! evicted the prompt since the index recorded it; engines evict least recently used
//! first, so whatever the index recorded at that cluster before the prompt's deepest
//! matched key is gone from the engine too, and the index forgets it, for that cluster
//! alone ([`PrefixIndex::forget_older`](crate::index::PrefixIndex::forget_older)). The
//! prompt itself stays: the engine has just prefilled it, and confirmation recorded it
//! again at the response head (a stream's at its first output). The index thus shrinks to
//! what the engine really keeps, and conversations whose prefixes are gone route by load
//! instead of piling onto an
//! engine that no longer holds them. A conversation's first turn that asked its cluster
//! for a short shared head ([`PredictedMatch::asks_shared_head`](crate::route::PredictedMatch::asks_shared_head))
//! counts the same verdict ([`fell_short`] or not) into the cluster's tally of whether its
//! engines keep such heads ([`count_shared_head`]), published as
//! `grid_route_shared_head_found_share{site,cluster}`.
//!
//! Answers without a usage (a stream without `stream_options.include_usage`, an error)
//! count nothing, and neither do answers to other requests: embeddings, paths added with
//! `forward_paths`, or a stored response read back or cancelled (`GET
//! /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`), whose usage is that of the
//! request that made it. So a background response (`"background": true`), whose `POST`
//! answers before the engine has counted anything, is counted only when that `POST`
//! streams; nothing is logged, and no prompt text is kept. A
//! usage without a cached count is 0 cached at a cluster whose engines have counted before
//! (vLLM leaves a 0 out) and unknown at one whose engines never have (vLLM and SGLang at
//! their defaults): it then counts its prompt tokens and teaches nothing, and the first
//! one of each cluster is logged at `warn`.
//!
//! ```
//! use grid_route_layer::feedback::PromptUsage;
//! use serde_json::json;
//!
//! // Anthropic counts cache reads apart from the (uncached) input tokens.
//! let answer = json!({"usage": {"input_tokens": 10, "cache_read_input_tokens": 90}});
//! let usage = PromptUsage::of(&answer).unwrap();
//! assert_eq!((usage.prompt_tokens, usage.cached_tokens), (100, Some(90)));
//! ```

mod body;
mod forget;
mod layer;
mod service;
mod usage;

pub use body::{FeedbackBody, SILENT_PREDICTED_ANSWERS};
pub use forget::{
    EvictionMarks, FORGET_BELOW_SHARE, count_shared_head, fell_short, predicted_tokens,
};
pub use layer::FeedbackLayer;
pub use service::{FeedbackService, ResponseFuture};
pub use usage::{
    MAX_EVENT_LINE_BYTES, MAX_JSON_BYTES, MAX_PROMPT_TOKENS, PromptUsage, UsageReader,
};

#[cfg(test)]
mod tests;
