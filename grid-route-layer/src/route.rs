//! The seams between the layers: every typed extension one layer leaves for another.
//!
//! Layers never call each other; they read and write these values in
//! [`http::Extensions`]. A gateway that swaps one layer for its own code only has to honour
//! the extensions listed here.
//!
//! | seam | kind | written by | read by |
//! |---|---|---|---|
//! | [`Prompt`] | request extension | [`KeyingLayer`] | [`AffinityLayer`], [`ConfirmLayer`], [`FeedbackLayer`] (the keys, to mark what an engine evicted), the gateway's engine client ([`Prompt::streamed`], which of its stall windows a request is held to) |
//! | [`RequestModel`] | request extension | [`KeyingLayer`], for any body it read (keyed or not) | [`PinLayer`], [`AffinityLayer`], [`Select`] |
//! | [`BufferedBody`] | request extension | [`KeyingLayer`], [`PinLayer`] (when it rewrites the body) | [`PinLayer`] |
//! | [`Pinned`] | request extension | [`PinLayer`] | [`AffinityLayer`], [`Select`] |
//! | [`Candidates`] | request extension | [`AffinityLayer`] | [`Select`] or the gateway's own balancer |
//! | [`Outcome`] | request extension | [`AffinityLayer`], when it counted a decision | the gateway (its request log) |
//! | [`PredictedMatch`] | request extension | [`AffinityLayer`], for a sticky or session request (saying whether it asks for a shared head, or joins a busier holder of one) | [`FeedbackLayer`], [`Select`] (the prompt it prefills; the joins it counts) |
//! | [`Placed`] | request extension | [`AffinityLayer`], for a new conversation it placed on a free slot (a placement or a join) | [`Select`] (takes over its count in flight) |
//! | [`Served`] | response extension | [`Select`] or the gateway's own balancer | [`ConfirmLayer`], [`PinLayer`], [`FeedbackLayer`] |
//! | [`DispatchError`] | error (in the chain) | [`Select`] or the gateway's own balancer | [`ConfirmLayer`] |
//! | [`NoCandidate`] | error | [`Select`] | the gateway (404 when no cluster serves the model, else 503) |
//!
//! One seam is not an extension: the [`Affinity`] handle, which the gateway builds once
//! (its prefix index, its settings, the prices and the shared heads it learns) and hands to the four layers
//! that share that state. Each takes it by name:
//!
//! | layer | takes the handle through | and uses it to |
//! |---|---|---|
//! | [`KeyingLayer`] | [`with_affinity`](crate::keying::KeyingLayer::with_affinity) | read prompts only while affinity is enabled, and sessions only while session affinity is |
//! | [`AffinityLayer`] | [`new`](crate::affinity::AffinityLayer::new) | decide: the index's depths, the threshold, the load gate at the learned prices, where new conversations may join a holder that keeps shared heads |
//! | [`ConfirmLayer`] | [`new`](crate::confirm::ConfirmLayer::new) | confirm or drop the request's keys in the index at the answer's head (a 2xx event stream's at its first output) |
//! | [`FeedbackLayer`] | [`with_affinity`](crate::feedback::FeedbackLayer::with_affinity) | make the index forget what an engine evicted, teach the prices, and count whether a cluster kept the shared head a first turn asked for |
//!
//! Clones share one state, and a reload changes it in place
//! ([`Affinity::set_settings`](crate::affinity::Affinity::set_settings),
//! [`PrefixIndex::reconfigure`](crate::index::PrefixIndex::reconfigure)), so the layers
//! never need rebuilding to see new settings.
//!
//! [`KeyingLayer`]: crate::keying::KeyingLayer
//! [`AffinityLayer`]: crate::affinity::AffinityLayer
//! [`PinLayer`]: crate::pin::PinLayer
//! [`ConfirmLayer`]: crate::confirm::ConfirmLayer
//! [`FeedbackLayer`]: crate::feedback::FeedbackLayer
//! [`Outcome`]: crate::affinity::Outcome
//! [`Select`]: crate::select::Select
//! [`Affinity`]: crate::affinity::Affinity

use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;

use crate::grid::{ClusterId, InFlight, SiteName};
use crate::keying::{NoKeys, PrefixKeys, SessionKey};

