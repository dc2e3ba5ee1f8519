use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tower::Service;
use tracing::Instrument;

use super::body::{KeyedBody, ResponseBody};
use super::future::ResponseFuture;
use super::keys::{Api, read_model, scan_model};
use super::layer::{BLOCKING_THRESHOLD_BYTES, DEFAULT_BODY_LIMIT_BYTES, DEFAULT_SESSION_HEADERS};
use super::stream::KeySeed;
use super::{DuplicateField, key_request};
use crate::affinity::Affinity;
use crate::answer::ErrorAnswer;
use crate::metrics::{KEYING_SECONDS, KEYS_PER_REQUEST};
use crate::pin::is_stored_state_api;
use crate::route::{BoxError, BufferedBody, Prompt, RequestModel};

/// What every [`KeyingService`] made by one layer shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) seed: KeySeed,
    pub(crate) body_limit: usize,
    pub(crate) affinity: Option<Affinity>,
    pub(crate) session_headers: Arc<[HeaderName]>,
}

impl Shared {
    /// Keys under `seed`, bodies up to [`DEFAULT_BODY_LIMIT_BYTES`], whatever affinity says,
    /// sessions from [`DEFAULT_SESSION_HEADERS`] too.
    pub(crate) fn new(seed: KeySeed) -> Self {
        Self {
            seed,
            body_limit: DEFAULT_BODY_LIMIT_BYTES,
            affinity: None,
            session_headers: DEFAULT_SESSION_HEADERS
                .iter()
                .map(|name| HeaderName::from_static(name))
                .collect(),
        }
    }

    /// The session id of the first configured header the request carries with a value.
    fn header_session(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        self.session_headers
            .iter()
            .find_map(|name| headers.get(name).filter(|value| !value.is_empty()))
            .cloned()
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyingLayer")
            .field("body_limit", &self.body_limit)
            .field("follows_affinity", &self.affinity.is_some())
            .field("session_headers", &self.session_headers)
            .finish_non_exhaustive()
    }
}

/// The service [`KeyingLayer`](super::KeyingLayer) wraps around an inner service.
#[derive(Clone, Debug)]
pub struct KeyingService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> KeyingService<S> {
    /// Keys `inner`'s requests under `seed`: the service `KeyingLayer::new(seed)` builds,
    /// with the same builders ([`body_limit`](Self::body_limit), [`with_affinity`](Self::with_affinity)).
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use bytes::Bytes;
    /// use grid_route_layer::keying::{KeySeed, KeyedBody, KeyingService};
    /// use grid_route_layer::route::Prompt;
    /// use http::{Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// // Answers with the number of keys keying left on the request.
    /// let inner = service_fn(|req: Request<KeyedBody<Full<Bytes>>>| async move {
    ///     let prompt = req.extensions().get::<Prompt>().unwrap();
    ///     Ok::<_, Infallible>(Response::new(prompt.keys().map_or(0, |keys| keys.len()).to_string()))
    /// });
    /// let service = KeyingService::new(inner, KeySeed::random()).body_limit(64 * 1024);
    /// let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "hi ".repeat(400));
    /// let request = Request::post("/v1/chat/completions").body(Full::new(Bytes::from(body))).unwrap();
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let response = service.oneshot(request).await.unwrap();
    /// let keys = response.into_body().collect().await.unwrap().to_bytes();
    /// assert!(std::str::from_utf8(&keys).unwrap().parse::<usize>().unwrap() > 0);
    /// # });
    /// ```
    pub fn new(inner: S, seed: KeySeed) -> Self {
        Self::with_shared(inner, Arc::new(Shared::new(seed)))
    }

    /// Buffers and keys bodies up to `bytes`; see [`KeyingLayer::body_limit`](super::KeyingLayer::body_limit).
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        self.change(|shared| shared.body_limit = bytes)
    }

    /// Reads prompts only while `affinity` is enabled; see
    /// [`KeyingLayer::with_affinity`](super::KeyingLayer::with_affinity).
    #[must_use]
    pub fn with_affinity(self, affinity: Affinity) -> Self {
        self.change(|shared| shared.affinity = Some(affinity))
    }

    /// The name [`with_affinity`](Self::with_affinity) had.
    #[deprecated(note = "renamed `with_affinity`: the name says what it takes")]
    #[must_use]
    pub fn follow(self, affinity: Affinity) -> Self {
        self.with_affinity(affinity)
    }

    pub(crate) fn with_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    fn change(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        change(&mut shared);
        Self::with_shared(self.inner, Arc::new(shared))
    }

    crate::define_inner_service_accessors!();
}

