//! Finding `"resp_` and `"conv_` in one pass over a chunk.
//!
//! Every value the rewriter tags starts with one of the two, so a chunk region without
//! them can be passed on without parsing. Two substring searches would read each chunk
//! twice; instead a SIMD "packed pair" search (from `memchr`) looks for the two bytes both
//! prefixes share, `"` and `_` five bytes apart, and each candidate is checked. On
//! architectures without such a search, two `memmem` searches are used.

use std::sync::LazyLock;

use memchr::arch::all::packedpair::Pair;
use memchr::memmem;

/// Length of `"resp_` and `"conv_`.
pub(super) const QUOTED_PREFIX_LEN: usize = 6;

/// Haystacks shorter than this are searched byte by byte.
const SHORT_HAYSTACK_BYTES: usize = 64;

const RESP: &[u8; QUOTED_PREFIX_LEN] = b"\"resp_";
const CONV: &[u8; QUOTED_PREFIX_LEN] = b"\"conv_";

/// The searcher for the running CPU, built once.
pub(super) static PREFIXES: LazyLock<PrefixFinder> = LazyLock::new(PrefixFinder::new);

pub(super) struct PrefixFinder {
    pair: PairSearch,
    /// For haystacks shorter than the pair search accepts, and the portable path.
    resp: memmem::Finder<'static>,
    conv: memmem::Finder<'static>,
}

enum PairSearch {
    #[cfg(target_arch = "x86_64")]
    Avx2(memchr::arch::x86_64::avx2::packedpair::Finder),
    #[cfg(target_arch = "x86_64")]
    Sse2(memchr::arch::x86_64::sse2::packedpair::Finder),
    #[cfg(target_arch = "aarch64")]
    Neon(memchr::arch::aarch64::neon::packedpair::Finder),
    Unavailable,
}

impl PairSearch {
    fn new() -> Self {
        // `"` at 0 and `_` at 5: the same in both prefixes.
        let Some(pair) = Pair::with_indices(RESP, 0, 5) else {
            return Self::Unavailable;
        };
        #[cfg(target_arch = "x86_64")]
        {
            use memchr::arch::x86_64::{avx2, sse2};
            if let Some(finder) = avx2::packedpair::Finder::with_pair(RESP, pair) {
                return Self::Avx2(finder);
            }
            if let Some(finder) = sse2::packedpair::Finder::with_pair(RESP, pair) {
                return Self::Sse2(finder);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use memchr::arch::aarch64::neon;
            if let Some(finder) = neon::packedpair::Finder::with_pair(RESP, pair) {
                return Self::Neon(finder);
            }
        }
        let _ = pair;
        Self::Unavailable
    }
}

impl PrefixFinder {
    fn new() -> Self {
        Self {
            pair: PairSearch::new(),
            resp: memmem::Finder::new(RESP).into_owned(),
            conv: memmem::Finder::new(CONV).into_owned(),
        }
    }

    /// Position of the first `"resp_` or `"conv_` in `haystack`.
    pub(super) fn find(&self, haystack: &[u8]) -> Option<usize> {
        // One loop per search, so that the candidate call is direct.
        let scanned = match &self.pair {
            #[cfg(target_arch = "x86_64")]
            PairSearch::Avx2(finder) => {
                check_candidates(haystack, finder.min_haystack_len(), |h| {
                    finder.find_prefilter(h)
                })
            }
            #[cfg(target_arch = "x86_64")]
            PairSearch::Sse2(finder) => {
                check_candidates(haystack, finder.min_haystack_len(), |h| {
                    finder.find_prefilter(h)
                })
            }
            #[cfg(target_arch = "aarch64")]
            PairSearch::Neon(finder) => {
                check_candidates(haystack, finder.min_haystack_len(), |h| {
                    finder.find_prefilter(h)
                })
            }
            PairSearch::Unavailable => Err(0),
        };
        match scanned {
            Ok(found) => found,
            // The rest is too short for the pair search.
            Err(from) => self.find_with_memmem(&haystack[from..]).map(|k| from + k),
        }
    }

