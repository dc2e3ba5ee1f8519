//! A mock OpenAI-compatible inference engine, in the spirit of vLLM, for tests and demos.
//!
//! It stands in for the engines a gateway routes to where real ones cannot run (no GPU):
//! the example's `demo` starts three in process, its `mock-engine` subcommand runs one from
//! the command line, and the integration tests start them around a gateway.
//!
//! The engine answers the four generation APIs a gateway routes (`/v1/chat/completions`,
//! `/v1/completions`, Anthropic `/v1/messages`, `/v1/responses`), the stored-state APIs
//! (Responses and Conversations) and the load signal a gateway polls (`/metrics`), with the
//! behaviour that makes routing matter:
//!
//! - **A block prefix cache.** The prompt (a plain rendering of the messages, see below) is
//!   cut into blocks of [`MockEngineConfig::block_bytes`]; each block's hash is chained on the
//!   previous one; an LRU of [`MockEngineConfig::cache_blocks`] blocks remembers them. Leading
//!   cached blocks are reported as `cached_tokens` (4 bytes a token; `prompt_tokens` is the
//!   prompt's bytes / 4, at least 1). As in vLLM, a prompt cached whole still computes its
//!   last block. Different models or `cache_salt`s never share blocks.
//! - **A prefill-time model.** After a request gets a running slot, the engine sleeps
//!   `uncached tokens / prefill_tokens_per_second`, so a cache hit answers measurably sooner,
//!   then decodes its reply one token at a time, [`MockEngineConfig::decode_delay_per_token`]
//!   each, streaming each token as a delta.
//! - **A queue.** At most [`MockEngineConfig::max_running`] requests run; the rest wait, and
//!   `vllm:num_requests_waiting{model_name="..."}` on `/metrics` counts them.
//! - **Stored state.** Responses (unless `"store": false`) and conversations are kept in
//!   memory; an id the engine never stored answers 404, as vLLM does.
//!
//! The reply is short and deterministic: `[NAME]` followed by the first six words of the
//! last user message, one token a word, so a test can see which engine answered. Every
//! answer also carries an `x-mock-engine: NAME` header. Bad JSON is a 400 with an
//! OpenAI-style error body (Anthropic-style on `/v1/messages`); a request for a model the
//! engine does not serve is a 404 (`model_not_found`); a request naming no model gets the
//! first served model, as in vLLM.
//!
//! # Endpoints
//!
//! | endpoint | answers |
//! | --- | --- |
//! | `POST /v1/chat/completions` | `chat.completion` (`chatcmpl-…`), or `chat.completion.chunk` events ending `data: [DONE]`; usage in the last chunk only with `stream_options.include_usage`, as in OpenAI; `prompt_tokens_details.cached_tokens` as [`MockEngineConfig::cached_tokens`] says, or [`MockEngine::count_cached_tokens`] once called |
//! | `POST /v1/completions` | `text_completion` (`cmpl-…`), streamed alike |
//! | `POST /v1/messages` | Anthropic `message` (`msg_…`) with `usage.cache_read_input_tokens`, or its event sequence |
//! | `POST /v1/responses` | `response` (`resp_…`) with `input_tokens_details.cached_tokens`, or its event sequence; `previous_response_id`, `conversation`, `store`, `background` |
//! | `GET`/`DELETE /v1/responses/{id}`, `POST …/cancel`, `GET …/input_items` | the stored response |
//! | `POST /v1/conversations`, `GET`/`POST`/`DELETE /v1/conversations/{id}` | a conversation (`conv_…`) |
//! | `GET`/`POST /v1/conversations/{id}/items`, `GET`/`DELETE …/items/{item_id}` | its items |
//! | `GET /v1/models` | the served models |
//! | `GET /metrics` | `vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc` per model; `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` |
//! | `GET /health` | 200 |
//!
//! # Test knobs
//!
//! | endpoint | effect |
//! | --- | --- |
//! | `POST /mock/fail {"status":503,"count":2,"retry_after":1}` | the next `count` (default 1; 0 clears) requests to the four generation endpoints answer `status` with an error body (`retry_after` optional: a `Retry-After` header) |
//! | `POST /mock/stall {"head_ms":3000,"token_ms":500}` | every generation request waits `head_ms` before its answer's head, every output token takes `token_ms` longer; `{}` ends the stall |
//! | `POST /mock/queue {"waiting":7}` | adds 7 to each model's reported waiting count; with `"exact":true` reports exactly 7; `{"waiting":0}` turns it off |
//! | `POST /mock/metrics {"fail":true}` | `/metrics` answers 503 (the engine's queue cannot be read) until `{"fail":false}` |
//! | `GET /mock/stats` | [`MockStats`] as JSON: requests per route, token totals, the last body's length and hash |
//! | `GET /mock/last_body[?back=N]` | the exact bytes of the last (or N-th last, of 16 kept) `POST /v1/...` body, its path in `x-mock-path` |
//! | `POST /mock/reset` | forgets knobs, counters, kept bodies, the prefix cache and the stores |
//!
//! The same knobs are methods of a [`MockEngine`] started in process.
//!
//! # Example
//!
//! ```
//! use grid_route_mock_engine::{MockEngine, MockEngineConfig};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let config = MockEngineConfig::named("east-a");
//! let engine = MockEngine::start("127.0.0.1:0", config).await?;
//!
//! let mut socket = tokio::net::TcpStream::connect(engine.local_addr()).await?;
//! let body = r#"{"model":"demo-model","messages":[{"role":"user","content":"hi there"}]}"#;
//! let request = format!(
//!     "POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n\
//!      content-length: {}\r\nconnection: close\r\n\r\n{body}",
//!     body.len()
//! );
//! socket.write_all(request.as_bytes()).await?;
//! let mut answer = String::new();
//! socket.read_to_string(&mut answer).await?;
//! assert!(answer.starts_with("HTTP/1.1 200"));
//! assert!(answer.contains("x-mock-engine: east-a"));
//! assert!(answer.contains(r#""content":"[east-a] hi there""#));
//!
//! assert_eq!(engine.stats().requests["POST /v1/chat/completions"], 1);
//! engine.shutdown().await
//! # }
//! ```