impl<S, B, ResBody> Service<Request<B>> for KeyingService<S>
where
    S: Service<Request<KeyedBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service handles this request; a clone takes its place for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let span = request_span(request.uri().path());
        let read = match ReadPlan::of(&request, self.shared.body_limit) {
            Ok(Some(read)) => read,
            Ok(None) => {
                let future = span.in_scope(|| inner.call(request.map(KeyedBody::streamed)));
                return ResponseFuture::passed(future.instrument(span));
            }
            Err(answer) => return ResponseFuture::answered(answer.into_http_response()),
        };
        let shared = self.shared.clone();
        let header_session = shared.header_session(request.headers());
        ResponseFuture::read(async move {
            let (mut parts, body) = request.into_parts();
            let (bytes, trailers) = match read_up_to(body, shared.body_limit).await {
                Read::Whole(bytes, trailers) => (bytes, trailers),
                Read::OverLimit(_, _) if read.stored_state => {
                    return Ok(over_limit(shared.body_limit).map(ResponseBody::answer));
                }
                Read::OverLimit(prefix, rest) => {
                    tracing::debug!(
                        api = read.name(),
                        limit = shared.body_limit,
                        "body over the keying limit, streamed unkeyed"
                    );
                    match scan_model(&prefix) {
                        Ok(Some(model)) => {
                            parts.extensions.insert(RequestModel::new(model));
                        }
                        Ok(None) => {}
                        Err(duplicate) => {
                            return Ok(
                                refuse_duplicate(read.name(), &duplicate).map(ResponseBody::answer)
                            );
                        }
                    }
                    let request = Request::from_parts(parts, KeyedBody::prefixed(prefix, rest));
                    let response = inner.call(request).await.map_err(Into::into)?;
                    return Ok(response.map(ResponseBody::inner));
                }
                Read::Failed(error) if is_length_limit(&*error) => {
                    tracing::debug!(
                        api = read.name(),
                        limit = shared.body_limit,
                        "decoded body over the limit"
                    );
                    return Ok(over_limit(shared.body_limit).map(ResponseBody::answer));
                }
                Read::Failed(error) => {
                    tracing::debug!(api = read.name(), %error, "request body could not be read");
                    let answer = ErrorAnswer::new(
                        StatusCode::BAD_REQUEST,
                        format!("the request body could not be read: {error}"),
                    )
                    .code("body_unreadable");
                    return Ok(answer.into_http_response().map(ResponseBody::answer));
                }
            };
            let model = match read.api {
                Some(api) => prompt_of(&shared, api, bytes.clone(), header_session)
                    .await
                    .map(|prompt| {
                    let model = prompt.model_arc().cloned();
                    parts.extensions.insert(prompt);
                    model
                }),
                None => scan_model(&bytes),
            };
            match model {
                Ok(Some(model)) => {
                    parts.extensions.insert(RequestModel::new(model));
                }
                Ok(None) => {}
                Err(duplicate) => {
                    return Ok(refuse_duplicate(read.name(), &duplicate).map(ResponseBody::answer));
                }
            }
            parts.extensions.insert(BufferedBody::new(bytes.clone()));
            let body = KeyedBody::buffered_with_trailers(bytes, trailers);
            let response = inner
                .call(Request::from_parts(parts, body))
                .await
                .map_err(Into::into)?;
            Ok(response.map(ResponseBody::inner))
        }
        .instrument(span))
    }
}