/// The name of the `tracing` span each request runs in, opened by
/// [`KeyingLayer`](crate::keying::KeyingLayer) (the outermost layer) at `INFO` level.
///
/// Its fields, filled in as the layers decide: `api` (`chat`, `completions`, `messages`,
/// `responses`, `conversations` or `other`), `outcome` (the affinity outcome, or the pin
/// outcome for a request naming stored state), `depth` (matched keys of the deepest
/// holder), `site` and `cluster` (where [`Select`] sent it). Never prompt text or keys.
///
/// [`Select`]: crate::select::Select
pub const REQUEST_SPAN: &str = "grid_route";

/// Records `value` as `field` of the current request span (a no-op outside one).
pub(crate) fn record_on_span(field: &'static str, value: impl tracing::Value) {
    tracing::Span::current().record(field, value);
}

/// The error type at Tower boundaries: any error, boxed.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// What keying made of a request body: its model, its prefix keys or why it has none, and
/// its session when the client named one.
///
/// Set by `KeyingLayer` on every request it could read as one of the keyed APIs; a request
/// without it was not keyed (another path, not JSON, compressed, over the body limit) and
/// routes on its [`RequestModel`] and load alone. `Debug` prints counts, never keys or text.
#[derive(Clone)]
pub struct Prompt {
    model: Option<Arc<str>>,
    keys: Result<PrefixKeys, NoKeys>,
    session: Option<SessionKey>,
    thread: Option<SessionKey>,
    streamed: bool,
}

impl Prompt {
    /// A prompt for `model` with these keys (or the reason it has none), and no session
    /// or thread.
    pub fn new(model: Option<Arc<str>>, keys: Result<PrefixKeys, NoKeys>) -> Self {
        Self {
            model,
            keys,
            session: None,
            thread: None,
            streamed: false,
        }
    }

    /// The same prompt with `thread` as its [`thread`](Self::thread) (none when `None`).
    #[must_use]
    pub fn with_thread(mut self, thread: Option<SessionKey>) -> Self {
        self.thread = thread;
        self
    }

    /// The same prompt in `session` (none when `None`).
    #[must_use]
    pub fn with_session(mut self, session: Option<SessionKey>) -> Self {
        self.session = session;
        self
    }

    /// The same prompt, its answer asked for as an event stream (`"stream": true`) or not.
    #[must_use]
    pub fn with_streamed(mut self, streamed: bool) -> Self {
        self.streamed = streamed;
        self
    }

    /// Whether the request asked for its answer as an event stream (a top-level
    /// `"stream": true` read before keying stopped), whose head engines send before they
    /// prefill; `false` for a whole answer, whose head comes once it is generated.
    ///
    /// ```
    /// use grid_route_layer::keying::{Api, KeySeed, key_body};
    ///
    /// let seed = KeySeed::random();
    /// let streamed = |body: &str| {
    ///     key_body(&seed, Api::ChatCompletions, body.as_bytes()).unwrap().streamed()
    /// };
    /// assert!(streamed(r#"{"model":"m","stream":true,"messages":[]}"#));
    /// assert!(!streamed(r#"{"model":"m","stream":false,"messages":[]}"#));
    /// assert!(!streamed(r#"{"model":"m","stream":"true","messages":[]}"#));
    /// assert!(!streamed(r#"{"model":"m","messages":[]}"#));
    /// // The last one given counts, as a JSON parser reads it.
    /// assert!(streamed(r#"{"stream":false,"model":"m","messages":[],"stream":true}"#));
    /// ```
    pub fn streamed(&self) -> bool {
        self.streamed
    }

    /// The session the client named (`prompt_cache_key`, Anthropic `metadata.user_id`, a
    /// session header), keyed and namespaced like the prefix keys.
    pub fn session(&self) -> Option<SessionKey> {
        self.session
    }

    /// The prompt's thread: a key of its whole canonical stream, to the last byte, that
    /// a later turn of the same conversation names as the prompt it
    /// [`follows`](PrefixKeys::follows). Kept in the index like a session where the prompt
    /// was answered. `None` for Completions and for prompts keying could not read.
    pub fn thread(&self) -> Option<SessionKey> {
        self.thread
    }

