//! The engine's own count of a request's prompt and cached tokens, read from its answer.

use serde_json::Value;

/// The longest JSON answer read for its usage: answers longer than this are forwarded
/// without a count rather than held in memory.
pub const MAX_JSON_BYTES: usize = 1 << 20;
/// The longest server-sent event line read for its usage; longer lines are skipped.
pub const MAX_EVENT_LINE_BYTES: usize = 1 << 20;

/// The largest prompt a usage counts, tokens: 2^30, a thousand times any model's context.
/// A count above it is taken as this, so an engine's garbage cannot overflow the token
/// counters or the learned prefill speed.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 30;

/// What an engine said about a request's prompt.
///
/// `#[non_exhaustive]`, so that a count engines add later is not a breaking change: build
/// it with [`PromptUsage::new`] or [`PromptUsage::without_cached`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PromptUsage {
    /// Every token of the prompt, cached or not.
    pub prompt_tokens: u64,
    /// The prompt tokens the engine served from its cache; `None` when the answer did not
    /// say. vLLM counts them only when started with `--enable-prompt-tokens-details`, and
    /// then leaves the count out when it is 0; SGLang only with `--enable-cache-report`.
    pub cached_tokens: Option<u64>,
}

impl PromptUsage {
    /// The usage in a JSON answer or in one event's payload of any of the APIs, looked
    /// for in `usage`, `response.usage` (Responses events) and `message.usage` (Anthropic's
    /// `message_start`). `None` when none of them counts prompt tokens.
    ///
    /// - Chat and Completions: `prompt_tokens`, `prompt_tokens_details.cached_tokens`.
    /// - Responses: `input_tokens`, `input_tokens_details.cached_tokens`.
    /// - Anthropic: `input_tokens` counts only the uncached part, so the prompt is
    ///   `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`, and
    ///   `cache_read_input_tokens` is what was cached.
    ///
    /// A missing cached count is `None`, not 0: the engine did not say.
    pub fn of(answer: &Value) -> Option<Self> {
        let usage = [
            &answer["usage"],
            &answer["response"]["usage"],
            &answer["message"]["usage"],
        ]
        .into_iter()
        .find(|usage| usage.is_object())?;
        let count = |field: &str| usage.get(field).and_then(Value::as_u64);
        if let Some(prompt_tokens) = count("prompt_tokens") {
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
            return Some(Self::counted(prompt_tokens, cached));
        }
        let input = count("input_tokens")?;
        if let Some(cached) = usage["input_tokens_details"]["cached_tokens"].as_u64() {
            return Some(Self::new(input, cached));
        }
        let read = count("cache_read_input_tokens");
        let created = count("cache_creation_input_tokens").unwrap_or(0);
        Some(Self::counted(
            input
                .saturating_add(read.unwrap_or(0))
                .saturating_add(created),
            read,
        ))
    }

    /// A prompt of `prompt_tokens`, `cached_tokens` of them served from the engine's
    /// cache; the prompt is capped at [`MAX_PROMPT_TOKENS`] and the cached count at the
    /// prompt's.
    pub fn new(prompt_tokens: u64, cached_tokens: u64) -> Self {
        Self::counted(prompt_tokens, Some(cached_tokens))
    }

    /// A prompt of `prompt_tokens` whose engine did not say how many were cached (capped
    /// as [`new`](Self::new) caps).
    pub fn without_cached(prompt_tokens: u64) -> Self {
        Self::counted(prompt_tokens, None)
    }

    fn counted(prompt_tokens: u64, cached_tokens: Option<u64>) -> Self {
        let prompt_tokens = prompt_tokens.min(MAX_PROMPT_TOKENS);
        Self {
            prompt_tokens,
            cached_tokens: cached_tokens.map(|cached| cached.min(prompt_tokens)),
        }
    }
}

/// Reads a [`PromptUsage`] out of an answer's bytes as they pass, in whatever chunks they
/// come, holding at most one JSON answer or one event line of [`MAX_JSON_BYTES`] /
/// [`MAX_EVENT_LINE_BYTES`].
///
/// ```
/// use grid_route_layer::feedback::{PromptUsage, UsageReader};
///
/// let mut reader = UsageReader::new(true);
/// reader.feed(b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_to");
/// reader.feed(b"kens\":90,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n");
/// reader.feed(b"data: [DONE]\n\n");
/// let usage = reader.finish();
/// assert_eq!(usage, Some(PromptUsage::new(90, 64)));
/// ```
#[derive(Debug)]
pub struct UsageReader {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A JSON answer, collected up to the limit; `None` once it went over.
    Json(Option<Vec<u8>>),
    /// A server-sent event stream: the line being read (`None` while skipping one over the
    /// limit) and the last usage seen.
    Events {
        line: Option<Vec<u8>>,
        last: Option<PromptUsage>,
    },
}

impl UsageReader {
    /// A reader for a server-sent event stream (`event_stream`) or a JSON answer.
    pub fn new(event_stream: bool) -> Self {
        let kind = if event_stream {
            Kind::Events {
                line: Some(Vec::new()),
                last: None,
            }
        } else {
            Kind::Json(Some(Vec::new()))
        };
        Self { kind }
    }

    /// Reads the next bytes of the answer.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        match &mut self.kind {
            Kind::Json(held) => {
                if let Some(buffer) = held {
                    if buffer.len() + bytes.len() > MAX_JSON_BYTES {
                        *held = None;
                    } else {
                        buffer.extend_from_slice(bytes);
                    }
                }
            }
            Kind::Events { line, last } => {
                while !bytes.is_empty() {
                    let end = bytes.iter().position(|&b| b == b'\n');
                    let (piece, rest) = match end {
                        Some(end) => (&bytes[..end], &bytes[end + 1..]),
                        None => (bytes, &[][..]),
                    };
                    if let Some(held) = line {
                        if held.len() + piece.len() > MAX_EVENT_LINE_BYTES {
                            *line = None;
                        } else {
                            held.extend_from_slice(piece);
                        }
                    }
                    if end.is_some() {
                        if let Some(held) = line.as_deref()
                            && let Some(usage) = event_usage(held)
                        {
                            *last = Some(usage);
                        }
                        *line = Some(Vec::new());
                    }
                    bytes = rest;
                }
            }
        }
    }

    /// The usage the answer reported: the JSON answer's, or the last event's that had one.
    pub fn finish(self) -> Option<PromptUsage> {
        match self.kind {
            Kind::Json(held) => {
                let answer: Value = serde_json::from_slice(&held?).ok()?;
                PromptUsage::of(&answer)
            }
            Kind::Events { line, last } => line.as_deref().and_then(event_usage).or(last),
        }
    }
}

/// The usage in one event line: a `data:` line whose JSON payload has one.
fn event_usage(line: &[u8]) -> Option<PromptUsage> {
    let data = line.strip_prefix(b"data:")?;
    // Most events carry none: skip the parse unless the word is there.
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let payload: Value = serde_json::from_slice(data.trim_ascii()).ok()?;
    PromptUsage::of(&payload)
}
