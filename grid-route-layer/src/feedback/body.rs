//! [`FeedbackBody`]: the response body after `FeedbackLayer`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::forget::{EvictionMarks, count_shared_head, predicted_tokens};
use super::usage::{PromptUsage, UsageReader};
use crate::affinity::{Affinity, AnswerTiming};
use crate::grid::ClusterId;
use crate::metrics::{
    CACHED_PROMPT_TOKENS_TOTAL, DELIVERED_CACHED_TOKENS_TOTAL, INDEX_FORGOTTEN_TOTAL,
    PREDICTED_CACHED_TOKENS_TOTAL, PROMPT_TOKENS_TOTAL, SHARED_HEAD_FOUND_SHARE, cluster_counter,
    cluster_gauge, record_learned_prices,
};
use crate::route::PredictedMatch;
use crate::select::OutputScan;

pin_project! {
    /// The inner service's body, frame for frame and unchanged, while a copy of its data
    /// goes through a [`UsageReader`]. The usage found is counted when the body is
    /// dropped, read to its end or not.
    pub struct FeedbackBody<B> {
        #[pin]
        body: B,
        tally: Option<Tally>,
    }
}

/// Which clusters' engines count cached prompt tokens in their answers; shared by the
/// clones of one [`FeedbackLayer`](super::FeedbackLayer).
///
/// An answer's usage may leave the count out for two reasons. vLLM started with
/// `--enable-prompt-tokens-details` leaves it out when it is 0; without the flag (its
/// default) it leaves it out of every answer, as SGLang does without
/// `--enable-cache-report`. So a missing count is 0 at a cluster whose engines have counted
/// before, and unknown at one whose engines never have. An unknown count teaches nothing:
/// read as 0, it would make every sticky answer look evicted and the index forget the
/// cluster, and every prompt look prefilled whole to the learned prices. The first such
/// answer of a cluster is logged at `warn`, once.
///
/// Engines can stop counting: see [`SILENT_PREDICTED_ANSWERS`].
#[derive(Debug, Default)]
pub(super) struct CachedCounts {
    // A plain mutex: one short map operation per answer with a usage.
    clusters: Mutex<HashMap<ClusterId, Counting>>,
}

/// Answers in a row, predicted by the index to find part of their prompt cached, that come
/// back without a cached count from a cluster whose engines counted before, after which
/// [`FeedbackLayer`](super::FeedbackLayer) takes that cluster's count for unknown again:
/// its answers teach neither the index nor the learned prices until one carries a count
/// (logged at `warn`). Engines that stop counting are one restarted without the flag behind
/// the same URL (vLLM's `--enable-prompt-tokens-details`, SGLang's `--enable-cache-report`).
/// A counting engine answers a predicted hit with a count above 0, and after an eviction the
/// index forgets what it predicted there, so this many in a row is an engine that stopped;
/// up to then each reads as 0, and the index forgets at most this many times.
pub const SILENT_PREDICTED_ANSWERS: u32 = 8;

/// What a cluster's answers say of their cached counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// The engines count; `silent` predicted answers in a row since came back without.
    Counts { silent: u32 },
    /// They have not counted, or stopped (logged).
    Unknown,
}

impl CachedCounts {
    /// The prompt tokens `cluster`'s engine served from cache by `usage`: its count, 0 when
    /// it gave none but the cluster's engines count, else `None`. `predicted`: the index
    /// predicted a match at the cluster for the request.
    pub(super) fn cached_tokens(
        &self,
        cluster: &ClusterId,
        usage: PromptUsage,
        predicted: bool,
    ) -> Option<u64> {
        let mut clusters = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = usage.cached_tokens {
            let counts = Counting::Counts { silent: 0 };
            match clusters.get_mut(cluster) {
                Some(counting) => *counting = counts,
                None => {
                    clusters.insert(cluster.clone(), counts);
                }
            }
            return Some(cached);
        }
        match clusters.get_mut(cluster) {
            Some(Counting::Counts { silent }) => {
                if !predicted {
                    return Some(0);
                }
                *silent += 1;
                if *silent < SILENT_PREDICTED_ANSWERS {
                    return Some(0);
                }
                clusters.insert(cluster.clone(), Counting::Unknown);
                drop(clusters);
                tracing::warn!(
                    cluster = %cluster,
                    answers = SILENT_PREDICTED_ANSWERS,
                    "engine answers stopped counting cached prompt tokens (answers in a row \
                     predicted to hit came back without a count): the cluster's prices keep \
                     what they learned and engine feedback is off for it until they count \
                     again (vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report)"
                );
                None
            }
            Some(Counting::Unknown) => None,
            None => {
                clusters.insert(cluster.clone(), Counting::Unknown);
                drop(clusters);
                tracing::warn!(
                    cluster = %cluster,
                    "engine answers do not count cached prompt tokens: the cluster's prices \
                     stay at their priors and engine feedback is off for it until they do \
                     (vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report)"
                );
                None
            }
        }
    }
}

/// The reader of one answer and the cluster it counts for.
struct Tally {
    reader: Option<UsageReader>,
    counts: Arc<CachedCounts>,
    cluster: ClusterId,
    prediction: Option<Prediction>,
    prefill: Option<PrefillTiming>,
}

/// When an answer started, for learning its cluster's prices.
pub(super) struct PrefillTiming {
    pub(super) affinity: Affinity,
    pub(super) dispatched: Instant,
    /// The serving cluster's load when the request was sent (`Served::load`).
    pub(super) load: f64,
    /// Whether the answer is an event stream, whose first output ([`OutputScan`]) is its
    /// first token.
    pub(super) event_stream: bool,
    /// From dispatch to the answer's start: its head for a JSON answer (which an engine
    /// sends once it has generated the whole answer), its first output for an event
    /// stream (whose head vLLM and llama.cpp send before prefilling, and a Responses
    /// stream its opening events: [`OutputScan`]). `None` until then.
    pub(super) started: Option<Duration>,
    /// Where the event stream's first output is.
    pub(super) output: OutputScan,
}