    /// The request's `model`, when it named one as a string.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The model as a shared string.
    pub fn model_arc(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }

    /// The prefix keys, or why the request has none.
    pub fn keys(&self) -> Result<&PrefixKeys, &NoKeys> {
        self.keys.as_ref()
    }
}

impl fmt::Debug for Prompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Prompt");
        d.field("model", &self.model);
        match &self.keys {
            Ok(keys) => d.field("keys", keys),
            Err(reason) => d.field("no_keys", reason),
        };
        d.field("session", &self.session.is_some());
        d.field("thread", &self.thread.is_some());
        d.field("streamed", &self.streamed);
        d.finish()
    }
}

/// The request's top-level `model`, read from its body: every request is routed only to
/// clusters that serve its model.
///
/// Set by [`KeyingLayer`](crate::keying::KeyingLayer) on every request whose body it read
/// (the keyed APIs, stored-state paths, and other JSON bodies, where a bounded prefix of
/// the body is scanned) and that named a model as a string. Absent: the model is not known
/// (no body, not JSON, compressed beyond the gateway's reach, or not within the first
/// `max_body_bytes`) and every admitted cluster may take the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestModel(Arc<str>);

impl RequestModel {
    /// The request names `model`.
    pub fn new(model: impl Into<Arc<str>>) -> Self {
        Self(model.into())
    }

    /// The model.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The model as a shared string.
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }

    /// The model a request names: its [`RequestModel`], else its [`Prompt`]'s (for a
    /// keying layer of the gateway's own that sets only the prompt).
    pub fn of(extensions: &http::Extensions) -> Option<&str> {
        extensions
            .get::<RequestModel>()
            .map(RequestModel::as_str)
            .or_else(|| extensions.get::<Prompt>().and_then(Prompt::model))
    }
}

/// The request body exactly as it will be forwarded, when a layer holds it whole in memory.
///
/// Set by [`KeyingLayer`](crate::keying::KeyingLayer) when it buffered the body (a keyed
/// path, JSON, within the body limit), so that later layers read the bytes without
/// collecting the body again. A layer that rewrites the body must replace both the body
/// and this extension. Absent: the body is streamed and no layer may read it.
#[derive(Clone)]
pub struct BufferedBody(Bytes);

impl BufferedBody {
    /// The body is `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// The body's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }
}

impl fmt::Debug for BufferedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The body is prompt text: only its size is printed.
        write!(f, "BufferedBody({} bytes)", self.0.len())
    }
}

/// The request names stored state that lives on one cluster, so it must go there.
///
/// Set by [`PinLayer`](crate::pin::PinLayer) once it has checked the tag and that the
/// cluster is in the grid and admits requests (or, for a new conversation, chosen where it
/// is stored). Affinity then offers this cluster alone, and counts nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    cluster: ClusterId,
}

impl Pinned {
    /// Pins the request to `cluster`.
    pub fn new(cluster: ClusterId) -> Self {
        Self { cluster }
    }

    /// The cluster the request must go to.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }
}

/// The clusters the inner balancer may pick among, as narrowed by affinity.
///
/// In the grid's config order; the order carries no preference — the balancer picks by
/// load. Every id was an admitted cluster serving the request's model when affinity ran
/// (or, for a [`Pinned`] request, its cluster alone); a balancer should still skip ids
/// that have left the grid or stopped admitting since. Empty when no admitted cluster
/// serves the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidates {
    clusters: Arc<[ClusterId]>,
}

impl Candidates {
    /// These clusters, in this order.
    pub fn new(clusters: impl Into<Arc<[ClusterId]>>) -> Self {
        Self {
            clusters: clusters.into(),
        }
    }

    /// The clusters.
    pub fn as_slice(&self) -> &[ClusterId] {
        &self.clusters
    }