    fn find_with_memmem(&self, haystack: &[u8]) -> Option<usize> {
        if haystack.len() < SHORT_HAYSTACK_BYTES {
            // A `memmem` call costs more than looking at a few bytes.
            return haystack
                .windows(QUOTED_PREFIX_LEN)
                .position(|window| window == RESP || window == CONV);
        }
        let resp = self.resp.find(haystack);
        // Only the part before a `"resp_` can hold an earlier `"conv_`.
        let conv_end = resp.map_or(haystack.len(), |at| at + QUOTED_PREFIX_LEN - 1);
        match (resp, self.conv.find(&haystack[..conv_end])) {
            (Some(r), Some(c)) => Some(r.min(c)),
            (r, c) => r.or(c),
        }
    }
}

/// Checks each candidate of `candidate` (a `"` with `_` five bytes on) while the rest of
/// `haystack` is at least `min_len` long. `Ok` is the answer; `Err(from)` means the answer
/// lies in `haystack[from..]`, too short for the pair search.
#[inline]
fn check_candidates(
    haystack: &[u8],
    min_len: usize,
    candidate: impl Fn(&[u8]) -> Option<usize>,
) -> Result<Option<usize>, usize> {
    let mut from = 0;
    while haystack.len() - from >= min_len {
        let Some(k) = candidate(&haystack[from..]) else {
            return Ok(None);
        };
        let at = from + k;
        // `"` and `_` matched; the four bytes between decide.
        let middle = haystack.get(at + 1..at + QUOTED_PREFIX_LEN - 1);
        if middle.is_some_and(|middle| middle == &RESP[1..5] || middle == &CONV[1..5]) {
            return Ok(Some(at));
        }
        from = at + 1;
    }
    Err(from)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn naive(haystack: &[u8]) -> Option<usize> {
        (0..haystack.len())
            .find(|&at| haystack[at..].starts_with(RESP) || haystack[at..].starts_with(CONV))
    }

    #[test]
    fn both_prefixes_are_found_at_any_offset() {
        for len in 0..80 {
            for at in 0..=len {
                for prefix in [RESP, CONV] {
                    let mut haystack = vec![b'x'; len + QUOTED_PREFIX_LEN];
                    haystack[at..at + QUOTED_PREFIX_LEN].copy_from_slice(prefix);
                    assert_eq!(PREFIXES.find(&haystack), Some(at), "{len} {at}");
                }
            }
        }
    }

    #[test]
    fn the_memmem_path_finds_the_earlier_prefix() {
        let mut haystack = vec![b'x'; 200];
        haystack[150..156].copy_from_slice(RESP);
        haystack[120..126].copy_from_slice(CONV);
        assert_eq!(PREFIXES.find_with_memmem(&haystack), Some(120));
        haystack[100..106].copy_from_slice(RESP);
        assert_eq!(PREFIXES.find_with_memmem(&haystack), Some(100));
        assert_eq!(PREFIXES.find_with_memmem(&haystack[..20]), None);
    }

    #[test]
    fn near_misses_are_not_found() {
        let haystack = br#"{"item_id":"msg_1","respx":"resp","conv":1,"\"resp_x","call_id":"c"}"#;
        assert_eq!(PREFIXES.find(haystack), Some(45));
        assert_eq!(PREFIXES.find(&haystack[..50]), None);
        assert_eq!(PREFIXES.find(&haystack[46..]), None);
    }

    proptest! {
        #[test]
        fn the_pair_search_finds_what_a_naive_search_finds(
            parts in prop::collection::vec(prop::sample::select(vec![
                "\"resp_", "\"conv_", "\"item_", "resp_", "\"", "_", "x", "\"rexp_", "\"conv",
                "abcdefghijklmnopqrstuvwxyz0123456789",
            ]), 0..60),
        ) {
            let haystack = parts.concat().into_bytes();
            prop_assert_eq!(PREFIXES.find(&haystack), naive(&haystack));
            for from in 0..haystack.len().min(40) {
                prop_assert_eq!(PREFIXES.find(&haystack[from..]), naive(&haystack[from..]));
            }
        }
    }
}
