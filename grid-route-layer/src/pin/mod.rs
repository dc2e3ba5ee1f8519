//! Stored-state pinning: tag the ids of stored responses and conversations with the
//! cluster that stored them, read the tags back, and send each request that names one to
//! that cluster.
//!
//! An engine stores a Responses `response` or a `conversation` in its own memory, so a
//! request that names one (`GET /v1/responses/{id}`, `previous_response_id`, ...) must
//! reach the one cluster that stored it. Instead of a shared table, the gateway writes the
//! place into the id itself on the way out and reads it on the way in. The sans-IO core
//! is plain functions on strings and bytes (no HTTP types, no I/O beyond reading a key
//! file); [`PinLayer`] wraps it.
//!
//! # Tags
//!
//! An engine id `resp_<id>` or `conv_<id>` leaves the gateway as
//! `resp_<site>.<digest>.<mac>.<id>` or `conv_<site>.<digest>.<mac>.<id>`:
//!
//! - `<site>` is the [`SiteName`](crate::grid::SiteName) and `<digest>` the 8-hex
//!   [`ClusterDigest`](crate::grid::ClusterDigest) of the serving cluster;
//! - `<mac>` is 16 lowercase hex digits, the first 8 bytes of HMAC-SHA256 under the
//!   [`TagKey`] over `"grid-route/pin-tag/v1\0" || len(site) as one byte || site ||
//!   digest's 4 bytes` (a fixed label, then a length-prefixed site, so no two (site,
//!   digest) pairs share an input). Without a key the mac is empty:
//!   `resp_east.1ef772aa..abc`.
//! - A tag splits on its first three dots; the id part may hold more dots.
//!
//! The mac binds the site and the cluster, not the id: it proves this grid issued a tag for
//! that cluster, so clients cannot make the gateway route to a cluster of their choosing.
//! A tagged id carries no tenant.
//!
//! [`TagKeys::untag`] checks a tag (each refusal is a [`BadTag`]; a gateway answers 404)
//! and returns the engine's id, which is always one plain path segment: only RFC 3986
//! unreserved characters, never `..`, never empty.
//!
//! # Key rotation
//!
//! [`TagKeys`] holds the current key and, when the configuration names one
//! ([`TagKeys::with_previous`]), the previous key: ids signed with it keep verifying for as
//! long as it stays named, so clients finish the conversations they hold; new ids are
//! always signed with the current key. Naming the previous key no longer revokes it at
//! once — nothing verifies by time alone, so a leaked key can be withdrawn. Going from no
//! key to a key refuses empty-mac ids (nothing was verified before, so they prove
//! nothing); going from a key to no key accepts any well-formed tag.
//!
//! # Rewriting bodies
//!
//! [`IdRewriter`] tags the response's own ids in 2xx bodies of the Responses and
//! Conversations endpoints as they stream out, JSON documents and server-sent events alike,
//! whatever the chunk boundaries, holding back at most one possible id.
//!
//! # Example: the core
//!
//! ```
//! use std::time::Instant;
//!
//! use bytes::Bytes;
//! use grid_route_layer::grid::{ClusterDigest, SiteName};
//! use grid_route_layer::pin::{BadTag, Framing, IdKind, IdRewriter, TagKey, TagKeys};
//!
//! let key = TagKey::from_bytes(b"an example key of at least 32 bytes!").unwrap();
//! let keys = TagKeys::new(Some(key));
//! let site = SiteName::new("east").unwrap();
//! let stamp = keys.stamp(&site, ClusterDigest::of_name("east-a"));
//!
//! // On the way out: tag the ids in a streamed answer, chunk by chunk.
//! let mut rewriter = IdRewriter::new(stamp.clone(), Framing::EventStream);
//! let mut out = Vec::new();
//! for chunk in [
//!     "event: response.created\ndata: {\"response\":{\"id\":\"resp_6",
//!     "8a3\",\"output\":[]}}\n\ndata: [DONE]\n\n",
//! ] {
//!     out.extend_from_slice(&rewriter.push(Bytes::from(chunk)));
//! }
//! out.extend_from_slice(&rewriter.finish());
//! let tagged = stamp.tag(IdKind::Response, "resp_68a3").unwrap();
//! assert!(tagged.starts_with("resp_east.1ef772aa."));
//! let expected = format!(
//!     "event: response.created\ndata: {{\"response\":{{\"id\":\"{tagged}\",\"output\":[]}}}}\n\ndata: [DONE]\n\n"
//! );
//! assert_eq!(String::from_utf8(out).unwrap(), expected);
//!
//! // On the way in: check the tag and find the cluster and the engine's id.
//! let now = Instant::now();
//! let untagged = keys.untag(IdKind::Response, &tagged).unwrap();
//! assert_eq!(untagged.engine_id(), "resp_68a3");
//! assert_eq!(untagged.digest(), ClusterDigest::of_name("east-a"));
//!
//! // A forged mac, an untagged id, or an id that is not one path segment is refused.
//! let forged = tagged.replace(".1ef772aa.", ".00000000.");
//! assert_eq!(keys.untag(IdKind::Response, &forged), Err(BadTag::BadMac));
//! assert_eq!(keys.untag(IdKind::Response, "resp_68a3"), Err(BadTag::Untagged));
//! let escape = format!("resp_{}..%2Fadmin", stamp.as_str());
//! assert_eq!(keys.untag(IdKind::Response, &escape), Err(BadTag::UnsafeId));
//! ```
//!
//! # The layer
//!
//! [`PinLayer`] sits right inside [`KeyingLayer`](crate::keying::KeyingLayer)
//! (Keying → Pin → Confirm → Affinity → balancer). For each request it does one of three
//! things: pins it (sets [`Pinned`](crate::route::Pinned) and forwards it with the
//! engine's ids in place of the tags), passes it as it is, or answers it itself with an
//! OpenAI-style JSON error, forwarding nothing.
//!
//! **Paths.** The first segment under `/v1/responses/` must be a `resp_` tag and under
//! `/v1/conversations/` a `conv_` tag: `/v1/responses/{id}` (GET, DELETE), `/cancel`,
//! `/input_items`, `/v1/conversations/{id}` (GET, POST, DELETE), `/items`,
//! `/items/{item}`. The tag is replaced by the engine's id in the URI path; the query
//! string is kept as it was. Whatever the method and the segments after the id, the id
//! is read the same way: the engine, not the gateway, says which routes exist, and a tag
//! must never reach it.
//!
//! **Bodies.** In a `POST /v1/responses`, `previous_response_id` must be a `resp_` tag and
//! `conversation` (a string or an object's `id`) a `conv_` tag. The top level is scanned
//! (no value is built) in the body [`KeyingLayer`](crate::keying::KeyingLayer) buffered
//! ([`BufferedBody`](crate::route::BufferedBody)); the decoded id is checked, and the
//! string's content alone is replaced by the engine's id: every other byte is forwarded as
//! sent, never re-serialised. The request body (built with `From<Bytes>`) and the
//! `BufferedBody` extension are both replaced, and `Content-Length`, when the request
//! carries one, is set to the new length.
//!
//! **New conversations.** `POST /v1/conversations` is pinned to the least loaded
//! admitted cluster of the local site ([`GridView::local_site`]), else to the least
//! loaded admitted cluster anywhere (the windowed worst queue, then requests in flight,
//! then in turn; [`least_loaded`]). A conversation names no model, so *any* admitted
//! cluster may hold one.
//!
//! | the request | answer | `grid_route_pin_total{outcome}` |
//! |---|---|---|
//! | a good tag, its cluster in the grid and admitting; a new conversation placed | forwarded, pinned | `pinned` |
//! | a bad mac, a malformed tag, the wrong kind for the place, an untagged id in a path, an id or a later path segment that is not one plain segment | 404 | `bad_tag` |
//! | a good tag whose cluster left the grid | 404 | `gone` |
//! | a good tag whose cluster admits no new request; a new conversation with no admitted cluster | 503, `Retry-After: 5` ([`RETRY_AFTER_SECS`]) | `unavailable` |
//! | a good tag whose cluster does not serve the request's `model` ([`RequestModel`](crate::route::RequestModel)) | 404 `model_not_found` | `model_not_served` |
//! | `previous_response_id`, `conversation` or `conversation.id` given twice | 400 | — |
//! | `previous_response_id` and `conversation` tagged for different clusters | 400 | — |
//! | a body naming no stored state (absent, `null`, not a string) | forwarded as it is | — |
//!
//! **Answers.** The ids of 2xx answers of the Responses and Conversations APIs (every
//! path under `/v1/responses` and `/v1/conversations`), JSON or `text/event-stream`, are
//! tagged as they stream out with the cluster named by [`Served`](crate::route::Served);
//! `Content-Length` is removed, as the length changes. Those requests are forwarded with
//! `Accept-Encoding: identity`, so engines send bytes the rewriter can read. Non-2xx
//! answers, other media types, answers without `Served` and answers that still arrive
//! with a `Content-Encoding` other than `identity` pass untouched (their ids then reach
//! the client untagged).
//!
//! Decisions the design leaves open:
//!
//! - **Percent-encoding.** Paths are read as written, never percent-decoded. A tag holds
//!   only RFC 3986 unreserved characters, so a correct client never encodes it; a `%`
//!   anywhere in the id segment, or in a segment after it, is refused (404) rather than
//!   decoded, as decoding could turn `%2F` into a separator. Segments after the id must
//!   be plain too (unreserved, not `.`, no `..`, not empty), so a tag cannot be used to
//!   send another path to a cluster of the client's choosing.
//! - **An untagged id in a body** (`"previous_response_id": "resp_abc"`) is forwarded
//!   untouched and not pinned, counting nothing: the engine judges it, as it would without
//!   the gateway. A path has no such way out: an untagged id there is a 404.
//! - **Both `previous_response_id` and `conversation`** tagged for one cluster pin to it;
//!   for different clusters the request is a 400, as no one cluster holds both.
//! - **Bodies not buffered.** `KeyingLayer` reads every Responses and Conversations body
//!   whole, whatever its `Content-Type`, and refuses one over its limit (413) or in an
//!   encoding nobody decoded (415), so with it outside no tag streams past this layer.
//!   Without a `KeyingLayer` outside, a body is not read and streams through unpinned (the
//!   engine sees the tag and answers 404). Put tower-http's request decompression (capped
//!   with `http_body_util::Limited`) outside `KeyingLayer` to accept compressed bodies,
//!   as the example gateway does. Request trailers of a rewritten body are dropped.
//! - **Answers are identity-coded** from the engine to the client for these APIs; add
//!   compression outside the gateway's layers if clients want it.
//! - An unsafe path segment counts as `bad_tag`, with the malformed tags.
//! - **Conversations and models.** A new conversation may land on any admitted cluster,
//!   and every later request naming it goes there, whatever its `model`. In a grid whose
//!   clusters serve different models, every admitted cluster should serve the models used
//!   with conversations; otherwise the engine answers that it does not serve the model.
//!
//! # Key rotation on reload
//!
//! The layer reads its keys from a [`PinKeys`] handle shared with the gateway. On reload
//! the gateway calls [`PinKeys::set`] with the keys it read: new ids are signed with the
//! current key at once; ids signed with another key verify only if it is the previous key
//! the configuration names, and are refused (404, `invalid_id`) otherwise.
//!
//! # Example: the layer
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
//! use grid_route_layer::pin::{IdKind, PinKeys, PinLayer, TagKey, TagKeys};
//! use grid_route_layer::route::{Pinned, Served};
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
//!     .with_models(["demo-model"])
//!     .with_endpoints(["http://10.0.0.1:8000"])])]);
//! let grid = Grid::new(&spec, GridSettings::default()).unwrap();
//! let key = TagKey::from_bytes(b"an example key of at least 32 bytes!").unwrap();
//! // Keep a clone of the handle: a reload sets the keys through it.
//! let keys = PinKeys::new(TagKeys::new(Some(key)));
//!
//! // Stands in for Confirm -> Affinity -> Select: goes where the request is pinned and
//! // answers as the engine would, naming the cluster that served it.
//! let balancer = service_fn(|req: Request<Full<Bytes>>| async move {
//!     let cluster = req.extensions().get::<Pinned>().unwrap().cluster().clone();
//!     assert_eq!(req.uri(), "/v1/responses/resp_68a3?include=usage");
//!     let mut response = Response::new(Full::new(Bytes::from_static(
//!         br#"{"id":"resp_68a3","object":"response","status":"completed"}"#,
//!     )));
//!     response.headers_mut().insert("content-type", "application/json".parse().unwrap());
//!     response.extensions_mut().insert(Served::new(cluster));
//!     Ok::<_, Infallible>(response)
//! });
//! let gateway = PinLayer::new(grid.clone(), keys.clone()).layer(balancer);
//!
//! // An id this gateway handed out earlier.
//! let east_a = grid.view().clusters()[0].id().clone();
//! let tagged = keys.stamp(east_a.site(), east_a.digest()).tag(IdKind::Response, "resp_68a3").unwrap();
//! let get = |id: &str| {
//!     Request::get(format!("/v1/responses/{id}?include=usage")).body(Full::default()).unwrap()
//! };
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let response = gateway.clone().oneshot(get(&tagged)).await.unwrap();
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(body, format!(r#"{{"id":"{tagged}","object":"response","status":"completed"}}"#));
//!
//! // A tag moved to another cluster fails its mac: 404, nothing forwarded.
//! let forged = tagged.replacen(".1ef772aa.", ".0000beef.", 1);
//! let response = gateway.clone().oneshot(get(&forged)).await.unwrap();
//! assert_eq!(response.status(), StatusCode::NOT_FOUND);
//!
//! // A reload brings a new key and names the old one as previous: old ids keep working.
//! let next = || TagKey::from_bytes(b"the next key, also 32 bytes or more").unwrap();
//! let old = TagKey::from_bytes(b"an example key of at least 32 bytes!").unwrap();
//! keys.set(TagKeys::new(Some(next())).with_previous(Some(old)));
//! let response = gateway.clone().oneshot(get(&tagged)).await.unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//!
//! // The next reload names the old key no longer: its ids are revoked.
//! keys.set(TagKeys::new(Some(next())));
//! let response = gateway.oneshot(get(&tagged)).await.unwrap();
//! assert_eq!(response.status(), StatusCode::NOT_FOUND);
//! # });
//! ```
//!
//! [`GridView::local_site`]: crate::grid::GridView::local_site
//! [`least_loaded`]: crate::select::least_loaded

mod body;
mod future;
mod layer;
pub(crate) mod reference;
mod rewrite;
mod service;
mod tag;
#[cfg(test)]
mod tests;

pub use body::PinBody;
pub use future::ResponseFuture;
pub use layer::{PinKeys, PinLayer};
pub use reference::is_stored_state_api;
pub use rewrite::{Framing, IdRewriter};
pub use service::{PinService, RETRY_AFTER_SECS};
pub use tag::{
    BadTag, IdKind, MAC_HEX_LEN, MAX_ENGINE_ID_BYTES, MIN_TAG_KEY_BYTES, TagKey, TagKeyError,
    TagKeys, TagStamp, UntaggedId,
};