    /// Whether `cluster` is among them.
    pub fn contains(&self, cluster: &ClusterId) -> bool {
        self.clusters.contains(cluster)
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

/// How much of a sticky (or session) request's prompt the index predicts the serving cluster
/// holds.
///
/// Set by [`AffinityLayer`](crate::affinity::AffinityLayer) when the outcome is
/// [`Sticky`](crate::affinity::Outcome::Sticky): every candidate left then holds the prompt
/// to the same depth, so whichever one the balancer picks, this is its matched depth; and
/// when it is [`Session`](crate::affinity::Outcome::Session) with a depth at the session's
/// cluster, the only candidate, at the bytes it is believed to hold
/// ([`predicted_match`](crate::affinity::predicted_match)).
/// [`FeedbackLayer`](crate::feedback::FeedbackLayer) weighs it against the cached tokens
/// the engine reports. Absent: affinity predicted no match worth sticking to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PredictedMatch {
    depth: usize,
    covered_bytes: u64,
    asks_shared_head: bool,
    joins_busier_holder: bool,
}

impl PredictedMatch {
    /// The serving cluster holds the prompt's first `depth` keys, covering
    /// `covered_bytes` of canonical prompt.
    pub fn new(depth: usize, covered_bytes: u64) -> Self {
        Self {
            depth,
            covered_bytes,
            asks_shared_head: false,
            joins_busier_holder: false,
        }
    }

    /// The same match, made by a conversation's first turn that stuck to a holder of a
    /// short head other conversations share, no busier than the other candidates: its
    /// answer tells whether the holder's engines keep such heads
    /// ([`Decision::asks_shared_head`](crate::affinity::Decision::asks_shared_head)).
    #[must_use]
    pub fn asking_shared_head(mut self) -> Self {
        self.asks_shared_head = true;
        self
    }

    /// Whether the answer tells if the serving cluster keeps shared heads
    /// ([`asking_shared_head`](Self::asking_shared_head)).
    pub fn asks_shared_head(&self) -> bool {
        self.asks_shared_head
    }

    /// The same match, made by a conversation's first turn that joins a busier holder of a
    /// short shared head, one with a free slot whose engines keep such heads
    /// ([`Decision::joins_busier_holder`](crate::affinity::Decision::joins_busier_holder)):
    /// [`Select`](crate::select::Select) counts it where it sends it.
    #[must_use]
    pub fn joining_busier_holder(mut self) -> Self {
        self.joins_busier_holder = true;
        self
    }

    /// Whether the request joins a busier holder
    /// ([`joining_busier_holder`](Self::joining_busier_holder)).
    pub fn joins_busier_holder(&self) -> bool {
        self.joins_busier_holder
    }

    /// Matched keys at the serving cluster.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Bytes of canonical prompt those keys cover.
    pub fn covered_bytes(&self) -> u64 {
        self.covered_bytes
    }
}

/// Where a new conversation waits before it reaches the engine, set by
/// [`AffinityLayer`](crate::affinity::AffinityLayer) ([`Decision::holds`]): at each of these
/// clusters a slot just went idle, and the conversation answered there may be about to
/// send its next turn. [`Select`](crate::select::Select), having picked one of them, waits
/// until the time given ([`SLOT_RECLAIM_HOLD`] after the answer's end, longer when another
/// answer ends there meanwhile: that constant's doc) before it sends the request, counting
/// it in flight there meanwhile: the live turn reaches its slot first,
/// and the newcomer takes another (why a newcomer sent at once may take the live one's
/// slot: [`slot_just_freed`]). A balancer of your own may ignore it.
///
/// [`slot_just_freed`]: crate::grid::ClusterLoad::slot_just_freed
///
/// [`Decision::holds`]: crate::affinity::Decision::holds
/// [`SLOT_RECLAIM_HOLD`]: crate::grid::SLOT_RECLAIM_HOLD
#[derive(Debug, Clone)]
pub struct SlotHold {
    until: Arc<[(ClusterId, Instant)]>,
}

impl SlotHold {
    /// A hold at each `(cluster, until)`.
    pub fn new(until: impl Into<Arc<[(ClusterId, Instant)]>>) -> Self {
        Self {
            until: until.into(),
        }
    }

