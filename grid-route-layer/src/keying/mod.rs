//! Prompt keying: a request body in, the prefix keys that identify its prompt out.
//!
//! Prefix affinity needs to know, for each request, which earlier requests share its
//! prompt prefix, because an engine that served that prefix still holds it in KV cache.
//! Keying turns the body of `POST /v1/chat/completions`, `/v1/completions`, `/v1/messages`
//! (Anthropic) and `/v1/responses` into a *canonical stream* and cuts it into 256-byte
//! blocks; each block's key is chained on the one before, so key `i` stands for the whole
//! prefix up to block `i` and two requests share key `i` only if they share everything
//! before it.
//!
//! ```
//! use grid_route_layer::keying::{Api, KeySeed, key_body};
//!
//! let seed = KeySeed::random(); // one per process; keys are only comparable under it
//! let turn = |extra: &str| {
//!     format!(
//!         r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"hi{extra}"}}]}}"#,
//!         "You are a careful assistant. ".repeat(40)
//!     )
//! };
//! let first = key_body(&seed, Api::ChatCompletions, turn("").as_bytes()).unwrap();
//! let second = key_body(&seed, Api::ChatCompletions, turn(&"!".repeat(600)).as_bytes()).unwrap();
//! let (a, b) = (first.keys().unwrap(), second.keys().unwrap());
//! assert!(b.as_slice().starts_with(a.as_slice()));
//! assert!(b.len() > a.len());
//! ```
//!
//! # The canonical stream
//!
//! In order: the *preamble* — tool definitions, then (Chat) vLLM's `chat_template`,
//! `chat_template_kwargs` and `documents`, (Anthropic) `system`, (Responses)
//! `instructions` and the `prompt` template reference — padded to a whole block; then the
//! *turns* — each message's role, its text and media, its tool calls (name and arguments)
//! and tool results; for Completions the `prompt` string. Keys are namespaced by `model`
//! and `cache_salt` (any API): different models or salts never share a key.
//!
//! - **Text** is the decoded JSON string, so bodies that differ only in escaping key
//!   alike. A string `content` keys like an array holding one text part with that string.
//! - **Framing** is a two-byte marker `0xFF, code` before each role, part, tool call and
//!   JSON token. `0xFF` never occurs in UTF-8 (a raw `0xFF` byte makes the body
//!   unreadable), so text, control characters included, cannot forge a boundary.
//! - **Tool definitions, tool-call arguments and other JSON values** are written in
//!   canonical form, object keys sorted recursively; argument strings that hold JSON are
//!   parsed first, others are text. A value whose raw size is over
//!   [`CANONICAL_LIMIT_BYTES`] (16 KiB) is keyed by a digest of its bytes as sent.
//! - **Media** (image, audio, video, file parts; Anthropic image and document blocks;
//!   Responses `input_image`, `input_file`, `input_audio`) costs one fixed-size digest: of
//!   vLLM's per-part `uuid` when present, else of its URL, data or file id.
//! - **Ignored**: field order everywhere, generation parameters, unknown fields,
//!   reasoning (`reasoning`/`reasoning_content`, Anthropic `thinking`/`redacted_thinking`,
//!   Responses `reasoning` items), ids (`tool_call_id`, `tool_use_id`, `call_id`, item
//!   ids), Anthropic `cache_control`, and an empty `tools` array (it renders like none).
//!
//! Decisions the design leaves open:
//!
//! - vLLM Chat fields that count are `chat_template`, `chat_template_kwargs` and
//!   `documents`: they change how every message renders. `add_generation_prompt`,
//!   `continue_final_message` and `mm_processor_kwargs` are ignored: the first two only
//!   change the prompt's tail, after every full block; the last changes media processing,
//!   not the prefix text.
//! - A Chat message's `name` counts (templates render it), after the content.
//! - Anthropic `tool_result` is the result marker, its content (string or blocks), then an
//!   error marker when `is_error` is true; Responses `function_call_output` is the result
//!   marker and its output. Neither carries its call id: ids are ignored.
//! - `input_text` and `output_text` parts key alike, as do Responses `input` given as a
//!   string and as one user message holding it.
//!
//! # No keys
//!
//! A request gets [`NoKeys`] and routes on load alone when its JSON is unreadable, its
//! prompt is token ids or a batch of prompts, any part, block or item has a type keying
//! does not know, it continues stored Responses state (`previous_response_id`,
//! `conversation`, an `item_reference`), or its stream is shorter than one block. A
//! routing field (`model`, `messages`, `input`, `prompt`, `previous_response_id`,
//! `conversation`) given twice at the top level is a [`DuplicateField`] — a 400.
//!
//! # What the layer reads
//!
//! [`KeyingLayer`] buffers a body (up to its limit, [`DEFAULT_BODY_LIMIT_BYTES`] by
//! default), forwards it byte for byte, and leaves what it learnt in the request's
//! extensions ([`Prompt`](crate::route::Prompt), [`RequestModel`](crate::route::RequestModel),
//! [`BufferedBody`](crate::route::BufferedBody)):
//!
//! - `POST` to a keyed path is read as JSON whatever its `Content-Type` says, and keyed.
//!   Over the limit it streams through unkeyed, routed by the `model` found in its first
//!   bytes ([`scan_model`]).
//! - `POST`/`PUT`/`PATCH` to a Responses or Conversations path may name stored state, so
//!   it is read whole whatever its `Content-Type`: over the limit it is refused with 413,
//!   in an encoding no outer layer decoded with 415. No tag can stream past the pin layer.
//! - Any other `POST`/`PUT`/`PATCH` with a JSON body (or none declared) that is not
//!   compressed is read for its `model` only, so that it goes only where that model is
//!   served.
//! - A body an outer layer capped with `http_body_util::Limited` (a decoded body, say) and
//!   that grew past it is refused with 413.
//! - Everything else (no body, other media types, compressed bodies of other paths)
//!   passes through unread.
//!
//! Each request runs in a `grid_route` span ([`REQUEST_SPAN`](crate::route::REQUEST_SPAN))
//! that the layers inside fill with the outcome, depth and destination.
//!
//! # Long prompts and bounded work
//!
//! At most [`MAX_KEYS`] (512) keys: one a block for the first 64 KiB of stream, then at
//! strides that double every 32 keys, the last at about 4 MiB. Prompts that differ only
//! after 512 KiB still get different keys, and [`PrefixKeys::covered_bytes`] prices a
//! match by the bytes it stands for. Hashing stops at the last key's block; the rest of the
//! body is only scanned. Arrays are read an element at a time and no JSON tree is built;
//! a body is read once, except values met out of canonical order (and the small preamble)
//! which are read again from where they were.

mod body;
mod canonical;
mod chat;
mod completions;
mod future;
mod keys;
mod layer;
mod messages;
mod responses;
pub(crate) mod scan;
mod service;
mod stream;
mod walk;

pub use body::{KeyedBody, ResponseBody};
pub use canonical::CANONICAL_LIMIT_BYTES;
pub use future::ResponseFuture;
pub(crate) use keys::key_request;
pub use keys::{
    Api, DuplicateField, NoKeys, PrefixKeys, SessionKey, key_body, read_model, scan_model,
};
pub use layer::{
    BLOCKING_THRESHOLD_BYTES, DEFAULT_BODY_LIMIT_BYTES, DEFAULT_SESSION_HEADERS, KeyingLayer,
};
pub use service::KeyingService;
pub(crate) use stream::HASHED_BLOCKS;
pub use stream::{BLOCK_BYTES, KeySeed, MAX_KEYS};
