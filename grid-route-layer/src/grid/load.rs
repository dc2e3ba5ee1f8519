//! A cluster's live load: windowed worst queue depth, endpoint health, requests in flight.

use super::GridSettings;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a request streaming its answer (past its first token, until the answer ends)
/// counts for in a cluster's [`routing_load`](ClusterLoad::routing_load), against one
/// still waiting for its first token.
///
/// Half, because a stream has done half of what a waiting request has still to do: its
/// prefill is over, and what it holds now is its decode. On an engine that batches (vLLM,
/// SGLang) a new request's prefill runs beside the streams, and counted whole, a cluster
/// with long answers looked as busy as one with a queue of prompts to prefill. On an
/// engine with a few slots (llama.cpp's `--parallel`) each stream holds a slot until it
/// ends: half while a slot is free, whole once they are full (see
/// [`record_slots`](ClusterLoad::record_slots)). In `simulate` on
/// the bundled trace (docs/routing.md, "Streams, the gate's two sides and exploration"),
/// counting streams at half rather than whole brought batching engines' TTFT p50 down by
/// 9–10% with one replica, from over round-robin's to under it at every size, and moved
/// slot engines' by under 2%.
pub const STREAM_WEIGHT: f64 = 0.5;

/// The largest queue sample recorded: a million waiting requests, far past any engine's
/// real queue and still exact in an `f64` sum. A gauge above it is recorded as this.
pub const MAX_QUEUE_SAMPLE: f64 = 1_000_000.0;

/// The live load of one cluster, shared by every request that reads or changes it.
///
/// Everything here is interior-mutable and cheap to read: queue samples sit behind one
/// small mutex per endpoint, health and in-flight counts are atomics. Time is passed in,
/// never read, so the simulator and tests drive it with any clock.
///
/// # Queue depth
///
/// The gateway polls each endpoint's waiting-request count and records it with
/// [`record_queue`](Self::record_queue). The cluster's depth is the *windowed worst*: for
/// each endpoint the largest sample of the last window, and the largest of those over the
/// cluster's healthy endpoints. An endpoint with no readable sample in the window is
/// unmeasured, and makes the cluster's depth `f64::INFINITY`: a cluster the gateway cannot
/// see is never preferred to one it can. Unhealthy endpoints do not count (their engines
/// take no traffic); a cluster with none healthy reads `f64::INFINITY` too.
///
/// # Routing load
///
/// What selection and the affinity load gate compare is
/// [`routing_load`](Self::routing_load): the queue depth alone, or with
/// [`GridSettings::count_in_flight`] the queue depth plus this replica's requests in
/// flight, which grows the moment a request is sent rather than at the next poll. A
/// request whose answer is streaming (past its first token) counts [`STREAM_WEIGHT`].
pub struct ClusterLoad {
    window: Duration,
    count_in_flight: bool,
    in_flight: Arc<AtomicUsize>,
    /// Of `in_flight`, the requests whose first token came.
    streaming: Arc<AtomicUsize>,
    /// The prompt bytes the requests of `in_flight` still waiting for their first token
    /// were sent to prefill.
    prefill_waiting: Arc<AtomicU64>,
    /// When an answer last ended here.
    last_answer_end: Arc<Mutex<Option<Instant>>>,
    /// When the last request sent here went, or will once its wait ends
    /// ([`spaced_send`](ClusterLoad::spaced_send)).
    last_send: Arc<Mutex<Option<Instant>>>,
    /// In the cluster's endpoint order.
    endpoints: Box<[Arc<EndpointLoad>]>,
}

/// How long after an answer ends the slot it ran in counts as just freed
/// ([`ClusterLoad::slot_just_freed`]): the conversation it answered may be about to send
/// its next turn there. Clients that send the next turn as soon as an answer ends (the
/// arena's, agents' tool loops) send it within milliseconds: in the arena's slot-loss
/// table (the sixteenth sitting, in `git show 6c45727:BENCHMARKS.md`) every new
/// conversation that took a live one's slot reached the engine within 0.07 s of the
/// answer's end. A person typing takes seconds, which no window short enough to leave
/// slots usable covers.
pub const SLOT_RECLAIM_WINDOW: Duration = Duration::from_millis(500);

/// How long after an answer ends a new conversation sent to its cluster waits before it
/// goes to the engine, while a slot there [just went idle](ClusterLoad::slot_just_freed)
/// ([`ClusterLoad::reclaim_hold_until`]): long enough for the conversation answered to
/// send its next turn and reach its slot first. In the arena's slot-loss tables (the
/// sixteenth sitting, in `git show 6c45727:BENCHMARKS.md`) every new conversation that
/// took a live one's slot reached the engine within 0.07 s of the answer's end, some of
/// them sent just after the live turn and ready before it. What it does not cover: a live
/// turn that comes later than the hold (0.36 s on a slower hour of the arena's machine:
/// BENCHMARKS.md, "The twenty-ninth sitting (6c45727)"), or another answer there ending
/// just after the hold, before the engine picks the newcomer up. Another ending during
/// the hold, after which the engine may give the newcomer either slot, holds it on until
/// this long after that end, at most one more hold in all: in the thirty-fifth sitting
/// (BENCHMARKS.md) a first turn held for an answer that ended 90 ms before went about 10
/// ms after such an end, and llama.cpp gave it that slot, whose prompt shared its system
/// prompt, ahead of the live turn sent 15 ms after it.
pub const SLOT_RECLAIM_HOLD: Duration = Duration::from_millis(100);
// `ClusterLoad::reclaim_hold_until` reads a hold still to come as a slot just freed.
const _: () = assert!(SLOT_RECLAIM_HOLD.as_nanos() < SLOT_RECLAIM_WINDOW.as_nanos());