/// The request's span (see [`REQUEST_SPAN`]), its outcome, depth and destination left
/// for the layers inside to record.
fn request_span(path: &str) -> tracing::Span {
    let api = match Api::from_path(path) {
        Some(api) => api.name(),
        None if path.starts_with("/v1/conversations") => "conversations",
        None if is_stored_state_api(path) => "responses",
        None => "other",
    };
    tracing::info_span!(
        "grid_route",
        api,
        outcome = tracing::field::Empty,
        depth = tracing::field::Empty,
        site = tracing::field::Empty,
        cluster = tracing::field::Empty,
    )
}

/// How the layer reads a request's body, when it reads it at all.
#[derive(Clone, Copy, Debug)]
struct ReadPlan {
    /// The keyed API of the path, if any: the body is keyed.
    api: Option<Api>,
    /// A Responses or Conversations path: its body may name stored state, so it is read
    /// whole or refused (413), never streamed past the pin layer unread.
    stored_state: bool,
}

impl ReadPlan {
    /// Which requests are read, and how:
    ///
    /// - `POST` to a keyed path, and `POST`/`PUT`/`PATCH` to a stored-state path, are read
    ///   as JSON whatever their `Content-Type` says (the bytes are still forwarded as
    ///   sent), so a mislabelled body cannot carry a tag past the pin layer. A body still
    ///   compressed here (an encoding no outer layer decoded) cannot be read: on a
    ///   stored-state path it is refused with 415, on a keyed path it streams through
    ///   unkeyed. A stored-state body declared over the limit is refused with 413 at once.
    /// - Any other `POST`/`PUT`/`PATCH` whose body is JSON (or has no `Content-Type`) and
    ///   is not compressed is read for its model only, up to the limit.
    /// - Everything else passes through unread.
    fn of<B>(request: &Request<B>, limit: usize) -> Result<Option<Self>, ErrorAnswer> {
        let method = request.method();
        let has_body = method == Method::POST || method == Method::PUT || method == Method::PATCH;
        if !has_body {
            return Ok(None);
        }
        let path = request.uri().path();
        let api = Api::of_request(method.as_str(), path);
        let stored_state = is_stored_state_api(path);
        let headers = request.headers();
        let encoded = headers
            .get(CONTENT_ENCODING)
            .is_some_and(|value| !value.as_bytes().eq_ignore_ascii_case(b"identity"));
        let declared_over = headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|length| length > limit as u64);
        if stored_state {
            if encoded {
                return Err(ErrorAnswer::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "the request body's Content-Encoding cannot be decoded here; send it \
                     uncompressed or as gzip, deflate, br or zstd",
                )
                .code("unsupported_content_encoding"));
            }
            if declared_over {
                return Err(over_limit_answer(limit));
            }
            return Ok(Some(Self { api, stored_state }));
        }
        if encoded {
            return Ok(None);
        }
        if api.is_some() {
            return Ok(Some(Self { api, stored_state }));
        }
        let json = headers
            .get(CONTENT_TYPE)
            .is_none_or(|value| is_json(value.as_bytes()));
        Ok(json.then_some(Self {
            api: None,
            stored_state,
        }))
    }

    /// The API's short name for logs, or `other`.
    fn name(self) -> &'static str {
        self.api.map_or("other", Api::name)
    }
}

/// 413 naming the limit.
fn over_limit_answer(limit: usize) -> ErrorAnswer {
    ErrorAnswer::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is over this gateway's limit of {limit} bytes (max_body_bytes), \
             decompressed size included"
        ),
    )
    .code("request_too_large")
}

fn over_limit(limit: usize) -> Response<http_body_util::Full<Bytes>> {
    over_limit_answer(limit).into_http_response()
}

/// 400 for a routing field given twice.
fn refuse_duplicate(
    api: &'static str,
    duplicate: &DuplicateField,
) -> Response<http_body_util::Full<Bytes>> {
    tracing::debug!(
        api,
        field = duplicate.field,
        "duplicate routing field refused"
    );
    ErrorAnswer::new(StatusCode::BAD_REQUEST, duplicate.to_string())
        .code("duplicate_field")
        .param(duplicate.field)
        .into_http_response()
}

/// Whether an outer layer's size limit (`http_body_util::Limited`, as a gateway puts
/// around a decompressed body) stopped the body.
fn is_length_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        next = error.source();
    }
    false
}

