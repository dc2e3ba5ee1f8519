//! The engine's shared state and its timing model: admission, prefix lookup, prefill, decode.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::cache::{PrefixCache, block_hashes};
use super::error::ApiError;
use super::store::Store;
use super::{BodySummary, CachedTokens, MockEngineConfig, MockStats, WaitingOverride};

/// Raw request bodies kept for `GET /mock/last_body`.
const KEPT_BODIES: usize = 16;
/// Bytes of raw request bodies kept at most (the last body is always kept), so a test that
/// sends large bodies does not hold 16 of them.
const KEPT_BODY_BYTES: usize = 64 << 20;

/// Prompt bytes per token, for counting tokens without a tokenizer.
const BYTES_PER_TOKEN: usize = 4;

/// Locks a mutex, taking the data even if a holder panicked: every critical section here
/// leaves its data consistent at each step, so a poisoned lock holds usable data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Seconds since the Unix epoch, for `created` fields.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// Injected stalls: before the answer's head, and on each output token.
#[derive(Debug, Default, Clone, Copy)]
struct Stall {
    head: Duration,
    token: Duration,
}

/// Requests of one model waiting for and holding a running slot.
#[derive(Debug, Default)]
pub(crate) struct ModelLoad {
    pub(crate) waiting: AtomicUsize,
    pub(crate) running: AtomicUsize,
}

/// Counts a request in `waiting` or `running` for as long as it lives, so a request whose
/// client goes away (its future dropped) stops counting.
struct Counted {
    load: Arc<ModelLoad>,
    running: bool,
}

impl Counted {
    fn new(load: Arc<ModelLoad>, running: bool) -> Self {
        load.counter(running).fetch_add(1, Ordering::SeqCst);
        Self { load, running }
    }
}

impl ModelLoad {
    fn counter(&self, running: bool) -> &AtomicUsize {
        if running {
            &self.running
        } else {
            &self.waiting
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.load
            .counter(self.running)
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// One generation request, as the scheduler sees it.
pub(crate) struct Job {
    pub(crate) model: String,
    /// Cache namespace of the prompt (model and cache salt).
    pub(crate) namespace: u64,
    pub(crate) prompt: Vec<u8>,
}

/// Token counts of a prefilled prompt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptUsage {
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
}

/// A request holding a running slot, prefilled; decoding it is up to the caller.
pub(crate) struct Running {
    _permit: OwnedSemaphorePermit,
    _counted: Counted,
    pub(crate) usage: PromptUsage,
}

/// The injected-failure plan of `POST /mock/fail`.
#[derive(Debug, Clone, Copy)]
struct FailurePlan {
    status: StatusCode,
    remaining: u32,
    retry_after_secs: Option<u64>,
}

#[derive(Debug, Default)]
struct Tally {
    requests: BTreeMap<String, u64>,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    injected_failures: u64,
    bodies: VecDeque<(String, Bytes)>,
}

/// Random-looking, unique ids (128 bits of hex), without a random number crate.
struct IdSource {
    keys: RandomState,
    counter: AtomicU64,
}

impl IdSource {
    fn hex(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let high = self.keys.hash_one((n, 0_u8));
        let low = self.keys.hash_one((n, 1_u8));
        format!("{high:016x}{low:016x}")
    }
}

/// The engine's state, shared by its handlers.
pub(crate) struct Engine {
    pub(crate) config: MockEngineConfig,
    permits: Arc<Semaphore>,
    loads: HashMap<String, Arc<ModelLoad>>,
    cache: Mutex<PrefixCache>,
    pub(crate) store: Mutex<Store>,
    failure: Mutex<Option<FailurePlan>>,
    stall: Mutex<Stall>,
    waiting_override: Mutex<WaitingOverride>,
    /// `/metrics` answers 503 while set (`POST /mock/metrics`).
    metrics_failing: AtomicBool,
    /// When usage counts cached tokens: the config's until changed
    /// ([`MockEngine::count_cached_tokens`](crate::MockEngine::count_cached_tokens)).
    cached_tokens: Mutex<CachedTokens>,
    tally: Mutex<Tally>,
    ids: IdSource,
}

impl Engine {
    pub(crate) fn new(config: MockEngineConfig) -> Self {
        let loads = config
            .models
            .iter()
            .map(|model| (model.clone(), Arc::default()))
            .collect();
        Self {
            permits: Arc::new(Semaphore::new(config.max_running)),
            loads,
            cache: Mutex::new(PrefixCache::new(config.cache_blocks)),
            store: Mutex::new(Store::default()),
            failure: Mutex::new(None),
            stall: Mutex::new(Stall::default()),
            waiting_override: Mutex::new(WaitingOverride::default()),
            metrics_failing: AtomicBool::new(false),
            cached_tokens: Mutex::new(config.cached_tokens),
            tally: Mutex::new(Tally::default()),
            ids: IdSource {
                keys: RandomState::new(),
                counter: AtomicU64::new(0),
            },
            config,
        }
    }

    /// A new id: `prefix` followed by 32 hex digits.
    pub(crate) fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.ids.hex())
    }