/// How far apart requests go to an engine with slots while one sent before still waits
/// for its first token ([`ClusterLoad::spaced_send`]); divided among the cluster's
/// healthy endpoints.
///
/// llama.cpp's server prefills every prompt waiting when a pass starts in that one pass,
/// and takes the prompts that come during it only once it ends. Two prompts that reach an
/// engine together both wait for both; the same two a moment apart go one pass each, and
/// the first's time to first token is its own prefill rather than both, and the second's
/// is what it was (the arena's measurement: BENCHMARKS.md, "One pass or two"). An engine
/// already busy (three of them on two cores in the arena) can take tens of milliseconds
/// to pick a prompt up; how far apart the arena's pairs came and which shared a pass is
/// in the same section. 50 ms is what a prompt loses at most.
pub const SLOT_PASS_SPACING: Duration = Duration::from_millis(50);

/// Records that an answer ended at `at`, unless a later end is recorded already.
fn record_end(last: &Mutex<Option<Instant>>, at: Instant) {
    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
    if last.is_none_or(|last| last < at) {
        *last = Some(at);
    }
}

pub(super) struct EndpointLoad {
    url: Arc<str>,
    healthy: AtomicBool,
    /// The engine's slots (requests it runs at once) when it has a few, as llama.cpp's
    /// server does; 0 when not known, as for an engine that batches.
    slots: AtomicUsize,
    samples: Mutex<QueueWindow>,
}

impl ClusterLoad {
    /// A cluster load with no sample yet (unmeasured), every endpoint healthy.
    pub(super) fn new(endpoints: &[Arc<str>], settings: &GridSettings) -> Self {
        Self {
            window: settings.queue_window,
            count_in_flight: settings.count_in_flight,
            in_flight: Arc::new(AtomicUsize::new(0)),
            streaming: Arc::new(AtomicUsize::new(0)),
            prefill_waiting: Arc::new(AtomicU64::new(0)),
            last_answer_end: Arc::new(Mutex::new(None)),
            last_send: Arc::new(Mutex::new(None)),
            endpoints: endpoints
                .iter()
                .map(|url| Arc::new(EndpointLoad::new(Arc::clone(url))))
                .collect(),
        }
    }

    /// The load of a reconfigured cluster: the in-flight counts and the state of endpoints
    /// that stay (matched by URL) carry over; new endpoints start healthy and unmeasured.
    pub(super) fn carried_over(&self, endpoints: &[Arc<str>], settings: &GridSettings) -> Self {
        Self {
            window: settings.queue_window,
            count_in_flight: settings.count_in_flight,
            in_flight: Arc::clone(&self.in_flight),
            streaming: Arc::clone(&self.streaming),
            prefill_waiting: Arc::clone(&self.prefill_waiting),
            last_answer_end: Arc::clone(&self.last_answer_end),
            last_send: Arc::clone(&self.last_send),
            endpoints: endpoints
                .iter()
                .map(|url| match self.endpoint(url) {
                    Some(kept) => Arc::clone(kept),
                    None => Arc::new(EndpointLoad::new(Arc::clone(url))),
                })
                .collect(),
        }
    }

    fn endpoint(&self, url: &str) -> Option<&Arc<EndpointLoad>> {
        // Clusters have a handful of endpoints: a scan beats hashing.
        self.endpoints.iter().find(|e| &*e.url == url)
    }

    /// Records a queue sample for the endpoint at `url` taken at `now`: `Some(waiting)`, or
    /// `None` when the endpoint's metrics could not be read. Returns `false` for a URL the
    /// cluster does not have.
    ///
    /// A sample that is negative, NaN or infinite counts as unreadable; one above
    /// [`MAX_QUEUE_SAMPLE`] counts as that many (an engine's gauge is not trusted to stay
    /// in a sane range). Samples are expected in time order; one older than the latest
    /// counts as taken at the latest time.
    pub fn record_queue(&self, url: &str, waiting: Option<f64>, now: Instant) -> bool {
        let Some(endpoint) = self.endpoint(url) else {
            return false;
        };
        let readable = waiting
            .filter(|w| w.is_finite() && *w >= 0.0)
            .map(|w| w.min(MAX_QUEUE_SAMPLE));
        endpoint.window().record(readable, now, self.window);
        true
    }

    /// The cluster's windowed worst queue depth at `now`; `f64::INFINITY` when unmeasured.
    pub fn queue_depth(&self, now: Instant) -> f64 {
        let mut worst = f64::NEG_INFINITY;
        for endpoint in &*self.endpoints {
            if endpoint.healthy.load(Ordering::Relaxed) {
                worst = worst.max(endpoint.window().worst(now, self.window));
            }
        }
        // No healthy endpoint: nothing measured.
        if worst == f64::NEG_INFINITY {
            f64::INFINITY
        } else {
            worst
        }
    }

