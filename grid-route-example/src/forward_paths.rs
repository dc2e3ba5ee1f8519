//! Which requests the consumer role forwards: a list of path patterns, each with its
//! methods, checked before anything reaches an engine.
//!
//! Engines serve more than the LLM API: vLLM and SGLang expose tokenizer, profiling,
//! cache-reset and admin routes on the same port, and a mock engine shows the last body
//! it received. A gateway that forwarded any path would hand those to every client. So
//! the consumer role forwards only the paths of [`DEFAULT_FORWARD_PATHS`] (or the
//! operator's `forward_paths`, which replaces the list); anything else is a 404 and a
//! known path with another method a 405 with `Allow`, both answered by the gateway.
//!
//! A pattern is an exact path whose segments may be `{name}` placeholders. A placeholder
//! matches one non-empty segment made of URL-unreserved characters (letters, digits,
//! `-`, `.`, `_`, `~`) other than `.` and `..`: ids (tagged ones included) fit, and no
//! request can climb out of the pattern through an engine that resolves dot segments or
//! percent-escapes.
//!
//! ```
//! use grid_route_example::forward_paths::{ForwardPaths, PathCheck};
//! use http::Method;
//!
//! let paths = ForwardPaths::default_list();
//! assert_eq!(paths.check(&Method::POST, "/v1/chat/completions"), PathCheck::Forward);
//! assert_eq!(paths.check(&Method::GET, "/v1/responses/resp_abc"), PathCheck::Forward);
//! assert_eq!(paths.check(&Method::GET, "/mock/last_body"), PathCheck::NotFound);
//! assert_eq!(
//!     paths.check(&Method::PUT, "/v1/responses/resp_abc"),
//!     PathCheck::MethodNotAllowed("GET, DELETE".to_owned()),
//! );
//! ```

use std::fmt;

use http::Method;
use serde::Deserialize;

/// The paths forwarded when the config names no `forward_paths`, with their methods.
///
/// The OpenAI and Anthropic public API paths that inference engines serve (vLLM's
/// "Online Serving" list, SGLang's OpenAI-compatible server, llama.cpp's server):
///
/// - generation: Chat Completions, Completions, Anthropic Messages (and its
///   `count_tokens`), Responses;
/// - the stored state of the Responses API: a response, its cancellation and input items;
///   conversations, their items and each item;
/// - embeddings, models, and the OpenAI audio transcription and translation APIs (vLLM
///   serves them for speech-recognition models).
///
/// Left out on purpose, for an operator to add with `forward_paths` when their engines
/// need them: routes outside the OpenAI and Anthropic APIs, such as vLLM's `/tokenize`,
/// `/detokenize`, `/v1/score`, the Cohere/Jina-style `/v1/rerank`, `/pooling`,
/// `/invocations`, and every engine admin route (`/metrics`, `/health`, cache resets,
/// profiling).
pub const DEFAULT_FORWARD_PATHS: &[(&str, &[&str])] = &[
    ("/v1/chat/completions", &["POST"]),
    ("/v1/completions", &["POST"]),
    ("/v1/messages", &["POST"]),
    ("/v1/messages/count_tokens", &["POST"]),
    ("/v1/responses", &["POST"]),
    ("/v1/responses/{id}", &["GET", "DELETE"]),
    ("/v1/responses/{id}/cancel", &["POST"]),
    ("/v1/responses/{id}/input_items", &["GET"]),
    ("/v1/conversations", &["POST"]),
    ("/v1/conversations/{id}", &["GET", "POST", "DELETE"]),
    ("/v1/conversations/{id}/items", &["GET", "POST"]),
    ("/v1/conversations/{id}/items/{item_id}", &["GET", "DELETE"]),
    ("/v1/embeddings", &["POST"]),
    ("/v1/models", &["GET"]),
    ("/v1/audio/transcriptions", &["POST"]),
    ("/v1/audio/translations", &["POST"]),
];

/// One entry of `forward_paths` in the YAML: `{ path: /v1/responses/{id}, methods: [GET, DELETE] }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ForwardPathConfig {
    /// An exact path; `{name}` segments match one id-like segment.
    pub path: String,
    /// The methods forwarded on it (upper case, at least one).
    pub methods: Vec<String>,
}

