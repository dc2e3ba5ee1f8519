//! The one end-to-end test harness of the workspace: engines, a gateway from YAML, an
//! HTTP client, waits with deadlines, and the prompts the tests send.
//!
//! # Where a test lives
//!
//! - **Beside its code** (`#[cfg(test)]` modules, `grid-route-layer/tests/`): a unit or a
//!   layer tested without a gateway.
//! - **`tests/tests/`**: the gateway run in this process ([`Gateway::start`]) with engines
//!   behind it and real sockets between them, or the layers stacked across crates.
//! - **`grid-route-example/tests/`**: the example's binary run as a process (`serve`,
//!   `demo`, `keys`, its command line, signals, logs), since only the crate's own tests can
//!   run its binary.
//! - **`tests/mock-engine/tests/`**: the mock engine itself.
//!
//! Every helper they share is here, once: a test file defines only what is its own.
//!
//! [`Gateway::start`]: grid_route_example::gateway::Gateway::start

// Test support: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

pub mod counting_alloc;
mod engines;
mod gateways;
mod http;
mod process;
mod prompts;
mod raw;
mod wait;

pub use engines::{
    MODEL, SITES, chat, engine, engine_requests, engine_serving, other, set_queue, site_of,
};
pub use gateways::{
    ClusterYaml, cluster, cluster_id, config_yaml, gateway, generation, measured_gateway, metric,
    parse, wait_generation, wait_measured,
};
pub use http::{
    Answer, HttpClient, REQUEST_DEADLINE, client, free_port, scratch_dir, send, send_with,
    try_send, try_send_with, workspace_root,
};
pub use process::{PROCESS_WAIT, exit_within, signal};
pub use prompts::{Conversation, text};
pub use raw::{empty_vllm_metrics, read_head, read_request, whole_answer};
pub use wait::{WAIT, eventually, eventually_within};