    /// Until when a request sent to `cluster` waits, if it does.
    pub fn until(&self, cluster: &ClusterId) -> Option<Instant> {
        self.until
            .iter()
            .find(|(id, _)| id == cluster)
            .map(|&(_, until)| until)
    }
}

/// A new conversation [`AffinityLayer`](crate::affinity::AffinityLayer) placed on a free
/// slot (by the free-slot rule, or joining a busier holder of its shared head), already
/// counted in flight at that cluster ([`Decision::placed`](crate::affinity::Decision::placed)).
///
/// Why counted at the decision and not at dispatch: the free-slot rule reads every
/// cluster's requests in flight, and an opening burst's requests, keyed off the async
/// threads, reach it within microseconds of each other. Counted only once [`Select`]
/// dispatched them, two placed at once both saw the same free slot, and a two-slot engine
/// got three long first turns while another had a slot free (an arena run: the third
/// waited 24.7 s for its first token). A new conversation joining a busier holder of its
/// shared head reads that holder's free slot the same way. The placement takes the count
/// under the lock the rule reads under; [`Select`] takes it over ([`take_for`](Self::take_for)) and counts
/// nothing twice. Dropped unused (the request failed before dispatch, or was sent
/// elsewhere), it stops counting.
///
/// Clones share the count, and only the first [`take_for`](Self::take_for) gets it. A
/// balancer of your own may ignore it: the count then ends when the request is dropped,
/// which a client does once it has sent it.
///
/// [`Select`]: crate::select::Select
#[derive(Clone)]
pub struct Placed {
    cluster: ClusterId,
    load: f64,
    in_flight: Arc<Mutex<Option<InFlight>>>,
}

impl Placed {
    /// `in_flight`, counted at `cluster` whose routing load was `load` just before.
    pub fn new(cluster: ClusterId, load: f64, in_flight: InFlight) -> Self {
        Self {
            cluster,
            load,
            in_flight: Arc::new(Mutex::new(Some(in_flight))),
        }
    }

    /// The cluster the request was placed on.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// The count in flight and the cluster's routing load before it, when the request is
    /// dispatched to `cluster`, the one it was placed on, and nothing took them yet. Any
    /// call empties it: a request sent elsewhere stops counting where it was placed.
    ///
    /// ```
    /// use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
    /// use grid_route_layer::route::Placed;
    ///
    /// let spec = GridSpec::new([SiteSpec::new("east").with_clusters([
    ///     ClusterSpec::new("east-a").with_models(["m"]).with_endpoints(["http://a:8000"]),
    ///     ClusterSpec::new("east-b").with_models(["m"]).with_endpoints(["http://b:8000"]),
    /// ])]);
    /// let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    /// let view = grid.view();
    /// let (a, b) = (&view.clusters()[0], &view.clusters()[1]);
    /// let placed = Placed::new(a.id().clone(), 0.0, a.load().start_request_prefilling(4_096));
    /// assert_eq!(a.load().in_flight(), 1);
    /// // Sent elsewhere: nothing to take over, and it no longer counts at east-a.
    /// assert!(placed.clone().take_for(b.id()).is_none());
    /// assert_eq!(a.load().in_flight(), 0);
    /// assert!(placed.take_for(a.id()).is_none(), "taken once");
    /// ```
    pub fn take_for(&self, cluster: &ClusterId) -> Option<(f64, InFlight)> {
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        (*cluster == self.cluster).then_some((self.load, in_flight))
    }
}

impl fmt::Debug for Placed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Placed")
            .field("cluster", &self.cluster)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// Which cluster answered: set on the response by the balancer that dispatched it.
///
/// Confirmation records the request's prompt at this cluster; pinning tags the ids in the
/// answer with it. A response without it changes nothing in the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    cluster: ClusterId,
    load: f64,
    sent: Option<Instant>,
}

impl Served {
    /// The response came from `cluster`, whose load at dispatch is not known.
    pub fn new(cluster: ClusterId) -> Self {
        Self {
            cluster,
            load: f64::INFINITY,
            sent: None,
        }
    }

    /// When the balancer sent the request to `cluster`: the attempt that answered, where
    /// a retry layer below [`FeedbackLayer`](crate::feedback::FeedbackLayer) sent it more
    /// than once. What the answer's time to first token is learned from, so that a failed
    /// attempt before it (a connect timeout, say) is not taken for the cluster's queue.
    /// `Select` sets it.
    #[must_use]
    pub fn sent_at(mut self, sent: Instant) -> Self {
        self.sent = Some(sent);
        self
    }

