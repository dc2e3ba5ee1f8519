//! [`FeedbackService`] and its response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::body::{CachedCounts, FeedbackBody, Prediction, PrefillTiming, Teach};
use super::forget::EvictionMarks;
use super::usage::UsageReader;
use crate::affinity::Affinity;
use crate::keying::Api;
use crate::route::{Candidates, PredictedMatch, Prompt, Served};
use crate::select::is_event_stream;

/// Reads the engine's usage from every successful answer to a prompt. See the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct FeedbackService<S> {
    inner: S,
    teach: Option<Affinity>,
    counts: Arc<CachedCounts>,
}

impl<S> FeedbackService<S> {
    /// Wraps `inner`, whose answers carry [`Served`]: the service `FeedbackLayer::new()`
    /// builds. The answer's body passes through as it was; its usage is counted as it ends.
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use bytes::Bytes;
    /// use grid_route_layer::feedback::FeedbackService;
    /// use grid_route_layer::grid::{ClusterId, SiteName};
    /// use grid_route_layer::route::Served;
    /// use http::{Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// const ANSWER: &[u8] = br#"{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}"#;
    /// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
    /// let inner = service_fn(move |_: Request<()>| {
    ///     let mut response = Response::new(Full::new(Bytes::from_static(ANSWER)));
    ///     response.extensions_mut().insert(Served::new(east.clone()));
    ///     async move { Ok::<_, Infallible>(response) }
    /// });
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let request = Request::post("/v1/chat/completions").body(()).unwrap();
    /// let response = FeedbackService::new(inner).oneshot(request).await.unwrap();
    /// assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), ANSWER);
    /// # });
    /// ```
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            teach: None,
            counts: Arc::default(),
        }
    }

    /// Wraps `inner`; an engine that reports far less cached than `affinity`'s index
    /// predicted makes the index forget, and each answer teaches `affinity` its cluster's
    /// prices (see [`FeedbackLayer::with_affinity`](super::FeedbackLayer::with_affinity)).
    pub fn with_affinity(inner: S, affinity: Affinity) -> Self {
        Self {
            inner,
            teach: Some(affinity),
            counts: Arc::default(),
        }
    }

    /// Shares `counts` with the services of the same layer.
    pub(super) fn sharing(mut self, counts: Arc<CachedCounts>) -> Self {
        self.counts = counts;
        self
    }

    /// The name [`with_affinity`](Self::with_affinity) had.
    #[deprecated(note = "renamed `with_affinity`: the name says what it takes")]
    pub fn teaching(inner: S, affinity: Affinity) -> Self {
        Self::with_affinity(inner, affinity)
    }

    crate::define_inner_service_accessors!();

    /// What the request's answer will be weighed against: its predicted match, when
    /// affinity made it sticky or sent it to its session's cluster, and when each candidate was last confirmed for the
    /// prompt's deepest matched key (read now, before confirmation refreshes it).
    fn prediction<B>(&self, request: &Request<B>, now: Instant) -> Option<Prediction> {
        let matched = *request.extensions().get::<PredictedMatch>()?;
        // Marks are read only while engine feedback is on: nothing would use them.
        let teach = self.teach.as_ref().and_then(|affinity| {
            if !affinity.settings().engine_feedback() {
                return None;
            }
            let keys = request.extensions().get::<Prompt>()?.keys().ok()?;
            let candidates = request.extensions().get::<Candidates>()?;
            let marks =
                EvictionMarks::read(affinity.index(), candidates.as_slice(), keys, matched, now);
            Some(Teach {
                affinity: affinity.clone(),
                marks,
            })
        });
        Some(Prediction { matched, teach })
    }
}

impl<S, B, ResB> Service<Request<B>> for FeedbackService<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<FeedbackBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let now = Instant::now();
        let generates = generates(&request);
        let prediction = generates.then(|| self.prediction(&request, now)).flatten();
        ResponseFuture {
            inner: self.inner.call(request),
            counts: Arc::clone(&self.counts),
            generates,
            prediction,
            learn: self
                .teach
                .clone()
                .filter(|_| generates)
                .map(|affinity| (affinity, now)),
        }
    }
}

/// Whether `request` asks an engine to prefill its prompt: a `POST` to one of the keyed
/// APIs ([`Api::of_request`]). Other answers can carry a usage too, but not one the engine
/// just served: `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` return a
/// stored response with the usage of the request that made it, which was counted then.
fn generates<B>(request: &Request<B>) -> bool {
    Api::of_request(request.method().as_str(), request.uri().path()).is_some()
}

pin_project! {
    /// The future of [`FeedbackService`]: the inner answer with its body wrapped.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        counts: Arc<CachedCounts>,
        // Whether the request asked for a prompt to be prefilled: only its answer counts.
        generates: bool,
        prediction: Option<Prediction>,
        // The affinity that learns prefill speeds, and when this layer was called (the
        // time to first token starts there when the answer does not say when it was sent).
        learn: Option<(Affinity, Instant)>,
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("predicted", &self.prediction.as_ref().map(|p| p.matched))
            .finish_non_exhaustive()
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<FeedbackBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        // Only a successful engine answer counts: errors carry no usage, and an answer
        // without `Served` did not come from a cluster.
        let cluster = response
            .extensions()
            .get::<Served>()
            .filter(|_| *this.generates && response.status().is_success())
            .map(|served| (served.cluster().clone(), served.load(), served.sent()));
        let event_stream = is_event_stream(response.headers());
        Poll::Ready(Ok(response.map(|body| match cluster {
            Some((cluster, load, sent)) => FeedbackBody::read(
                body,
                UsageReader::new(event_stream),
                Arc::clone(this.counts),
                cluster,
                this.prediction.take(),
                this.learn.take().map(|(affinity, called)| {
                    // From the attempt that answered when the balancer says when it sent
                    // it: a failed attempt before it (a retry layer below this one) is no
                    // part of the cluster's time to first token.
                    let dispatched = sent.unwrap_or(called);
                    PrefillTiming {
                        affinity,
                        dispatched,
                        load,
                        event_stream,
                        started: (!event_stream).then(|| dispatched.elapsed()),
                        output: crate::select::OutputScan::default(),
                    }
                }),
            ),
            None => FeedbackBody::unread(body),
        })))
    }
}