#![forbid(unsafe_code)]

mod admin;
mod anthropic;
mod cache;
mod cli;
mod conversations;
mod engine;
mod error;
mod metrics;
mod openai;
mod prompt;
mod request;
mod responses;
pub mod sse;
mod store;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Serialize;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use cli::{MockEngineArgs, run};

use engine::Engine;

/// How a mock engine behaves. Every field has a default; start from
/// [`MockEngineConfig::named`] or [`Default`] and change what a test needs.
#[derive(Debug, Clone)]
pub struct MockEngineConfig {
    /// The engine's name: in replies, the `x-mock-engine` header and logs. Default
    /// `mock-engine`.
    pub name: String,
    /// The served model names (`GET /v1/models`); the first serves requests that name no
    /// model. Default `["demo-model"]`.
    pub models: Vec<String>,
    /// Requests that run at once; the rest wait in the queue. Default 4.
    pub max_running: usize,
    /// Prefill speed: uncached prompt tokens per second (0: prefill is instant). Default
    /// 20000.
    pub prefill_tokens_per_second: u64,
    /// Time to decode one output token. Default 1 ms.
    pub decode_delay_per_token: Duration,
    /// Prefix cache capacity in blocks (0: no cache). Default 4096.
    pub cache_blocks: usize,
    /// Prompt bytes a cache block holds. Default 256.
    pub block_bytes: usize,
    /// The largest request body accepted (413 beyond). Default 64 MiB.
    pub max_body_bytes: usize,
    /// When Chat and Completions usage carries `prompt_tokens_details.cached_tokens`.
    /// Default [`CachedTokens::Always`].
    pub cached_tokens: CachedTokens,
}