/// A sticky or session request's predicted match, weighed against the engine's report.
pub(super) struct Prediction {
    pub(super) matched: PredictedMatch,
    /// What the index forgets with, when the layer was told to teach it.
    pub(super) teach: Option<Teach>,
}

/// The affinity whose index forgets what an engine no longer holds, and the marks it
/// forgets by.
pub(super) struct Teach {
    pub(super) affinity: Affinity,
    pub(super) marks: EvictionMarks,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let Some(usage) = self.reader.take().and_then(UsageReader::finish) else {
            return;
        };
        cluster_counter(PROMPT_TOKENS_TOTAL, &self.cluster).increment(usage.prompt_tokens);
        // Without a cached count the answer says nothing about the cache (see CachedCounts).
        let predicted = self
            .prediction
            .as_ref()
            .is_some_and(|p| predicted_tokens(p.matched.covered_bytes()) > 0);
        let Some(cached) = self.counts.cached_tokens(&self.cluster, usage, predicted) else {
            return;
        };
        cluster_counter(CACHED_PROMPT_TOKENS_TOTAL, &self.cluster).increment(cached);
        if let Some(timing) = self.prefill.take()
            && let Some(started) = timing.started
        {
            let answer = AnswerTiming {
                uncached_tokens: usage.prompt_tokens.saturating_sub(cached),
                load: timing.load,
                started,
                first_token: timing.event_stream,
            };
            let learned = timing.affinity.learn(&self.cluster, answer);
            record_learned_prices(&self.cluster, learned);
        }
        if let Some(prediction) = self.prediction.take() {
            cluster_counter(PREDICTED_CACHED_TOKENS_TOTAL, &self.cluster)
                .increment(predicted_tokens(prediction.matched.covered_bytes()));
            cluster_counter(DELIVERED_CACHED_TOKENS_TOTAL, &self.cluster).increment(cached);
            prediction.weigh(&self.cluster, cached);
        }
    }
}

impl Prediction {
    /// Makes the index forget, for `cluster` alone, what it recorded there before the
    /// prompt's deepest matched key, when the engine delivered far less than predicted.
    ///
    /// Runs when the answer's body is done, after confirmation refreshed the prompt at the
    /// response head (a stream's at its first output), so the prompt itself (which the
    /// engine now holds) stays.
    fn weigh(self, cluster: &ClusterId, cached_tokens: u64) {
        // Checked again here: a reload may have turned feedback off while the answer ran.
        let Some(teach) = self
            .teach
            .filter(|t| t.affinity.settings().engine_feedback())
        else {
            return;
        };
        record_shared_head(&teach.affinity, cluster, self.matched, cached_tokens);
        let index = teach.affinity.index();
        let Some(forgotten) = teach
            .marks
            .weigh(index, cluster, self.matched, cached_tokens)
        else {
            return;
        };
        cluster_counter(INDEX_FORGOTTEN_TOTAL, cluster).increment(forgotten as u64);
        tracing::debug!(
            cluster = %cluster,
            predicted_depth = self.matched.depth(),
            cached_tokens,
            forgotten,
            "engine feedback: forgot what the engine evicted"
        );
    }
}

/// Counts a first turn's answer that asked `cluster` for a shared head
/// ([`count_shared_head`]). Publishes the cluster's found share and logs a changed
/// verdict, which changes where new conversations may go.
fn record_shared_head(
    affinity: &Affinity,
    cluster: &ClusterId,
    matched: PredictedMatch,
    cached_tokens: u64,
) {
    let Some(verdict) = count_shared_head(affinity, cluster, matched, cached_tokens) else {
        return;
    };
    cluster_gauge(SHARED_HEAD_FOUND_SHARE, cluster).set(verdict.found_share);
    if verdict.kept != verdict.kept_before {
        tracing::info!(
            cluster = %cluster,
            found_share = verdict.found_share,
            keeps_shared_heads = verdict.kept,
            "engine feedback: a first turn {} its shared head; new conversations {} join a \
             busier holder of their head with a free slot",
            if verdict.found { "found" } else { "missed" },
            if verdict.kept { "may" } else { "no longer" },
        );
    }
}

impl<B> FeedbackBody<B> {
    /// `body` passed through unread.
    pub(super) fn unread(body: B) -> Self {
        Self { body, tally: None }
    }

    /// `body` read by `reader` for `cluster`, weighed against `prediction` when affinity
    /// predicted a match; `counts` says whether a missing cached count means 0.
    pub(super) fn read(
        body: B,
        reader: UsageReader,
        counts: Arc<CachedCounts>,
        cluster: ClusterId,
        prediction: Option<Prediction>,
        prefill: Option<PrefillTiming>,
    ) -> Self {
        Self {
            body,
            tally: Some(Tally {
                reader: Some(reader),
                counts,
                cluster,
                prediction,
                prefill,
            }),
        }
    }

    /// Whether the body's usage is being read.
    pub fn is_read(&self) -> bool {
        self.tally.is_some()
    }
}

impl<B> Body for FeedbackBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.body.poll_frame(cx));
        if let (Some(Ok(frame)), Some(tally)) = (&frame, this.tally.as_mut())
            && let (Some(data), Some(reader)) = (frame.data_ref(), tally.reader.as_mut())
        {
            reader.feed(data);
            if let Some(timing) = tally.prefill.as_mut()
                && timing.started.is_none()
                && timing.output.feed(data)
            {
                timing.started = Some(timing.dispatched.elapsed());
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
