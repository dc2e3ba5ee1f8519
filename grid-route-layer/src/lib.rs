//! Tower layers that keep LLM conversations on the site whose engines hold their prompt
//! prefix in KV cache, and that pin stored OpenAI Responses state to the cluster that
//! stored it.
//!
//! See the crate README and `DESIGN.md` for the request path; each module documents one
//! concept with a runnable example.
#![deny(missing_docs)]

pub mod grid;
pub mod pin;