    /// When the request was sent to the serving cluster; `None` when not known.
    pub fn sent(&self) -> Option<Instant> {
        self.sent
    }

    /// The cluster's [`routing_load`](crate::grid::ClusterLoad::routing_load) when the
    /// request was sent, before it counted in it: what
    /// [`FeedbackLayer`](crate::feedback::FeedbackLayer) learns a queued request's price
    /// from. `Select` sets it.
    #[must_use]
    pub fn with_load(mut self, load: f64) -> Self {
        self.load = load;
        self
    }

    /// The cluster's load at dispatch; `f64::INFINITY` when unmeasured or not known.
    pub fn load(&self) -> f64 {
        self.load
    }

    /// The serving cluster's site.
    pub fn site(&self) -> &SiteName {
        self.cluster.site()
    }

    /// The serving cluster.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }
}

/// A request sent to a cluster failed before any response head: the connection failed,
/// timed out or was refused. Confirmation drops the request's keys from `cluster`.
///
/// A balancer returns it (boxed, possibly wrapped by outer layers: confirmation looks
/// through the whole [`source`](Error::source) chain) for any error of a cluster's service.
#[derive(Debug)]
pub struct DispatchError {
    cluster: ClusterId,
    source: BoxError,
}

impl DispatchError {
    /// `cluster`'s service failed with `source`.
    pub fn new(cluster: ClusterId, source: impl Into<BoxError>) -> Self {
        Self {
            cluster,
            source: source.into(),
        }
    }

    /// The cluster the request was sent to.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// Finds a `DispatchError` in `error` or its chain of sources.
    pub fn find_in<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a DispatchError> {
        find_source(error)
    }
}

/// The first error of type `E` in `error` or its chain of sources: how a layer above the
/// stack tells a [`DispatchError`], a [`NoCandidate`] or its own transport's errors apart
/// in the boxed error a Tower stack returns.
///
/// ```
/// use grid_route_layer::route::{BoxError, NoCandidate, find_source};
///
/// #[derive(Debug)]
/// struct Wrapped(BoxError);
/// impl std::fmt::Display for Wrapped {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("wrapped")
///     }
/// }
/// impl std::error::Error for Wrapped {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&*self.0)
///     }
/// }
///
/// let error: BoxError = Box::new(Wrapped(Box::new(NoCandidate::new(Some("m".into())))));
/// assert!(find_source::<NoCandidate>(&*error).is_some());
/// assert!(find_source::<std::io::Error>(&*error).is_none());
/// ```
pub fn find_source<'a, E: Error + 'static>(error: &'a (dyn Error + 'static)) -> Option<&'a E> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        next = error.source();
    }
    None
}

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request to cluster {} failed: {}",
            self.cluster, self.source
        )
    }
}

impl Error for DispatchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// No admitted cluster may take the request. A gateway answers 404 `model_not_found` when
/// no cluster of the grid serves the request's model at all ([`model_not_served`]), else
/// 503 with `Retry-After` (every cluster that serves it is drained or unhealthy, or the one
/// the request is pinned to stopped admitting): the first is the client's mistake, the
/// second is worth retrying.
///
/// [`model_not_served`]: Self::model_not_served
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoCandidate {
    model: Option<Arc<str>>,
    served: bool,
}

impl NoCandidate {
    /// No admitted cluster for `model` (or for any model, when `None`), though the grid
    /// has clusters that serve it.
    pub fn new(model: Option<Arc<str>>) -> Self {
        Self {
            model,
            served: true,
        }
    }

    /// No cluster of the grid serves `model`, admitted or not.
    pub fn unknown_model(model: Arc<str>) -> Self {
        Self {
            model: Some(model),
            served: false,
        }
    }

    /// The request's model, when it named one.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether no cluster of the grid serves the model (a 404, not a retryable 503).
    pub fn model_not_served(&self) -> bool {
        !self.served
    }
}

impl fmt::Display for NoCandidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.model, self.served) {
            (Some(model), false) => write!(f, "no backend cluster serves model {model:?}"),
            (Some(model), true) => write!(f, "no admitted backend cluster serves model {model:?}"),
            (None, _) => f.write_str("no admitted backend cluster"),
        }
    }
}

impl Error for NoCandidate {}