/// When an engine's Chat and Completions usage counts the prompt tokens it served from
/// cache (`prompt_tokens_details.cached_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachedTokens {
    /// In every usage, as llama.cpp's server and OpenAI do.
    #[default]
    Always,
    /// Only when some were cached: vLLM started with `--enable-prompt-tokens-details`.
    UnlessNone,
    /// Never: vLLM at its defaults, and SGLang without `--enable-cache-report`.
    Never,
}

impl Default for MockEngineConfig {
    fn default() -> Self {
        Self {
            name: "mock-engine".to_owned(),
            models: vec!["demo-model".to_owned()],
            max_running: 4,
            prefill_tokens_per_second: 20_000,
            decode_delay_per_token: Duration::from_millis(1),
            cache_blocks: 4096,
            block_bytes: 256,
            max_body_bytes: 64 << 20,
            cached_tokens: CachedTokens::Always,
        }
    }
}

impl MockEngineConfig {
    /// The default configuration with another name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Refuses a configuration the engine cannot run, naming the field.
    fn check(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if self.name.is_empty() {
            return invalid("mock engine name must not be empty".to_owned());
        }
        if self.models.is_empty() || self.models.iter().any(String::is_empty) {
            return invalid(format!(
                "mock engine models must be non-empty names, got {:?}",
                self.models
            ));
        }
        if self.max_running == 0 || self.max_running > tokio::sync::Semaphore::MAX_PERMITS {
            return invalid(format!(
                "mock engine max_running must be at least 1, got {}",
                self.max_running
            ));
        }
        if self.block_bytes == 0 {
            return invalid("mock engine block_bytes must be at least 1, got 0".to_owned());
        }
        Ok(())
    }
}

/// How `vllm:num_requests_waiting` is overridden, for tests of queue-aware routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingOverride {
    /// Report the real count plus this many (0: no override).
    Add(u64),
    /// Report exactly this many, whatever the real count.
    Set(u64),
}

impl Default for WaitingOverride {
    fn default() -> Self {
        WaitingOverride::Add(0)
    }
}

/// A snapshot of an engine's counters (`GET /mock/stats`).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct MockStats {
    /// The engine's name.
    pub name: String,
    /// Requests received per route, keyed `"METHOD /path/{template}"` (`/mock/` excluded).
    pub requests: BTreeMap<String, u64>,
    /// Prompt tokens of all prefilled requests.
    pub prompt_tokens: u64,
    /// Of those, tokens read from the prefix cache.
    pub cached_tokens: u64,
    /// Output tokens decoded.
    pub completion_tokens: u64,
    /// Requests answered by the failure knob.
    pub injected_failures: u64,
    /// Blocks in the prefix cache now.
    pub cached_blocks: usize,
    /// Requests waiting now, as reported on `/metrics` (summed over models).
    pub waiting: u64,
    /// Requests running now.
    pub running: u64,
    /// The last `POST /v1/...` body received.
    pub last_body: Option<BodySummary>,
}

/// A received request body, by length and hash.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BodySummary {
    /// The path it was sent to.
    pub path: String,
    /// Its length in bytes.
    pub len: usize,
    /// 16 hex digits of a hash of its bytes (std `DefaultHasher`, stable within a build).
    pub hash: String,
}

fn router(engine: Arc<Engine>) -> Router {
    let max_body_bytes = engine.config.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/conversations", post(conversations::create))
        .route(
            "/v1/conversations/{id}",
            get(conversations::retrieve)
                .post(conversations::update)
                .delete(conversations::delete),
        )
        .route(
            "/v1/conversations/{id}/items",
            get(conversations::list_items).post(conversations::add_items),
        )
        .route(
            "/v1/conversations/{id}/items/{item_id}",
            get(conversations::retrieve_item).delete(conversations::delete_item),
        )
        .route("/v1/models", get(admin::models))
        .route("/metrics", get(admin::metrics))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/mock/fail", post(admin::fail))
        .route("/mock/queue", post(admin::queue))
        .route("/mock/stall", post(admin::stall))
        .route("/mock/metrics", post(admin::metrics_knob))
        .route("/mock/stats", get(admin::stats))
        .route("/mock/last_body", get(admin::last_body))
        .route("/mock/reset", post(admin::reset))
        .fallback(admin::unknown_path)
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            error::ApiError::with_status(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {method} not allowed here"),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&engine),
            admin::intake,
        ))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(engine)
}

