//! The forget rule as plain code: what the index predicted against what the engine
//! delivered.

use std::time::Instant;

use crate::affinity::{Affinity, BYTES_PER_TOKEN, HeadVerdict};
use crate::grid::ClusterId;
use crate::index::{Confirmation, PrefixIndex};
use crate::keying::PrefixKeys;
use crate::route::PredictedMatch;

/// The index forgets when an engine delivers less than this share of the cached prompt it
/// predicted.
///
/// Half, because the prediction is rough by design and an eviction is not: the index
/// prices bytes at [`BYTES_PER_TOKEN`] (4 bytes a token), which misses by up to about a
/// factor of 1.5 on code or non-English text, and engines cache whole blocks (16 tokens in
/// vLLM, a slot's prefix in llama.cpp), so a faithful engine reports somewhat less than
/// predicted. An engine that evicted the prompt reports a small share of it (a shared
/// system prompt) or none, far below half.
pub const FORGET_BELOW_SHARE: f64 = 0.5;

/// Tokens of cached prompt the index predicts for a match covering `covered_bytes`.
pub fn predicted_tokens(covered_bytes: u64) -> u64 {
    // Truncation is the intent: a partial token is not a cached token.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let tokens = (covered_bytes as f64 / BYTES_PER_TOKEN) as u64;
    tokens
}

/// Whether an engine that reported `delivered_tokens` of the prompt cached fell short of
/// the `predicted` match: delivered less than [`FORGET_BELOW_SHARE`] of it. A prediction of
/// nothing never falls short.
///
/// Falling short means the engine evicted the prompt since the index recorded it. It now
/// holds it again (it has just prefilled it), so the request's own keys stay; what the
/// index should stop believing is what it recorded at that cluster *before* the evicted
/// prompt (see [`FeedbackLayer::with_affinity`](super::FeedbackLayer::with_affinity)).
///
/// ```
/// use grid_route_layer::feedback::fell_short;
/// use grid_route_layer::keying::PrefixKeys;
/// use grid_route_layer::route::PredictedMatch;
///
/// let keys = PrefixKeys::from_block_digests(&(0..40).collect::<Vec<u64>>()).unwrap();
/// // The index predicted all 40 blocks (10 KiB, 2560 tokens) cached.
/// let predicted = PredictedMatch::new(40, keys.covered_bytes(40));
/// assert!(!fell_short(predicted, 2000));
/// // The engine evicted all but a 1 KiB system prompt: 256 tokens.
/// assert!(fell_short(predicted, 256));
/// ```
pub fn fell_short(predicted: PredictedMatch, delivered_tokens: u64) -> bool {
    let predicted_tokens = predicted_tokens(predicted.covered_bytes());
    predicted_tokens > 0 && (delivered_tokens as f64) < FORGET_BELOW_SHARE * predicted_tokens as f64
}

/// Counts the answer to a conversation's first turn that asked `served` for a short shared
/// head ([`PredictedMatch::asks_shared_head`]) into `affinity`'s tally of whether that
/// cluster's engines keep such heads: found unless the engine reporting `delivered_tokens`
/// [`fell_short`] of `matched`. Returns the cluster's verdict
/// ([`Affinity::count_shared_head`]); `None` when the request asked nothing, or the
/// cluster is gone.
///
/// The one implementation of the count: [`FeedbackLayer`](super::FeedbackLayer) uses it,
/// and so does the example gateway's simulator.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
///
/// use grid_route_layer::affinity::{Affinity, AffinitySettings};
/// use grid_route_layer::feedback::count_shared_head;
/// use grid_route_layer::grid::{ClusterId, SiteName};
/// use grid_route_layer::index::{IndexSettings, PrefixIndex};
/// use grid_route_layer::route::PredictedMatch;
///
/// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
/// let index = PrefixIndex::starting_at(IndexSettings::default(), [east.clone()], Instant::now());
/// let affinity = Affinity::new(Arc::new(index), AffinitySettings::default());
/// // A 1 KiB system prompt, 256 tokens predicted.
/// let asked = PredictedMatch::new(4, 1024).asking_shared_head();
/// // A request that did not ask counts nothing.
/// assert_eq!(count_shared_head(&affinity, &east, PredictedMatch::new(4, 1024), 0), None);
/// let found = count_shared_head(&affinity, &east, asked, 256).unwrap();
/// assert!(found.found && found.kept);
/// let missed = count_shared_head(&affinity, &east, asked, 0).unwrap();
/// assert!(!missed.found && !missed.kept);
/// ```
pub fn count_shared_head(
    affinity: &Affinity,
    served: &ClusterId,
    matched: PredictedMatch,
    delivered_tokens: u64,
) -> Option<HeadVerdict> {
    if !matched.asks_shared_head() {
        return None;
    }
    affinity.count_shared_head(served, !fell_short(matched, delivered_tokens))
}