/// `application/json` or any `application/<x>+json`, parameters allowed. A request without
/// a content type is read too: many clients omit it and engines parse the body anyway.
fn is_json(content_type: &[u8]) -> bool {
    let essence = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii()
        .to_ascii_lowercase();
    essence == b"application/json"
        || (essence.starts_with(b"application/") && essence.ends_with(b"+json"))
}

enum Read<B> {
    /// The whole body (and its trailers, if any).
    Whole(Bytes, Option<HeaderMap>),
    /// The body went over the limit: what was read, and the rest, unread.
    OverLimit(Bytes, B),
    Failed(BoxError),
}

/// Reads a body into memory, stopping as soon as it goes over `limit`.
async fn read_up_to<B>(mut body: B, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut trailers = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => return Read::Failed(error.into()),
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
                continue;
            }
        };
        total += data.len();
        // A body in one frame is kept as it came; several are joined once.
        if let Some(buf) = joined.as_mut() {
            buf.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            let capacity = body
                .size_hint()
                .exact()
                .map_or(total, |rest| total + rest as usize);
            let mut buf = BytesMut::with_capacity(capacity.min(limit + 1));
            buf.extend_from_slice(&head);
            buf.extend_from_slice(&data);
            joined = Some(buf);
        } else {
            first = Some(data);
        }
        if total > limit {
            let prefix = joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze);
            return Read::OverLimit(prefix, body);
        }
    }
    let bytes = joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze);
    Read::Whole(bytes, trailers)
}

/// Keys the body (on the blocking pool when it is large), or reads only its model when
/// affinity is switched off.
async fn prompt_of(
    shared: &Arc<Shared>,
    api: Api,
    bytes: Bytes,
    header_session: Option<HeaderValue>,
) -> Result<Prompt, DuplicateField> {
    let settings = shared.affinity.as_ref().map(Affinity::settings);
    if settings.is_some_and(|s| !s.enabled()) {
        return read_model(&bytes);
    }
    // Sessions switched off: none is read from a header, and the body's is dropped below.
    let sessions = settings.is_none_or(|s| s.session_affinity());
    let header_session = header_session.filter(|_| sessions);
    let started = Instant::now();
    let prompt = if bytes.len() > BLOCKING_THRESHOLD_BYTES {
        let shared = shared.clone();
        let len = bytes.len();
        let keyed = move || {
            key_request(
                &shared.seed,
                api,
                &bytes,
                header_session.as_ref().map(HeaderValue::as_bytes),
            )
        };
        match tokio::task::spawn_blocking(keyed).await {
            Ok(prompt) => prompt,
            Err(error) => {
                // Keying does not panic; if it ever did, the request still goes through.
                tracing::warn!(api = api.name(), bytes = len, %error, "keying task failed; routing on load alone");
                return Ok(Prompt::new(
                    None,
                    Err(super::NoKeys::unreadable("a body keying could finish")),
                ));
            }
        }
    } else {
        key_request(
            &shared.seed,
            api,
            &bytes,
            header_session.as_ref().map(HeaderValue::as_bytes),
        )
    }?;
    let prompt = if sessions {
        prompt
    } else {
        prompt.with_session(None)
    };
    metrics::histogram!(KEYING_SECONDS).record(started.elapsed().as_secs_f64());
    match prompt.keys() {
        Ok(keys) => {
            metrics::histogram!(KEYS_PER_REQUEST).record(keys.len() as f64);
            tracing::debug!(
                api = api.name(),
                keys = keys.len(),
                blocks = keys.blocks(),
                "keyed"
            );
        }
        Err(reason) => tracing::debug!(api = api.name(), %reason, "no keys"),
    }
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    use super::is_json;

    #[test]
    fn json_content_types_are_recognised() {
        for yes in [
            &b"application/json"[..],
            b"Application/JSON; charset=utf-8",
            b"application/vnd.api+json",
        ] {
            assert!(is_json(yes), "{yes:?}");
        }
        for no in [
            &b"text/plain"[..],
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
            b"",
        ] {
            assert!(!is_json(no), "{no:?}");
        }
    }
}
