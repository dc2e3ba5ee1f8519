//! Stored-state pinning: tag the ids of stored responses and conversations with the
//! cluster that stored them, and read the tags back.
//!
//! An engine stores a Responses `response` or a `conversation` in its own memory, so a
//! request that names one (`GET /v1/responses/{id}`, `previous_response_id`, ...) must
//! reach the one cluster that stored it. Instead of a shared table, the gateway writes the
//! place into the id itself on the way out and reads it on the way in. This module is the
//! sans-IO core of that: plain functions on strings and bytes, no HTTP types, no I/O
//! beyond reading a key file. The pin layer wraps it.
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
//! [`TagKeys`] holds the current key and, after [`TagKeys::rotate`], the previous one:
//! ids signed with the previous key keep verifying for [`PREVIOUS_KEY_GRACE_SECS`] (24
//! hours) after the rotation, long enough for clients to finish conversations in flight;
//! new ids are always signed with the current key. A restart forgets the previous key.
//! Going from no key to a key grants no grace to empty-mac ids (nothing was verified
//! before, so they prove nothing); going from a key to no key accepts any well-formed tag.
//! Time is passed in (`now: Instant`), so the core never reads a clock.
//!
//! # Rewriting bodies
//!
//! [`IdRewriter`] tags the response's own ids in 2xx bodies of the Responses and
//! Conversations endpoints as they stream out, JSON documents and server-sent events alike,
//! whatever the chunk boundaries, holding back at most one possible id.
//!
//! # Example
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
//! let untagged = keys.untag(IdKind::Response, &tagged, now).unwrap();
//! assert_eq!(untagged.engine_id(), "resp_68a3");
//! assert_eq!(untagged.digest(), ClusterDigest::of_name("east-a"));
//!
//! // A forged mac, an untagged id, or an id that is not one path segment is refused.
//! let forged = tagged.replace(".1ef772aa.", ".00000000.");
//! assert_eq!(keys.untag(IdKind::Response, &forged, now), Err(BadTag::BadMac));
//! assert_eq!(keys.untag(IdKind::Response, "resp_68a3", now), Err(BadTag::Untagged));
//! let escape = format!("resp_{}..%2Fadmin", stamp.as_str());
//! assert_eq!(keys.untag(IdKind::Response, &escape, now), Err(BadTag::UnsafeId));
//! ```

mod rewrite;
mod tag;

pub use rewrite::{Framing, IdRewriter};
pub use tag::{
    BadTag, IdKind, MAC_HEX_LEN, MAX_ENGINE_ID_BYTES, MIN_TAG_KEY_BYTES, PREVIOUS_KEY_GRACE_SECS,
    TagKey, TagKeyError, TagKeys, TagStamp, UntaggedId,
};