/// When each candidate of a predicted match was last confirmed for the prompt's deepest
/// matched key, read as the request goes out (before confirmation refreshes it), and the forget rule applied
/// to the engine's report once the answer ends.
///
/// The one implementation of the rule: [`FeedbackLayer`](super::FeedbackLayer) uses it,
/// and so does the example gateway's simulator.
///
/// ```
/// use std::time::{Duration, Instant};
///
/// use grid_route_layer::feedback::EvictionMarks;
/// use grid_route_layer::grid::{ClusterId, SiteName};
/// use grid_route_layer::index::{IndexSettings, PrefixIndex};
/// use grid_route_layer::keying::PrefixKeys;
/// use grid_route_layer::route::PredictedMatch;
///
/// let east = ClusterId::new(SiteName::new("east").unwrap(), "east-a");
/// let base = Instant::now();
/// let index = PrefixIndex::starting_at(IndexSettings::default(), [east.clone()], base);
/// let older = [0xaa, 0xbb];
/// let keys = PrefixKeys::from_block_digests(&(0..40).collect::<Vec<u64>>()).unwrap();
/// index.confirm(&east, &older, base);
/// index.confirm(&east, keys.as_slice(), base + Duration::from_secs(5));
/// let matched = PredictedMatch::new(keys.len(), keys.total_covered_bytes());
/// let at = base + Duration::from_secs(9);
/// let marks = EvictionMarks::read(&index, [&east], &keys, matched, at);
/// // The engine served the whole prediction: nothing to forget.
/// assert_eq!(marks.weigh(&index, &east, matched, 2560), None);
/// // It served none of it: what was recorded there before the prompt goes.
/// assert_eq!(marks.weigh(&index, &east, matched, 0), Some(2));
/// assert_eq!(index.depth(&east, &older, at), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct EvictionMarks {
    marks: Vec<(ClusterId, Confirmation)>,
}

impl EvictionMarks {
    /// Reads, in `index` at `now`, when each of `candidates` was last confirmed for the
    /// last of `keys` that `matched` covers. Empty when nothing matched.
    pub fn read<'a>(
        index: &PrefixIndex,
        candidates: impl IntoIterator<Item = &'a ClusterId>,
        keys: &PrefixKeys,
        matched: PredictedMatch,
        now: Instant,
    ) -> Self {
        let Some(&deepest) = matched
            .depth()
            .checked_sub(1)
            .and_then(|last| keys.as_slice().get(last))
        else {
            return Self::default();
        };
        let marks = candidates
            .into_iter()
            .filter_map(|cluster| {
                let mark = index.confirmation(cluster, deepest, now)?;
                Some((cluster.clone(), mark))
            })
            .collect();
        Self { marks }
    }

    /// Applies an engine's report from `served`: when it [`fell_short`] of `matched`,
    /// forgets what `index` recorded at `served` before the prompt and returns how many
    /// entries went; `None` when it did not fall short or `served` had no mark.
    pub fn weigh(
        &self,
        index: &PrefixIndex,
        served: &ClusterId,
        matched: PredictedMatch,
        delivered_tokens: u64,
    ) -> Option<usize> {
        if !fell_short(matched, delivered_tokens) {
            return None;
        }
        let &(_, mark) = self.marks.iter().find(|(id, _)| id == served)?;
        Some(index.forget_older(served, mark))
    }
}