async fn serve_engine(
    listener: TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    axum::serve(listener, router(engine))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves a mock engine on `listener` until `shutdown` completes, then finishes the requests
/// in flight (graceful shutdown).
pub async fn serve(
    listener: TcpListener,
    config: MockEngineConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    config.check()?;
    serve_engine(listener, Arc::new(Engine::new(config)), shutdown).await
}

/// A mock engine running in this process, on its own task.
///
/// Dropping the handle shuts the engine down (gracefully); [`MockEngine::shutdown`] also
/// waits for it to finish.
#[must_use = "dropping the handle stops the engine"]
pub struct MockEngine {
    local_addr: SocketAddr,
    engine: Arc<Engine>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<io::Result<()>>>,
}

impl std::fmt::Debug for MockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockEngine")
            .field("name", &self.engine.config.name)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl MockEngine {
    /// Binds `addr` (`"127.0.0.1:0"` for any free port) and starts serving on a spawned task.
    pub async fn start(addr: impl ToSocketAddrs, config: MockEngineConfig) -> io::Result<Self> {
        config.check()?;
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let engine = Arc::new(Engine::new(config));
        let (shutdown, stop) = oneshot::channel::<()>();
        let server = tokio::spawn(serve_engine(listener, Arc::clone(&engine), async move {
            // Fires on `shutdown` and when the handle (the sender) is dropped.
            let _ = stop.await;
        }));
        Ok(Self {
            local_addr,
            engine,
            shutdown: Some(shutdown),
            server: Some(server),
        })
    }

    /// The address the engine listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The engine's base URL, `http://IP:PORT`, as a gateway config names an endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// The engine's name.
    pub fn name(&self) -> &str {
        &self.engine.config.name
    }

    /// A snapshot of the engine's counters, as `GET /mock/stats` answers.
    pub fn stats(&self) -> MockStats {
        self.engine.stats()
    }

    /// Makes every generation request wait `head` before answering and every output token
    /// take `token` longer (zeros end the stall), as `POST /mock/stall` does.
    pub fn stall(&self, head: Duration, token: Duration) {
        self.engine.set_stall(head, token);
    }

    /// Makes the next `count` generation requests answer `status` with an error body
    /// (`count` 0 clears), as `POST /mock/fail` does.
    pub fn fail_next(&self, status: StatusCode, count: u32) {
        self.engine.fail_next(status, count, None);
    }

    /// Overrides the reported waiting count, as `POST /mock/queue` does.
    pub fn override_waiting(&self, waiting: WaitingOverride) {
        self.engine.set_waiting_override(waiting);
    }

    /// Makes `/metrics` answer 503 (or serve again), as `POST /mock/metrics` does.
    pub fn fail_metrics(&self, fail: bool) {
        self.engine.set_metrics_failing(fail);
    }

    /// Changes when Chat and Completions usage counts cached tokens from then on, as an
    /// engine restarted with other flags behind the same URL would (`reset` restores the
    /// config's).
    pub fn count_cached_tokens(&self, counted: CachedTokens) {
        self.engine.set_cached_tokens(counted);
    }

    /// Forgets knobs, counters, kept bodies, the prefix cache and the stores, as
    /// `POST /mock/reset` does.
    pub fn reset(&self) {
        self.engine.reset();
    }

    /// Stops accepting connections, finishes the requests in flight and waits for the
    /// server to end.
    pub async fn shutdown(mut self) -> io::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match self.server.take() {
            Some(server) => server.await.map_err(io::Error::other)?,
            None => Ok(()),
        }
    }
}