    /// The model a request names, or the first served model when it names none (as vLLM
    /// does); 404 for a model the engine does not serve.
    pub(crate) fn resolve_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None => self
                .config
                .models
                .first()
                .cloned()
                .ok_or_else(|| ApiError::bad_request("`model` is required").param("model")),
            Some(model) if self.loads.contains_key(model) => Ok(model.to_owned()),
            Some(model) => Err(
                ApiError::not_found(format!("The model `{model}` does not exist."))
                    .param("model")
                    .code("model_not_found"),
            ),
        }
    }

    /// Waits for a running slot, looks the prompt up in the prefix cache, sleeps the prefill
    /// of its uncached tokens, then caches its blocks (vLLM caches a block once its KV is
    /// computed).
    pub(crate) async fn prefill(&self, job: &Job) -> Result<Running, ApiError> {
        let load = self.loads.get(&job.model).cloned().unwrap_or_default();
        let waiting = Counted::new(Arc::clone(&load), false);
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| {
                ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "engine is stopping")
            })?;
        drop(waiting);
        let counted = Counted::new(load, true);

        let block_bytes = self.config.block_bytes.max(1);
        let hashes = block_hashes(job.namespace, &job.prompt, block_bytes);
        let mut cached_blocks = lock(&self.cache).cached_prefix_blocks(&hashes);
        if cached_blocks > 0 && cached_blocks * block_bytes == job.prompt.len() {
            // As vLLM, compute at least the last block: a whole-prompt hit still needs the
            // last token's logits.
            cached_blocks -= 1;
        }
        let prompt_tokens = (job.prompt.len() / BYTES_PER_TOKEN).max(1) as u64;
        let cached_tokens = (cached_blocks * block_bytes / BYTES_PER_TOKEN) as u64;
        let uncached_tokens = prompt_tokens - cached_tokens.min(prompt_tokens);
        if self.config.prefill_tokens_per_second > 0 {
            let seconds = uncached_tokens as f64 / self.config.prefill_tokens_per_second as f64;
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        }
        lock(&self.cache).insert(&hashes);
        {
            let mut tally = lock(&self.tally);
            tally.prompt_tokens += prompt_tokens;
            tally.cached_tokens += cached_tokens;
        }
        Ok(Running {
            _permit: permit,
            _counted: counted,
            usage: PromptUsage {
                prompt_tokens,
                cached_tokens,
            },
        })
    }

    /// The time one output token takes.
    pub(crate) async fn decode_token(&self) {
        if !self.config.decode_delay_per_token.is_zero() {
            tokio::time::sleep(self.config.decode_delay_per_token).await;
        }
        let stall = lock(&self.stall).token;
        if !stall.is_zero() {
            tokio::time::sleep(stall).await;
        }
        lock(&self.tally).completion_tokens += 1;
    }

    /// Counts a request under `route` (method and path template).
    pub(crate) fn count_request(&self, route: String) {
        *lock(&self.tally).requests.entry(route).or_default() += 1;
    }

    /// Keeps a raw request body for `GET /mock/last_body`.
    pub(crate) fn keep_body(&self, path: String, body: Bytes) {
        let mut tally = lock(&self.tally);
        tally.bodies.push_back((path, body));
        let mut kept_bytes: usize = tally.bodies.iter().map(|(_, body)| body.len()).sum();
        while tally.bodies.len() > KEPT_BODIES
            || (tally.bodies.len() > 1 && kept_bytes > KEPT_BODY_BYTES)
        {
            if let Some((_, dropped)) = tally.bodies.pop_front() {
                kept_bytes -= dropped.len();
            }
        }
    }

    /// The `back`-th most recent raw body (0 = the last) and its path.
    pub(crate) fn kept_body(&self, back: usize) -> Option<(String, Bytes)> {
        let tally = lock(&self.tally);
        let index = tally.bodies.len().checked_sub(back + 1)?;
        tally.bodies.get(index).cloned()
    }

    /// Makes the next `count` inference requests fail with `status`.
    pub(crate) fn fail_next(&self, status: StatusCode, count: u32, retry_after_secs: Option<u64>) {
        *lock(&self.failure) = (count > 0).then_some(FailurePlan {
            status,
            remaining: count,
            retry_after_secs,
        });
    }

    /// The injected failure for this request, if one is planned.
    pub(crate) fn take_failure(&self, anthropic: bool) -> Option<ApiError> {
        let mut failure = lock(&self.failure);
        let plan = failure.as_mut()?;
        plan.remaining -= 1;
        let error = ApiError::with_status(
            plan.status,
            format!(
                "mock engine {}: injected failure with status {}",
                self.config.name,
                plan.status.as_u16()
            ),
        )
        .retry_after(plan.retry_after_secs);
        if plan.remaining == 0 {
            *failure = None;
        }
        drop(failure);
        lock(&self.tally).injected_failures += 1;
        Some(if anthropic { error.anthropic() } else { error })
    }

    /// Makes every generation request wait `head` before answering and every output token
    /// take `token` longer (zero: no stall).
    pub(crate) fn set_stall(&self, head: Duration, token: Duration) {
        *lock(&self.stall) = Stall { head, token };
    }

    /// How long a generation request waits before answering.
    pub(crate) fn head_stall(&self) -> Duration {
        lock(&self.stall).head
    }

    pub(crate) fn set_waiting_override(&self, waiting_override: WaitingOverride) {
        *lock(&self.waiting_override) = waiting_override;
    }

    pub(crate) fn set_metrics_failing(&self, failing: bool) {
        self.metrics_failing.store(failing, Ordering::SeqCst);
    }

    pub(crate) fn metrics_failing(&self) -> bool {
        self.metrics_failing.load(Ordering::SeqCst)
    }

    pub(crate) fn set_cached_tokens(&self, counted: CachedTokens) {
        *lock(&self.cached_tokens) = counted;
    }

    /// When usage counts cached tokens now.
    pub(crate) fn cached_tokens(&self) -> CachedTokens {
        *lock(&self.cached_tokens)
    }

    /// Each served model's reported waiting and running counts.
    pub(crate) fn load_report(&self) -> Vec<(&str, u64, u64)> {
        let waiting_override = *lock(&self.waiting_override);
        self.config
            .models
            .iter()
            .filter_map(|model| {
                let load = self.loads.get(model)?;
                let real = load.waiting.load(Ordering::SeqCst) as u64;
                let waiting = match waiting_override {
                    WaitingOverride::Add(extra) => real.saturating_add(extra),
                    WaitingOverride::Set(waiting) => waiting,
                };
                Some((
                    model.as_str(),
                    waiting,
                    load.running.load(Ordering::SeqCst) as u64,
                ))
            })
            .collect()
    }

    /// Cached blocks and the cache's capacity.
    pub(crate) fn cache_occupancy(&self) -> (usize, usize) {
        let cache = lock(&self.cache);
        (cache.len(), cache.capacity_blocks())
    }

    pub(crate) fn stats(&self) -> MockStats {
        let (cached_blocks, _) = self.cache_occupancy();
        let report = self.load_report();
        let tally = lock(&self.tally);
        MockStats {
            name: self.config.name.clone(),
            requests: tally.requests.clone(),
            prompt_tokens: tally.prompt_tokens,
            cached_tokens: tally.cached_tokens,
            completion_tokens: tally.completion_tokens,
            injected_failures: tally.injected_failures,
            cached_blocks,
            waiting: report.iter().map(|(_, waiting, _)| waiting).sum(),
            running: report.iter().map(|(_, _, running)| running).sum(),
            last_body: tally.bodies.back().map(|(path, body)| BodySummary {
                path: path.clone(),
                len: body.len(),
                hash: {
                    let mut hasher = DefaultHasher::new();
                    body.hash(&mut hasher);
                    format!("{:016x}", hasher.finish())
                },
            }),
        }
    }

    /// Forgets everything: knobs, counters, kept bodies, the prefix cache and the stores.
    pub(crate) fn reset(&self) {
        *lock(&self.failure) = None;
        *lock(&self.stall) = Stall::default();
        *lock(&self.waiting_override) = WaitingOverride::default();
        self.set_metrics_failing(false);
        *lock(&self.cached_tokens) = self.config.cached_tokens;
        *lock(&self.tally) = Tally::default();
        lock(&self.cache).clear();
        lock(&self.store).clear();
    }

    /// Cumulative prompt, cached and completion tokens, for `/metrics`.
    pub(crate) fn token_totals(&self) -> (u64, u64, u64) {
        let tally = lock(&self.tally);
        (
            tally.prompt_tokens,
            tally.cached_tokens,
            tally.completion_tokens,
        )
    }
}