impl ForwardPathConfig {
    /// The default list as config entries.
    pub fn defaults() -> Vec<Self> {
        DEFAULT_FORWARD_PATHS
            .iter()
            .map(|(path, methods)| Self {
                path: (*path).to_owned(),
                methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            })
            .collect()
    }
}

/// The checked list of forwarded paths. See the [module docs](self).
#[derive(Clone, PartialEq, Eq)]
pub struct ForwardPaths {
    routes: Vec<Route>,
}

#[derive(Clone, PartialEq, Eq)]
struct Route {
    segments: Vec<Segment>,
    methods: Vec<Method>,
}

#[derive(Clone, PartialEq, Eq)]
enum Segment {
    Exact(String),
    Placeholder,
}

/// What to do with a request, by its method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathCheck {
    /// The path and method are on the list.
    Forward,
    /// No pattern matches the path.
    NotFound,
    /// A pattern matches the path but not the method; the `Allow` value it would take.
    MethodNotAllowed(String),
}

/// Why a `forward_paths` entry was refused: the index of the entry and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {expected}, got {value:?}")]
pub struct ForwardPathError {
    /// The field, as a path in the file (`forward_paths[2].methods[0]`).
    pub field: String,
    /// The bad value.
    pub value: String,
    /// What it must be.
    pub expected: &'static str,
}

impl ForwardPaths {
    /// [`DEFAULT_FORWARD_PATHS`], checked.
    pub fn default_list() -> Self {
        // The default list is written above and covered by a test: it always parses.
        Self::parse(&ForwardPathConfig::defaults()).unwrap_or(Self { routes: Vec::new() })
    }

    /// Checks the entries of `forward_paths`; the first bad one is the error.
    pub fn parse(entries: &[ForwardPathConfig]) -> Result<Self, ForwardPathError> {
        let mut routes = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let path = &entry.path;
            let bad_path = || ForwardPathError {
                field: format!("forward_paths[{i}].path"),
                value: path.clone(),
                expected: "must be a path starting with '/' whose segments are text or a whole \
                           {name} placeholder (no query, fragment, empty or dot segment)",
            };
            let Some(rest) = path.strip_prefix('/') else {
                return Err(bad_path());
            };
            let mut segments = Vec::new();
            for segment in rest.split('/') {
                let parsed = if segment.starts_with('{') && segment.ends_with('}') {
                    Segment::Placeholder
                } else if segment.is_empty()
                    || segment == "."
                    || segment == ".."
                    || segment.contains(['{', '}', '?', '#'])
                {
                    return Err(bad_path());
                } else {
                    Segment::Exact(segment.to_owned())
                };
                segments.push(parsed);
            }
            if entry.methods.is_empty() {
                return Err(ForwardPathError {
                    field: format!("forward_paths[{i}].methods"),
                    value: "[]".to_owned(),
                    expected: "must name at least one method",
                });
            }
            let mut methods = Vec::with_capacity(entry.methods.len());
            for (m, method) in entry.methods.iter().enumerate() {
                let parsed = Method::from_bytes(method.as_bytes())
                    .ok()
                    .filter(|_| method.bytes().all(|b| b.is_ascii_uppercase()));
                let Some(parsed) = parsed else {
                    return Err(ForwardPathError {
                        field: format!("forward_paths[{i}].methods[{m}]"),
                        value: method.clone(),
                        expected: "must be an HTTP method in upper case (GET, POST, DELETE, ...)",
                    });
                };
                if !methods.contains(&parsed) {
                    methods.push(parsed);
                }
            }
            routes.push(Route { segments, methods });
        }
        Ok(Self { routes })
    }

    /// Whether a request with `method` to `path` (no query) is forwarded.
    ///
    /// When several patterns match the path, their methods add up.
    pub fn check(&self, method: &Method, path: &str) -> PathCheck {
        let mut allowed: Vec<&Method> = Vec::new();
        for route in self.routes.iter().filter(|route| route.matches(path)) {
            if route.methods.contains(method) {
                return PathCheck::Forward;
            }
            for m in &route.methods {
                if !allowed.contains(&m) {
                    allowed.push(m);
                }
            }
        }
        if allowed.is_empty() {
            PathCheck::NotFound
        } else {
            let names: Vec<&str> = allowed.iter().map(|m| m.as_str()).collect();
            PathCheck::MethodNotAllowed(names.join(", "))
        }
    }
}

