use std::sync::Arc;

use tower::Layer;

use super::service::{KeyingService, Shared};
use super::stream::KeySeed;
use crate::affinity::Affinity;

/// Bodies up to this size are buffered and keyed by default.
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 10 * 1024 * 1024;

/// Bodies over this size are keyed on Tokio's blocking pool, off the async workers.
pub const BLOCKING_THRESHOLD_BYTES: usize = 256 * 1024;

/// The headers read for a session id by default, in order: `x-session-id`, the name many
/// gateways and agent frameworks send.
pub const DEFAULT_SESSION_HEADERS: [&str; 1] = ["x-session-id"];

/// Buffers the body of keyed requests (bounded), computes the prompt's keys and attaches
/// them as the [`Prompt`](crate::route::Prompt) request extension, then forwards the body's
/// bytes unchanged.
///
/// See the [module docs](super) for what it reads and what passes through untouched.
#[derive(Clone, Debug)]
pub struct KeyingLayer {
    shared: Arc<Shared>,
}

impl KeyingLayer {
    /// Keys requests under `seed` (one per process: keys are only comparable under the
    /// same seed), buffering bodies up to [`DEFAULT_BODY_LIMIT_BYTES`].
    pub fn new(seed: KeySeed) -> Self {
        Self {
            shared: Arc::new(Shared::new(seed)),
        }
    }

    /// Buffers and keys bodies up to `bytes`; larger bodies stream through unkeyed.
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|shared| shared.body_limit = bytes)
    }

    /// Reads prompts only while `affinity` is enabled: when it is switched off, only the
    /// request's `model` is read (routing still needs it) and no key is computed.
    #[must_use]
    pub fn with_affinity(self, affinity: Affinity) -> Self {
        self.with(|shared| shared.affinity = Some(affinity))
    }

    /// The name [`with_affinity`](Self::with_affinity) had.
    #[deprecated(note = "renamed `with_affinity`: the name says what it takes")]
    #[must_use]
    pub fn follow(self, affinity: Affinity) -> Self {
        self.with_affinity(affinity)
    }

    /// Reads a request's session id from the first of `headers` it carries, when its body
    /// names none (`prompt_cache_key`, Anthropic `metadata.user_id`); by default
    /// [`DEFAULT_SESSION_HEADERS`]. No header names: only the body is read.
    #[must_use]
    pub fn session_headers(self, headers: impl IntoIterator<Item = http::HeaderName>) -> Self {
        let headers: Arc<[http::HeaderName]> = headers.into_iter().collect();
        self.with(|shared| shared.session_headers = headers)
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for KeyingLayer {
    type Service = KeyingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyingService::with_shared(inner, self.shared.clone())
    }
}
