//! Tower layers that keep LLM conversations on the site whose engines hold their prompt
//! prefix in KV cache, and that pin stored OpenAI Responses state to the cluster that
//! stored it.
//!
//! The request path, outermost first: [`keying`] (the prompt's keys and session),
//! [`pin`] (tagged ids to the cluster that stored them), [`confirm`] (a 2xx answer
//! confirms the keys at its cluster, a 429, 5xx or failed connection drops them),
//! [`affinity`] (the candidates a request may go to), [`feedback`] (what the engines
//! report of their caches, and the prices they teach), and [`select`] (the least loaded
//! candidate; or your own balancer). The layers talk only through the extensions in
//! [`route`], the shared [`grid::Grid`] handle and the [`affinity::Affinity`] handle;
//! `docs/architecture.md` draws the path and says what each layer does. Each module
//! documents one concept with a runnable example.
//!
//! [`select`] shows a cluster service built from `tower::balance` p2c over its endpoints,
//! and a balancer of your own in place of [`select::Select`].
//!
//! # Cargo features
//!
//! - `serde` (off by default): `Deserialize` for the config and spec types
//!   ([`config::PrefixAffinityConfig`], [`grid::GridSpec`] and its sites and clusters), so
//!   a gateway reads its config file straight into them and their defaults live here
//!   alone. The example gateway turns it on.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

/// `get_ref`, `get_mut` and `into_inner` for a layer's service whose wrapped service is its
/// `inner` field, written once for every layer (tower-http's habit).
macro_rules! define_inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwraps the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
pub(crate) use define_inner_service_accessors;

pub mod affinity;
pub mod answer;
pub mod config;
pub mod confirm;
pub mod feedback;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod grid;
pub mod index;
pub mod keying;
pub mod metrics;
pub mod pin;
pub mod route;
pub mod select;

#[cfg(test)]
mod stack_tests;
#[cfg(test)]
mod test_support;
