//! A request as an engine gets it: its path under the endpoint's base URL, HTTP/1.1, `host`
//! naming the endpoint, and no hop-by-hop headers either way.

use std::sync::Arc;

use axum::body::Body;
use grid_route_layer::route::BoxError;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};

/// An endpoint's base URL, split for joining request paths onto it.
pub(super) struct BaseUrl {
    /// As configured: how the grid names the endpoint.
    pub(super) url: Arc<str>,
    /// `http://host:port`.
    origin: String,
    /// The path prefix without a trailing `/` (often empty).
    prefix: String,
    /// The `host` header to send.
    host: Option<HeaderValue>,
}

impl BaseUrl {
    pub(super) fn new(url: &Arc<str>) -> Self {
        // Config validation parsed every endpoint URL already; a URL that would not parse
        // here leaves an empty origin and every request fails with a clear error.
        let parsed = url.parse::<Uri>().ok();
        let authority = parsed.as_ref().and_then(|uri| uri.authority().cloned());
        let origin = authority
            .as_ref()
            .map(|a| format!("http://{a}"))
            .unwrap_or_default();
        let prefix = parsed
            .as_ref()
            .map(|uri| uri.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let host = authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        Self {
            url: Arc::clone(url),
            origin,
            prefix,
            host,
        }
    }

    /// The engine URI for a request to `uri` (its path and query, under the prefix).
    fn join(&self, uri: &Uri) -> Result<Uri, BoxError> {
        let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let joined = format!("{}{}{}", self.origin, self.prefix, path_and_query);
        joined
            .parse()
            .map_err(|error| format!("bad engine URL {joined:?}: {error}").into())
    }
}

/// The request as the engine gets it: its URI, HTTP/1.1, hop-by-hop headers dropped and
/// `host` set to the endpoint; body untouched.
pub(super) fn to_engine(request: Request<Body>, base: &BaseUrl) -> Result<Request<Body>, BoxError> {
    let (mut parts, body) = request.into_parts();
    parts.uri = base.join(&parts.uri)?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    match &base.host {
        Some(host) => {
            parts.headers.insert(header::HOST, host.clone());
        }
        None => {
            parts.headers.remove(header::HOST);
        }
    }
    Ok(Request::from_parts(parts, body))
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths_join_under_the_endpoints_prefix() {
        let join = |base: &str, path: &str| {
            BaseUrl::new(&Arc::from(base))
                .join(&path.parse().unwrap())
                .unwrap()
                .to_string()
        };
        assert_eq!(
            join("http://10.0.0.1:8000", "/v1/chat/completions?x=1"),
            "http://10.0.0.1:8000/v1/chat/completions?x=1"
        );
        assert_eq!(
            join("http://10.0.0.1:8000/", "/v1/models"),
            "http://10.0.0.1:8000/v1/models"
        );
        assert_eq!(
            join("http://engine:8000/pool-a/", "/v1/models"),
            "http://engine:8000/pool-a/v1/models"
        );
    }

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-private, close"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }

    #[test]
    fn the_engine_request_names_the_endpoint_as_host() {
        let base = BaseUrl::new(&Arc::from("http://10.0.0.1:8000/pool"));
        let request = Request::builder()
            .uri("/v1/completions")
            .version(Version::HTTP_10)
            .header(header::HOST, "gateway.example")
            .header(header::CONNECTION, "keep-alive")
            .body(Body::empty())
            .unwrap();
        let request = to_engine(request, &base).unwrap();
        assert_eq!(request.uri(), "http://10.0.0.1:8000/pool/v1/completions");
        assert_eq!(request.headers()[header::HOST], "10.0.0.1:8000");
        assert_eq!(request.version(), Version::HTTP_11);
        assert!(request.headers().get(header::CONNECTION).is_none());
    }
}
