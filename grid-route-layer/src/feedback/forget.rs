//! The forget rule as plain code: what the index predicted against what the engine
//! delivered, and which keys the index should no longer believe.

use crate::affinity::BYTES_PER_TOKEN;
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

/// Where the index should stop believing the serving cluster holds `keys`, given that the
/// engine reported `delivered_tokens` of the prompt cached against the `predicted` match.
///
/// `None` when the engine delivered at least [`FORGET_BELOW_SHARE`] of the prediction:
/// nothing to forget. Otherwise `Some(depth)`, the number of leading keys whose covered
/// bytes the delivered tokens still account for (at [`BYTES_PER_TOKEN`]); the caller drops
/// every key from `depth` on. Keys chain, so the engine holding `delivered_tokens` of the
/// prompt says nothing about any key past them.
///
/// ```
/// use grid_route_layer::feedback::forget_from;
/// use grid_route_layer::keying::PrefixKeys;
/// use grid_route_layer::route::PredictedMatch;
///
/// let keys = PrefixKeys::from_block_digests(&(0..40).collect::<Vec<u64>>()).unwrap();
/// // The index predicted all 40 blocks (10 KiB, 2560 tokens) cached.
/// let predicted = PredictedMatch::new(40, keys.covered_bytes(40));
/// assert_eq!(forget_from(&keys, predicted, 2000), None);
/// // The engine evicted all but a 1 KiB system prompt: 256 tokens, 4 blocks.
/// assert_eq!(forget_from(&keys, predicted, 256), Some(4));
/// // Or everything.
/// assert_eq!(forget_from(&keys, predicted, 0), Some(0));
/// ```
pub fn forget_from(
    keys: &PrefixKeys,
    predicted: PredictedMatch,
    delivered_tokens: u64,
) -> Option<usize> {
    let predicted_tokens = predicted_tokens(predicted.covered_bytes());
    if predicted_tokens == 0
        || delivered_tokens as f64 >= FORGET_BELOW_SHARE * predicted_tokens as f64
    {
        return None;
    }
    let delivered_bytes = delivered_tokens as f64 * BYTES_PER_TOKEN;
    // Covered bytes grow with depth, so the kept depth is the count of leading keys the
    // delivered bytes cover. At most the predicted depth: the rule never keeps more than
    // the index believed.
    let kept = (1..=predicted.depth().min(keys.len()))
        .take_while(|&depth| keys.covered_bytes(depth) as f64 <= delivered_bytes)
        .count();
    Some(kept)
}