    /// The load that selection and the affinity load gate compare at `now`:
    ///
    /// ```text
    /// routing_load = queue_depth(now)                                count_in_flight: false
    /// routing_load = queue_depth(now) + waiting + weight × streams    count_in_flight: true
    /// weight       = 1 while the cluster's slots are full, else STREAM_WEIGHT
    /// ```
    ///
    /// Every term counts requests: the engines' waiting requests (the worst of the window),
    /// and this replica's requests whose answer has not ended, split at their first token
    /// (`waiting` before it, `streams` after it until the answer ends:
    /// [`InFlightBody`](crate::select::InFlightBody)). A request in flight counts a waiting
    /// request twice, which errs towards spreading; it is what stops a burst piling onto
    /// one cluster between two polls, and what tells an engine running two streams from an
    /// idle one, since engines count only waiting requests. A stream counts
    /// [`STREAM_WEIGHT`] (see there why), or whole on engines with slots while a new
    /// request would find none free ([`record_slots`](Self::record_slots)).
    /// `f64::INFINITY` when unmeasured, either way.
    ///
    /// ```
    /// use std::time::Instant;
    ///
    /// use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
    ///
    /// let spec = GridSpec::new([SiteSpec::new("east").with_clusters([
    ///     ClusterSpec::new("east-a").with_models(["m"]).with_endpoints(["http://a:8000"]),
    /// ])]);
    /// let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    /// let view = grid.view();
    /// let load = view.clusters()[0].load();
    /// let now = Instant::now();
    /// load.record_queue("http://a:8000", Some(1.0), now);
    /// let (waiting, mut streaming) = (load.start_request(), load.start_request());
    /// streaming.first_token();
    /// // One request queued at the engine, one waiting for its first token, one streaming.
    /// assert_eq!(load.routing_load(now), 2.5);
    /// drop(streaming);
    /// assert_eq!(load.routing_load(now), 2.0);
    /// # drop(waiting);
    /// ```
    pub fn routing_load(&self, now: Instant) -> f64 {
        let queue = self.queue_depth(now);
        if self.count_in_flight {
            let in_flight = self.in_flight();
            let streams = self.streaming().min(in_flight);
            let waiting = in_flight - streams;
            // The slots matter only to streams: none, and the scan is skipped.
            let stream_weight =
                if streams > 0 && self.free_slot_given(in_flight, queue) == Some(false) {
                    1.0
                } else {
                    STREAM_WEIGHT
                };
            queue + waiting as f64 + stream_weight * streams as f64
        } else {
            queue
        }
    }

    /// Whether a request sent now would find a slot free: `None` when the cluster's engines
    /// are not known to have slots ([`slots`](Self::slots)); else `Some(false)` when this
    /// replica's `in_flight` requests fill them or an engine reports requests waiting for
    /// one (`queue`, the windowed worst), `Some(true)` otherwise.
    fn free_slot_given(&self, in_flight: usize, queue: f64) -> Option<bool> {
        self.slots().map(|slots| in_flight < slots && queue < 1.0)
    }

    /// Whether a request sent now would start at once on a free slot: `None` for a cluster
    /// whose engines are not known to have slots, `Some(false)` when this replica's
    /// requests in flight fill them or an engine reports one waiting in the queue window
    /// (an unmeasured cluster among them).
    pub fn free_slot(&self, now: Instant) -> Option<bool> {
        self.free_slot_given(self.in_flight(), self.queue_depth(now))
    }

    /// Whether this cluster's engines have slots, some free, and an answer ended here in
    /// the last [`SLOT_RECLAIM_WINDOW`]: a free slot may hold a conversation whose next
    /// turn is on its way. A new request that reaches the engine first may take that slot:
    /// llama.cpp gives it the idle slot whose prompt shares the longest prefix with its own
    /// (more than a tenth of it: a system prompt, or the default one a chat template
    /// inserts), else the least recently used idle slot. Which idle slot that will be, the
    /// gateway cannot tell. `false` where slots are not known.
    pub fn slot_just_freed(&self, now: Instant) -> bool {
        let Some(slots) = self.slots() else {
            return false;
        };
        slots > self.in_flight() && self.answer_ended_within(SLOT_RECLAIM_WINDOW, now)
    }

