//! The seams between the layers: every typed extension one layer leaves for another.
//!
//! Layers never call each other; they read and write these values in
//! [`http::Extensions`]. A gateway that swaps one layer for its own code only has to honour
//! the extensions listed here.
//!
//! | extension | written by | read by |
//! |---|---|---|
//! | [`Prompt`] (request) | `KeyingLayer` | affinity, confirmation, the balancer (its model) |

use std::fmt;
use std::sync::Arc;

use crate::keying::{NoKeys, PrefixKeys};

/// What keying made of a request body: its model and its prefix keys, or why it has none.
///
/// Set by `KeyingLayer` on every request it could read as one of the keyed APIs; a request
/// without it was not read (wrong path, not JSON, compressed, over the body limit) and
/// routes on load alone. `Debug` prints counts, never keys or text.
#[derive(Clone)]
pub struct Prompt {
    model: Option<Arc<str>>,
    keys: Result<PrefixKeys, NoKeys>,
}

impl Prompt {
    /// A prompt for `model` with these keys (or the reason it has none).
    pub fn new(model: Option<Arc<str>>, keys: Result<PrefixKeys, NoKeys>) -> Self {
        Self { model, keys }
    }

    /// The request's `model`, when it named one as a string.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The model as a shared string.
    pub fn model_arc(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }

    /// The prefix keys, or why the request has none.
    pub fn keys(&self) -> Result<&PrefixKeys, &NoKeys> {
        self.keys.as_ref()
    }
}

impl fmt::Debug for Prompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Prompt");
        d.field("model", &self.model);
        match &self.keys {
            Ok(keys) => d.field("keys", keys),
            Err(reason) => d.field("no_keys", reason),
        };
        d.finish()
    }
}
