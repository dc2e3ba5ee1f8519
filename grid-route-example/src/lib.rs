//! The example gateway built from the grid-route layers, as a library for the binary, the
//! integration tests and the in-process demo.
//!
//! - [`gateway`]: the gateway over real sockets — [`gateway::Gateway::start`] runs it in
//!   process, [`gateway::serve`] runs it from a config file with signals (`serve`).
//! - [`config`]: its YAML configuration.
//! - [`forward_paths`]: which paths and methods the consumer role forwards.
//! - [`demo`]: the demo — three mock sites, the gateway, a multi-turn workload replayed
//!   with prefix affinity on and off, and a table comparing the two
//!   (`grid-route-example demo`, the binary's default).
//! - [`keys`]: the `keys` command, which prints a request body's prefix keys.
//! - [`prometheus`]: the one reader of Prometheus text, for the queue poll, the demo's
//!   report and the tests.
//!
//! The demo's engines, and the `mock-engine` subcommand, come from the
//! `grid-route-mock-engine` crate (`tests/mock-engine/`): an OpenAI-compatible mock
//! inference engine the tests share.

#![forbid(unsafe_code)]

pub mod config;
pub mod demo;
pub mod forward_paths;
pub mod gateway;
pub mod keys;
pub mod prometheus;
