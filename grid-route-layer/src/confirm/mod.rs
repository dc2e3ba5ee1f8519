//! Confirmation: what the answer says about where the prompt now lives.
//!
//! The index must only believe a cluster holds a prompt once the cluster took it: a
//! request sent is not a prefix cached. So [`ConfirmLayer`] waits for each answer's head
//! (a 2xx event stream's first output) and applies its [`Verdict`] at the cluster that
//! served it ([`Served`]):
//!
//! - **2xx** confirms the request's keys there (taken from its [`Prompt`] when the
//!   request went in): later requests sharing the prefix may stick to it. Until the first
//!   answer, a burst behind a new prompt spreads by load.
//! - **429, 5xx** and a **failed connection** (a [`DispatchError`] anywhere in the error's
//!   source chain) drop them: an overloaded or failing cluster is not worth returning to.
//! - **Any other status** changes nothing; nor does a request without keys, an answer
//!   without [`Served`], or a request dropped before its head.
//!
//! The verdict is applied at the head, except that a 2xx event stream confirms at its
//! first output ([`ConfirmBody`]): its first token, past a Responses stream's opening
//! events. vLLM, SGLang and llama.cpp send a stream's head before they prefill, so a
//! stream confirmed at its head would count its prompt held by an engine still waiting to
//! prefill it, and a burst behind that prompt would follow it there and wait. A JSON
//! answer's head comes once it is generated, and a refusal (429, 5xx) drops at its head.
//! A stream that fails or is dropped before its first output confirms nothing; one that
//! ends without output confirms at its end.
//!
//! With affinity disabled ([`AffinitySettings::enabled`]) no prompt is read and nothing is
//! confirmed. The core, [`Verdict`], takes `now` and the status as plain values; the layer
//! reads the clock.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use std::time::Instant;
//!
//! use grid_route_layer::affinity::{Affinity, AffinitySettings};
//! use grid_route_layer::confirm::ConfirmLayer;
//! use grid_route_layer::grid::{ClusterId, SiteName};
//! use grid_route_layer::index::{IndexSettings, PrefixIndex};
//! use grid_route_layer::keying::{Api, KeySeed, key_body};
//! use grid_route_layer::route::Served;
//! use http::{Request, Response, StatusCode};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
//! let index = Arc::new(PrefixIndex::new(IndexSettings::default(), [east.clone()]));
//! let affinity = Affinity::new(Arc::clone(&index), AffinitySettings::default());
//!
//! // A balancer that sends everything to east-a, which answers `status`.
//! let balancer = |status: StatusCode| {
//!     let east = east.clone();
//!     service_fn(move |_req: Request<String>| {
//!         let mut response = Response::new(String::new());
//!         *response.status_mut() = status;
//!         response.extensions_mut().insert(Served::new(east.clone()));
//!         async move { Ok::<_, Infallible>(response) }
//!     })
//! };
//! let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "hi ".repeat(400));
//! let prompt = key_body(&KeySeed::random(), Api::ChatCompletions, body.as_bytes()).unwrap();
//! let keys = prompt.keys().unwrap().clone();
//! let request = || {
//!     let mut req = Request::new(body.clone());
//!     req.extensions_mut().insert(prompt.clone());
//!     req
//! };
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let ok = ConfirmLayer::new(affinity.clone()).layer(balancer(StatusCode::OK));
//! ok.oneshot(request()).await.unwrap();
//! assert_eq!(index.depth(&east, keys.as_slice(), Instant::now()), keys.len());
//!
//! let busy = ConfirmLayer::new(affinity).layer(balancer(StatusCode::TOO_MANY_REQUESTS));
//! busy.oneshot(request()).await.unwrap();
//! assert_eq!(index.depth(&east, keys.as_slice(), Instant::now()), 0);
//! # });
//! ```
//!
//! [`Served`]: crate::route::Served
//! [`Prompt`]: crate::route::Prompt
//! [`DispatchError`]: crate::route::DispatchError
//! [`AffinitySettings::enabled`]: crate::affinity::AffinitySettings::enabled

mod body;
mod future;
mod layer;
mod service;
mod verdict;

pub use body::ConfirmBody;
pub use future::ResponseFuture;
pub use layer::ConfirmLayer;
pub use service::ConfirmService;
pub use verdict::Verdict;

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests;