impl Route {
    fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut given = rest.split('/');
        for segment in &self.segments {
            let Some(part) = given.next() else {
                return false;
            };
            let fits = match segment {
                Segment::Exact(text) => part == text,
                Segment::Placeholder => is_id_segment(part),
            };
            if !fits {
                return false;
            }
        }
        given.next().is_none()
    }
}

/// A non-empty segment of URL-unreserved characters (RFC 3986 §2.3) other than a dot
/// segment: what an id looks like, and nothing an engine would decode or resolve.
fn is_id_segment(part: &str) -> bool {
    !part.is_empty()
        && part != "."
        && part != ".."
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

impl fmt::Debug for ForwardPaths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardPaths")
            .field("routes", &self.routes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, methods: &[&str]) -> ForwardPathConfig {
        ForwardPathConfig {
            path: path.to_owned(),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn the_default_list_parses_whole() {
        let parsed = ForwardPaths::parse(&ForwardPathConfig::defaults()).unwrap();
        assert_eq!(parsed.routes.len(), DEFAULT_FORWARD_PATHS.len());
        assert_eq!(parsed, ForwardPaths::default_list());
    }

    #[test]
    fn placeholders_match_one_id_segment_and_nothing_else() {
        let paths = ForwardPaths::default_list();
        let get = |path: &str| paths.check(&Method::GET, path);
        assert_eq!(
            get("/v1/responses/resp_east.0a1b.mac.xyz"),
            PathCheck::Forward
        );
        assert_eq!(
            get("/v1/conversations/conv_1/items/msg_2"),
            PathCheck::Forward
        );
        for refused in [
            "/v1/responses/",
            "/v1/responses/..",
            "/v1/responses/.",
            "/v1/responses/%2e%2e",
            "/v1/responses/a/b",
            "/v1/responses//input_items",
            "/v1/chat/completions/",
            "/v1//chat/completions",
            "/metrics",
            "/mock/last_body",
            "v1/models",
        ] {
            assert_eq!(get(refused), PathCheck::NotFound, "{refused}");
        }
    }

    #[test]
    fn a_known_path_with_another_method_names_the_allowed_ones() {
        let paths = ForwardPaths::default_list();
        assert_eq!(
            paths.check(&Method::GET, "/v1/chat/completions"),
            PathCheck::MethodNotAllowed("POST".to_owned())
        );
        assert_eq!(
            paths.check(&Method::PATCH, "/v1/conversations/conv_1"),
            PathCheck::MethodNotAllowed("GET, POST, DELETE".to_owned())
        );
    }

    #[test]
    fn patterns_on_the_same_path_add_their_methods() {
        let paths =
            ForwardPaths::parse(&[entry("/v1/x/{id}", &["GET"]), entry("/v1/x/{id}", &["PUT"])])
                .unwrap();
        assert_eq!(paths.check(&Method::PUT, "/v1/x/1"), PathCheck::Forward);
        assert_eq!(
            paths.check(&Method::POST, "/v1/x/1"),
            PathCheck::MethodNotAllowed("GET, PUT".to_owned())
        );
    }

    #[test]
    fn bad_entries_name_the_field_and_value() {
        let cases = [
            (entry("v1/x", &["GET"]), "forward_paths[0].path"),
            (entry("/v1/x?y=1", &["GET"]), "forward_paths[0].path"),
            (entry("/v1//x", &["GET"]), "forward_paths[0].path"),
            (entry("/v1/x{id}", &["GET"]), "forward_paths[0].path"),
            (entry("/v1/../x", &["GET"]), "forward_paths[0].path"),
            (entry("/v1/x", &[]), "forward_paths[0].methods"),
            (entry("/v1/x", &["get"]), "forward_paths[0].methods[0]"),
            (
                entry("/v1/x", &["GET", "PO ST"]),
                "forward_paths[0].methods[1]",
            ),
        ];
        for (bad, field) in cases {
            let error = ForwardPaths::parse(std::slice::from_ref(&bad)).unwrap_err();
            assert_eq!(error.field, field, "{bad:?}");
        }
    }
}