    /// Until when a new conversation sent here at `now` should wait before it reaches the
    /// engine: [`SLOT_RECLAIM_HOLD`] after the last answer's end, while a slot [just went
    /// idle](Self::slot_just_freed) and that moment is still to come. `None` otherwise.
    pub fn reclaim_hold_until(&self, now: Instant) -> Option<Instant> {
        let slots = self.slots()?;
        let end = (*self
            .last_answer_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner))?;
        let until = end.checked_add(SLOT_RECLAIM_HOLD)?;
        // The hold is shorter than the window: a slot free and the hold still to come is a
        // slot that just went idle.
        (slots > self.in_flight() && until > now).then_some(until)
    }

    /// When a request ready to go here at `at` is sent: at `at`, or on a cluster whose
    /// engines have slots, while another request here still waits for its first token,
    /// no sooner than [`SLOT_PASS_SPACING`] (divided among the healthy endpoints) after
    /// the last request sent here, so that the engine takes the two in separate prefill
    /// passes; but never more than that spacing after `at`, so that requests coming
    /// faster than one a spacing wait no longer the longer they come. Records the time
    /// returned as the last send. (A request held by a
    /// [`SlotHold`](crate::route::SlotHold) is not spaced: it goes when its hold ends,
    /// and a live turn sent meanwhile goes at once.)
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec, SLOT_PASS_SPACING};
    /// # let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
    /// #     .with_models(["m"]).with_endpoints(["http://e0"])])]);
    /// # let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    /// # let view = grid.view();
    /// # let load = view.clusters()[0].load();
    /// load.record_slots("http://e0", Some(2));
    /// let now = Instant::now();
    /// let _first = load.start_request_prefilling(4_000);
    /// assert_eq!(load.spaced_send(now), now);
    /// // A second prompt right behind it waits for the first to start its pass.
    /// let _second = load.start_request_prefilling(4_000);
    /// let later = now + Duration::from_millis(5);
    /// assert_eq!(load.spaced_send(later), now + SLOT_PASS_SPACING);
    /// ```
    pub fn spaced_send(&self, at: Instant) -> Instant {
        if self.slots().is_none() {
            return at;
        }
        // Waiting for a first token, besides the request being sent (counted already).
        let waiting = self.in_flight().saturating_sub(self.streaming()) > 1;
        let healthy = self
            .endpoints
            .iter()
            .filter(|e| e.healthy.load(Ordering::Relaxed))
            .count();
        let spacing = SLOT_PASS_SPACING / u32::try_from(healthy.max(1)).unwrap_or(u32::MAX);
        let mut last = self
            .last_send
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // (An `Instant` too near its end to add to goes at once.)
        let send = match (*last, at.checked_add(spacing)) {
            (Some(before), Some(latest)) if waiting => before
                .checked_add(spacing)
                .map_or(at, |after| after.clamp(at, latest)),
            _ => at,
        };
        if last.is_none_or(|last| last < send) {
            *last = Some(send);
        }
        send
    }

    /// Whether the last answer here ended less than `window` before `now` (or after it:
    /// another thread's clock ran ahead).
    fn answer_ended_within(&self, window: Duration, now: Instant) -> bool {
        self.last_answer_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|end| now.saturating_duration_since(end) < window)
    }

    /// Records that the endpoint at `url` runs `slots` requests at once, as llama.cpp's
    /// server started with `--parallel N` runs N (its `/props` page says how many, as
    /// `total_slots`), or `None` when it is not known to have slots (an engine that
    /// batches, or a page that did not say). Returns `false` for a URL the cluster does
    /// not have. `Some(0)` counts as `None`.
    ///
    /// A cluster whose every healthy endpoint has slots counts its streams whole in
    /// [`routing_load`](Self::routing_load) while they fill the slots: a new request
    /// there waits for a stream to end.
    pub fn record_slots(&self, url: &str, slots: Option<usize>) -> bool {
        let Some(endpoint) = self.endpoint(url) else {
            return false;
        };
        endpoint.slots.store(slots.unwrap_or(0), Ordering::Relaxed);
        true
    }

    /// The slots recorded for the endpoint at `url` ([`record_slots`](Self::record_slots));
    /// `None` for an endpoint without, or a URL the cluster does not have.
    pub fn endpoint_slots(&self, url: &str) -> Option<usize> {
        self.endpoint(url)
            .map(|e| e.slots.load(Ordering::Relaxed))
            .filter(|&slots| slots > 0)
    }

    /// The slots of the cluster's healthy endpoints, summed, when every one of them has
    /// some ([`record_slots`](Self::record_slots)); `None` when one has none known, or
    /// none is healthy.
    pub fn slots(&self) -> Option<usize> {
        let mut total = 0usize;
        for endpoint in &*self.endpoints {
            if endpoint.healthy.load(Ordering::Relaxed) {
                match endpoint.slots.load(Ordering::Relaxed) {
                    0 => return None,
                    slots => total = total.saturating_add(slots),
                }
            }
        }
        (total > 0).then_some(total)
    }

    /// Whether [`routing_load`](Self::routing_load) counts requests in flight.
    pub fn counts_in_flight(&self) -> bool {
        self.count_in_flight
    }

    /// The endpoint at `url`'s own windowed worst queue sample at `now`; `None` for a URL
    /// the cluster does not have or an endpoint unmeasured in the window.
    pub fn endpoint_queue_depth(&self, url: &str, now: Instant) -> Option<f64> {
        let worst = self.endpoint(url)?.window().worst(now, self.window);
        worst.is_finite().then_some(worst)
    }

    /// The window queue samples count for.
    pub fn queue_window(&self) -> Duration {
        self.window
    }

    /// Marks the endpoint at `url` healthy or not (endpoints start healthy). Returns
    /// `false` for a URL the cluster does not have.
    pub fn set_endpoint_healthy(&self, url: &str, healthy: bool) -> bool {
        match self.endpoint(url) {
            Some(endpoint) => {
                endpoint.healthy.store(healthy, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Whether the endpoint at `url` is believed healthy; `None` for an unknown URL.
    pub fn endpoint_healthy(&self, url: &str) -> Option<bool> {
        self.endpoint(url)
            .map(|e| e.healthy.load(Ordering::Relaxed))
    }

    /// Whether at least one endpoint is believed healthy.
    pub fn any_healthy(&self) -> bool {
        self.endpoints
            .iter()
            .any(|e| e.healthy.load(Ordering::Relaxed))
    }

    /// Requests this replica sent to the cluster whose answer has not ended: from dispatch
    /// to the end of the answer's body (or a failure, or the client leaving).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Of [`in_flight`](Self::in_flight), the requests whose answer's first token came.
    pub fn streaming(&self) -> usize {
        self.streaming.load(Ordering::Relaxed)
    }

    /// Of [`in_flight`](Self::in_flight), the prompt bytes the requests still waiting for
    /// their first token were sent to prefill
    /// ([`start_request_prefilling`](Self::start_request_prefilling)).
    ///
    /// What a request sent now waits behind on an engine with slots: llama.cpp's server
    /// prefills a prompt in one pass (up to its batch size, 2,048 tokens by default), and
    /// a request that arrives during it starts only when that pass ends, slot free or
    /// not. In the arena's opening burst (six new conversations at once onto three
    /// two-slot engines) a long first turn placed behind another long one waited for both
    /// prompts; placed behind a short one, for little more than its own.
    pub fn prefill_waiting_bytes(&self) -> u64 {
        self.prefill_waiting.load(Ordering::Relaxed)
    }

    /// Counts a request in flight until the returned guard is dropped, as waiting until
    /// [`InFlight::first_token`], with no prompt to prefill: see
    /// [`start_request_prefilling`](Self::start_request_prefilling).
    pub fn start_request(&self) -> InFlight {
        self.start_request_prefilling(0)
    }

    /// Counts a request in flight until the returned guard is dropped, as waiting until
    /// [`InFlight::first_token`], and its `bytes` of prompt to prefill in
    /// [`prefill_waiting_bytes`](Self::prefill_waiting_bytes) until then.
    ///
    /// ```
    /// # use grid_route_layer::grid::{ClusterSpec, Grid, GridSettings, GridSpec, SiteSpec};
    /// # let spec = GridSpec::new([SiteSpec::new("east").with_clusters([ClusterSpec::new("east-a")
    /// #     .with_models(["m"]).with_endpoints(["http://e0"])])]);
    /// # let grid = Grid::new(&spec, GridSettings::default()).unwrap();
    /// # let view = grid.view();
    /// # let load = view.clusters()[0].load();
    /// let mut long = load.start_request_prefilling(4_000);
    /// let short = load.start_request_prefilling(300);
    /// assert_eq!(load.prefill_waiting_bytes(), 4_300);
    /// long.first_token();
    /// assert_eq!(load.prefill_waiting_bytes(), 300);
    /// drop(short);
    /// assert_eq!((load.prefill_waiting_bytes(), load.in_flight()), (0, 1));
    /// ```
    pub fn start_request_prefilling(&self, bytes: u64) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.prefill_waiting.fetch_add(bytes, Ordering::Relaxed);
        InFlight {
            count: Arc::clone(&self.in_flight),
            streaming: Arc::clone(&self.streaming),
            prefill_waiting: Arc::clone(&self.prefill_waiting),
            last_answer_end: Arc::clone(&self.last_answer_end),
            prefill_bytes: bytes,
            streams: false,
            ended_at: None,
        }
    }
}

impl fmt::Debug for ClusterLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterLoad")
            .field("window", &self.window)
            .field("count_in_flight", &self.count_in_flight)
            .field("in_flight", &self.in_flight())
            .field("streaming", &self.streaming())
            .field("prefill_waiting", &self.prefill_waiting_bytes())
            .field(
                "last_answer_end",
                &*self
                    .last_answer_end
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .field(
                "last_send",
                &*self
                    .last_send
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

/// A request counted in its cluster's [`ClusterLoad::in_flight`]; dropping it ends the
/// count. The count survives reconfiguration, so a guard taken before a reload still
/// lowers the right counter.
#[must_use = "the request stops counting as in flight when the guard is dropped"]
pub struct InFlight {
    count: Arc<AtomicUsize>,
    streaming: Arc<AtomicUsize>,
    prefill_waiting: Arc<AtomicU64>,
    last_answer_end: Arc<Mutex<Option<Instant>>>,
    /// What this request added to `prefill_waiting` until its first token.
    prefill_bytes: u64,
    streams: bool,
    /// When its answer ended, if not at the drop ([`end_at`](Self::end_at)).
    ended_at: Option<Instant>,
}

impl InFlight {
    /// Ends the request as if its answer had ended at `at` rather than now, for a clock
    /// of its own (`grid-route-simulate`'s): an answer that came
    /// ([`first_token`](Self::first_token)) counts as ended at `at` for
    /// [`ClusterLoad::slot_just_freed`].
    pub fn end_at(mut self, at: Instant) {
        self.ended_at = Some(at);
    }

    /// When a request counted here, held until `until` for a slot that just went idle
    /// ([`ClusterLoad::reclaim_hold_until`]), goes instead once that wait ends: where
    /// another answer ended here during it, a second slot went idle, whose conversation's
    /// next turn is on its way too, so [`SLOT_RECLAIM_HOLD`] after that end, but never
    /// later than `cap`. `None` where no answer ended here since the one the hold was for.
    pub(crate) fn hold_extended(&self, until: Instant, cap: Instant) -> Option<Instant> {
        let end = (*self
            .last_answer_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner))?;
        let later = end.checked_add(SLOT_RECLAIM_HOLD)?.min(cap);
        (later > until).then_some(later)
    }

    /// Whether [`first_token`](Self::first_token) was called.
    pub fn has_first_token(&self) -> bool {
        self.streams
    }

    /// The answer's first token came: from now until the guard is dropped the request
    /// counts as a stream ([`ClusterLoad::streaming`]), and its prompt is no longer waiting
    /// to be prefilled ([`ClusterLoad::prefill_waiting_bytes`]). Once; later calls change
    /// nothing.
    pub fn first_token(&mut self) {
        if !self.streams {
            self.streams = true;
            self.streaming.fetch_add(1, Ordering::Relaxed);
            self.prefill_waiting
                .fetch_sub(self.prefill_bytes, Ordering::Relaxed);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.streams {
            self.streaming.fetch_sub(1, Ordering::Relaxed);
            // Its slot, if the engine has slots, is free from now: the answer's end.
            record_end(
                &self.last_answer_end,
                self.ended_at.unwrap_or_else(Instant::now),
            );
        } else {
            self.prefill_waiting
                .fetch_sub(self.prefill_bytes, Ordering::Relaxed);
        }
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl EndpointLoad {
    fn new(url: Arc<str>) -> Self {
        Self {
            url,
            healthy: AtomicBool::new(true),
            slots: AtomicUsize::new(0),
            samples: Mutex::new(QueueWindow::default()),
        }
    }

    // Every operation on a window leaves it consistent, so a poisoned lock is recovered
    // rather than turned into a panic on every later request.
    fn window(&self) -> std::sync::MutexGuard<'_, QueueWindow> {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for EndpointLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointLoad")
            .field("url", &self.url)
            .field("healthy", &self.healthy.load(Ordering::Relaxed))
            .field("slots", &self.slots.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The readable samples of one endpoint that can still be the window's worst.
///
/// A monotonic queue: times rise and values fall from front to back, because a sample is
/// never the worst of any later window once a later sample is at least as large. So the
/// worst of the window is the first sample not yet expired, found in O(1) amortised, and
/// the queue holds at most the samples of one window.
#[derive(Default)]
struct QueueWindow {
    falling: VecDeque<(Instant, f64)>,
    latest: Option<Instant>,
}

impl QueueWindow {
    fn record(&mut self, waiting: Option<f64>, now: Instant, window: Duration) {
        let at = self.latest.map_or(now, |latest| latest.max(now));
        self.latest = Some(at);
        if let Some(waiting) = waiting {
            while self.falling.back().is_some_and(|&(_, w)| w <= waiting) {
                self.falling.pop_back();
            }
            self.falling.push_back((at, waiting));
        }
        self.expire(at, window);
    }

    fn worst(&mut self, now: Instant, window: Duration) -> f64 {
        self.expire(now, window);
        self.falling.front().map_or(f64::INFINITY, |&(_, w)| w)
    }

    /// Drops samples older than `window` before `now`: a sample taken exactly `window`
    /// ago has left the window.
    fn expire(&mut self, now: Instant, window: Duration) {
        let Some(cutoff) = now.checked_sub(window) else {
            // The clock has not run for a whole window yet: every sample is in it.
            return;
        };
        while self.falling.front().is_some_and(|&(at, _)| at <= cutoff) {
            self.falling.pop_front();
        }
    }
}

#[cfg(test)]
// Tests compare values that are stored and read back, not computed: exactly equal.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    fn urls(n: usize) -> Vec<Arc<str>> {
        (0..n).map(|i| format!("http://e{i}").into()).collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn settings(queue_window: Duration) -> GridSettings {
        GridSettings {
            queue_window,
            ..GridSettings::default()
        }
    }

    #[test]
    fn a_cluster_without_samples_is_unmeasured() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        assert_eq!(load.queue_depth(Instant::now()), f64::INFINITY);
    }

    #[test]
    fn the_depth_is_the_worst_sample_of_the_window_over_all_endpoints() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(7.0), t0);
        load.record_queue("http://e0", Some(2.0), t0 + secs(1));
        load.record_queue("http://e1", Some(3.0), t0 + secs(1));
        assert_eq!(load.queue_depth(t0 + secs(2)), 7.0);
        load.record_queue("http://e1", Some(9.0), t0 + secs(3));
        assert_eq!(load.queue_depth(t0 + secs(3)), 9.0);
    }

    #[test]
    fn samples_age_out_of_the_window() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(8.0), t0);
        load.record_queue("http://e0", Some(1.0), t0 + secs(5));
        assert_eq!(load.queue_depth(t0 + secs(9)), 8.0);
        // The spike is exactly one window old: gone; the later sample remains.
        assert_eq!(load.queue_depth(t0 + secs(10)), 1.0);
        // Nothing read for a whole window: unmeasured again.
        assert_eq!(load.queue_depth(t0 + secs(15)), f64::INFINITY);
    }

    #[test]
    fn an_unreadable_endpoint_makes_the_cluster_unmeasured() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(1.0), t0);
        load.record_queue("http://e1", None, t0);
        assert_eq!(load.queue_depth(t0), f64::INFINITY);
        for bad in [f64::NAN, -1.0, f64::INFINITY] {
            let one = ClusterLoad::new(&urls(1), &settings(WINDOW));
            one.record_queue("http://e0", Some(bad), t0);
            assert_eq!(one.queue_depth(t0), f64::INFINITY, "{bad}");
        }
    }

    #[test]
    fn an_unreadable_poll_keeps_the_readable_samples_of_the_window() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(4.0), t0);
        load.record_queue("http://e0", None, t0 + secs(1));
        assert_eq!(load.queue_depth(t0 + secs(2)), 4.0);
    }

    #[test]
    fn unhealthy_endpoints_do_not_count_and_none_healthy_is_unmeasured() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(2.0), t0);
        assert!(load.set_endpoint_healthy("http://e1", false));
        assert_eq!(load.queue_depth(t0), 2.0);
        assert!(load.any_healthy());
        load.set_endpoint_healthy("http://e0", false);
        assert!(!load.any_healthy());
        assert_eq!(load.queue_depth(t0), f64::INFINITY);
        assert!(!load.set_endpoint_healthy("http://nope", false));
        assert!(!load.record_queue("http://nope", Some(1.0), t0));
    }

    #[test]
    fn an_endpoints_own_depth_is_its_windowed_worst() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        let t0 = Instant::now();
        assert_eq!(load.endpoint_queue_depth("http://e0", t0), None);
        load.record_queue("http://e0", Some(3.0), t0);
        load.record_queue("http://e0", Some(1.0), t0 + secs(1));
        load.record_queue("http://e1", None, t0);
        assert_eq!(
            load.endpoint_queue_depth("http://e0", t0 + secs(1)),
            Some(3.0)
        );
        assert_eq!(load.endpoint_queue_depth("http://e1", t0 + secs(1)), None);
        assert_eq!(load.endpoint_queue_depth("http://nope", t0), None);
        assert_eq!(
            load.endpoint_queue_depth("http://e0", t0 + secs(10)),
            Some(1.0)
        );
    }

    #[test]
    fn an_absurd_gauge_counts_as_the_largest_sample_and_a_broken_one_as_unread() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(1e300), t0);
        assert_eq!(load.queue_depth(t0), MAX_QUEUE_SAMPLE);
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        for broken in [f64::NAN, f64::INFINITY, -1.0] {
            load.record_queue("http://e0", Some(broken), t0);
            assert_eq!(load.queue_depth(t0), f64::INFINITY, "{broken}");
        }
    }

    #[test]
    fn a_late_sample_counts_as_taken_at_the_latest_time() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e0", Some(1.0), t0 + secs(5));
        load.record_queue("http://e0", Some(6.0), t0);
        assert_eq!(load.queue_depth(t0 + secs(14)), 6.0);
        assert_eq!(load.queue_depth(t0 + secs(15)), f64::INFINITY);
    }

    #[test]
    fn in_flight_counts_until_the_guard_drops() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let a = load.start_request();
        let b = load.start_request();
        assert_eq!(load.in_flight(), 2);
        drop(a);
        assert_eq!(load.in_flight(), 1);
        let carried = load.carried_over(&urls(1), &settings(WINDOW));
        drop(b);
        assert_eq!(carried.in_flight(), 0);
    }

    #[test]
    fn a_slot_just_freed_while_an_answer_ended_in_the_window_and_a_slot_is_free() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        // Ten seconds ago: the ends at t0 and after are out of the window now.
        let t0 = Instant::now().checked_sub(secs(10)).unwrap();
        let answered_at = |at: Instant| {
            let mut answer = load.start_request();
            answer.first_token();
            answer.end_at(at);
        };
        let ms = Duration::from_millis;
        // Nothing ended yet.
        assert!(load.record_slots("http://e0", Some(2)));
        assert!(!load.slot_just_freed(t0));
        // Requests that end before their first token ran no answer: no end is recorded.
        drop(load.start_request());
        assert!(!load.slot_just_freed(t0 + ms(100)));
        answered_at(t0);
        // Until the window ends.
        assert!(load.slot_just_freed(t0));
        assert!(load.slot_just_freed(t0 + ms(499)));
        assert!(!load.slot_just_freed(t0 + SLOT_RECLAIM_WINDOW));
        // An earlier end recorded later (threads racing) does not hide the later one.
        answered_at(t0.checked_sub(SLOT_RECLAIM_WINDOW).unwrap());
        assert!(load.slot_just_freed(t0 + ms(499)));
        // No slot free: nothing to take.
        let full = [load.start_request(), load.start_request()];
        assert!(!load.slot_just_freed(t0));
        drop(full);
        // A reload carries the end over.
        let carried = load.carried_over(&urls(1), &settings(WINDOW));
        assert!(carried.slot_just_freed(t0 + ms(200)));
        // Slots not known (a batching engine): never.
        assert!(carried.record_slots("http://e0", None));
        assert!(!carried.slot_just_freed(t0));
        // An answer dropped without `end_at` ends at the drop.
        assert!(carried.record_slots("http://e0", Some(2)));
        assert!(!carried.slot_just_freed(Instant::now()));
        let mut dropped = carried.start_request();
        dropped.first_token();
        drop(dropped);
        assert!(carried.slot_just_freed(Instant::now()));
    }

    #[test]
    fn a_new_conversation_is_held_until_shortly_after_an_answer_ended_at_a_free_slot() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now().checked_sub(secs(10)).unwrap();
        let ms = Duration::from_millis;
        assert!(load.record_slots("http://e0", Some(2)));
        assert_eq!(load.reclaim_hold_until(t0), None);
        let mut answer = load.start_request();
        answer.first_token();
        answer.end_at(t0);
        let until = t0 + SLOT_RECLAIM_HOLD;
        assert_eq!(load.reclaim_hold_until(t0), Some(until));
        assert_eq!(load.reclaim_hold_until(t0 + ms(99)), Some(until));
        // Past the hold, though the slot still counts as just freed.
        assert_eq!(load.reclaim_hold_until(until), None);
        assert!(load.slot_just_freed(until));
        // No slot free: nothing to hold for.
        let full = [load.start_request(), load.start_request()];
        assert_eq!(load.reclaim_hold_until(t0), None);
        drop(full);
        // Slots not known: never.
        assert!(load.record_slots("http://e0", None));
        assert_eq!(load.reclaim_hold_until(t0), None);
    }

    #[test]
    fn a_hold_goes_on_while_another_answer_ends_during_it_never_past_its_cap() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now().checked_sub(secs(10)).unwrap();
        let ms = Duration::from_millis;
        assert!(load.record_slots("http://e0", Some(3)));
        let mut first = load.start_request();
        first.first_token();
        let mut second = load.start_request();
        second.first_token();
        first.end_at(t0);
        let until = load.reclaim_hold_until(t0).unwrap();
        let cap = until + SLOT_RECLAIM_HOLD;
        let held = load.start_request();
        // Nothing else ended: the hold ends when it was to.
        assert_eq!(held.hold_extended(until, cap), None);
        // The other answer ends 30 ms into the hold: it goes on to 100 ms after that.
        second.end_at(t0 + ms(30));
        assert_eq!(held.hold_extended(until, cap), Some(t0 + ms(130)));
        assert_eq!(held.hold_extended(t0 + ms(130), cap), None);
        // One ending later still is waited for no longer than the cap.
        let mut third = load.start_request();
        third.first_token();
        third.end_at(t0 + ms(150));
        assert_eq!(held.hold_extended(t0 + ms(130), cap), Some(cap));
        assert_eq!(held.hold_extended(cap, cap), None);
    }

    #[test]
    fn on_slot_engines_a_prompt_right_behind_one_still_waiting_goes_a_pass_later() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let t0 = Instant::now().checked_sub(secs(10)).unwrap();
        let ms = Duration::from_millis;
        // Slots not known (an engine that batches): sent when ready, however close.
        let waiting = [load.start_request(), load.start_request()];
        assert_eq!(load.spaced_send(t0), t0);
        assert_eq!(load.spaced_send(t0 + ms(1)), t0 + ms(1));
        drop(waiting);
        assert!(load.record_slots("http://e0", Some(2)));
        // Alone (the request being sent counts itself): at once.
        let mut first = load.start_request_prefilling(4_000);
        assert_eq!(load.spaced_send(t0 + ms(100)), t0 + ms(100));
        // Behind it while it waits: 50 ms after it; the next, 50 ms after that one.
        let second = load.start_request_prefilling(4_000);
        assert_eq!(load.spaced_send(t0 + ms(105)), t0 + ms(150));
        let third = load.start_request_prefilling(4_000);
        assert_eq!(load.spaced_send(t0 + ms(140)), t0 + ms(190));
        // But none waits more than 50 ms, however fast they come.
        assert_eq!(load.spaced_send(t0 + ms(141)), t0 + ms(191));
        assert_eq!(load.spaced_send(t0 + ms(142)), t0 + ms(192));
        // Well after the last one went: at once.
        assert_eq!(load.spaced_send(t0 + ms(400)), t0 + ms(400));
        drop((second, third));
        // Once the one before answers, nothing waits for its pass: at once.
        first.first_token();
        let _fourth = load.start_request();
        assert_eq!(load.spaced_send(t0 + ms(410)), t0 + ms(410));
        // A reload keeps the last send; two healthy endpoints halve the spacing.
        let two = load.carried_over(&urls(2), &settings(WINDOW));
        assert!(two.record_slots("http://e1", Some(2)));
        let _second = two.start_request();
        assert_eq!(two.spaced_send(t0 + ms(410)), t0 + ms(435));
        assert!(two.set_endpoint_healthy("http://e1", false));
        assert_eq!(two.spaced_send(t0 + ms(440)), t0 + ms(485));
    }

    #[test]
    fn prefill_waits_until_the_first_token_or_the_end_and_carries_over_a_reload() {
        let load = ClusterLoad::new(&urls(1), &settings(WINDOW));
        let mut answered = load.start_request_prefilling(1_000);
        let failed = load.start_request_prefilling(500);
        let _none = load.start_request();
        assert_eq!(load.prefill_waiting_bytes(), 1_500);
        answered.first_token();
        answered.first_token();
        assert_eq!(load.prefill_waiting_bytes(), 500);
        let carried = load.carried_over(&urls(1), &settings(WINDOW));
        // Ended before its first token (an error, the client gone): no longer waiting.
        drop(failed);
        assert_eq!(carried.prefill_waiting_bytes(), 0);
        // Streaming, it ends without changing the bytes again.
        drop(answered);
        assert_eq!(
            (carried.prefill_waiting_bytes(), carried.in_flight()),
            (0, 1)
        );
    }

    #[test]
    fn the_routing_load_is_the_queue_alone_unless_in_flight_counts() {
        let t0 = Instant::now();
        let queue_only = ClusterLoad::new(
            &urls(1),
            &GridSettings {
                count_in_flight: false,
                ..settings(WINDOW)
            },
        );
        let counting = ClusterLoad::new(&urls(1), &settings(WINDOW));
        for load in [&queue_only, &counting] {
            assert_eq!(load.routing_load(t0), f64::INFINITY);
            load.record_queue("http://e0", Some(2.0), t0);
        }
        let _sent = [queue_only.start_request(), queue_only.start_request()];
        assert_eq!(queue_only.routing_load(t0), 2.0);
        assert!(!queue_only.counts_in_flight());

        let first = counting.start_request();
        let _second = counting.start_request();
        assert_eq!(counting.routing_load(t0), 4.0);
        drop(first);
        assert_eq!(counting.routing_load(t0), 3.0);
        assert!(counting.counts_in_flight());
        // Unmeasured stays unmeasured, whatever is in flight.
        assert_eq!(counting.routing_load(t0 + WINDOW), f64::INFINITY);
    }

    #[test]
    fn on_engines_with_slots_streams_count_whole_once_the_slots_are_full() {
        let t0 = Instant::now();
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        for url in ["http://e0", "http://e1"] {
            load.record_queue(url, Some(0.0), t0);
        }
        let streams: Vec<InFlight> = (0..3)
            .map(|_| {
                let mut stream = load.start_request();
                stream.first_token();
                stream
            })
            .collect();
        // Not known to have slots: streams count at half.
        assert_eq!(load.slots(), None);
        assert_eq!(load.routing_load(t0), 1.5);
        // One endpoint with slots and one without: still not a slot cluster.
        assert!(load.record_slots("http://e0", Some(2)));
        assert_eq!(load.slots(), None);
        assert_eq!(load.routing_load(t0), 1.5);
        // Two slots each: three streams leave one free, so they count at half.
        assert!(load.record_slots("http://e1", Some(2)));
        assert_eq!(load.slots(), Some(4));
        assert_eq!(load.routing_load(t0), 1.5);
        // A fourth request fills the last slot: everything counts whole, the request
        // waiting for its first token included.
        let waiting = load.start_request();
        assert_eq!(load.routing_load(t0), 4.0);
        drop(waiting);
        // An engine reporting a request waiting for a slot says they are full, whatever
        // this replica has in flight (other replicas fill slots too).
        load.record_queue("http://e1", Some(1.0), t0 + secs(1));
        assert_eq!(load.routing_load(t0 + secs(1)), 1.0 + 3.0);
        // An unhealthy endpoint's slots do not count: two left, three streams fill them.
        load.record_queue("http://e1", Some(0.0), t0 + WINDOW + secs(2));
        let later = t0 + WINDOW + secs(2);
        load.record_queue("http://e0", Some(0.0), later);
        assert_eq!(load.routing_load(later), 1.5);
        load.set_endpoint_healthy("http://e1", false);
        assert_eq!(load.slots(), Some(2));
        assert_eq!(load.routing_load(later), 3.0);
        // Forgotten (the page stopped being llama.cpp's, or `Some(0)`): half again.
        load.set_endpoint_healthy("http://e1", true);
        assert!(load.record_slots("http://e1", Some(0)));
        assert_eq!(load.slots(), None);
        assert!(!load.record_slots("http://nope", Some(2)));
        assert_eq!(load.endpoint_slots("http://e0"), Some(2));
        assert_eq!(load.endpoint_slots("http://e1"), None);
        assert_eq!(load.endpoint_slots("http://nope"), None);
        // Slots carry over a reload with their endpoint.
        let carried = load.carried_over(&urls(1), &settings(WINDOW));
        assert_eq!(carried.slots(), Some(2));
        drop(streams);
    }

    #[test]
    fn reconfiguration_keeps_endpoints_that_stay_by_url() {
        let load = ClusterLoad::new(&urls(2), &settings(WINDOW));
        let t0 = Instant::now();
        load.record_queue("http://e1", Some(3.0), t0);
        load.set_endpoint_healthy("http://e0", false);
        let next: Vec<Arc<str>> = vec!["http://e1".into(), "http://e2".into()];
        let carried = load.carried_over(&next, &settings(secs(20)));
        assert_eq!(carried.endpoint_healthy("http://e0"), None);
        assert_eq!(carried.endpoint_healthy("http://e2"), Some(true));
        carried.record_queue("http://e2", Some(1.0), t0);
        assert_eq!(carried.queue_depth(t0 + secs(15)), 3.0);
        assert_eq!(carried.queue_window(), secs(20));
    }
}
