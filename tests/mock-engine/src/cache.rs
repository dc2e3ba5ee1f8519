//! The engine's block prefix cache: which prompt blocks it holds "KV" for.
//!
//! A prompt is cut into blocks of `block_bytes`; block i's hash is chained on block i-1's, so
//! a hash stands for the whole prefix up to its block and a lookup counts leading hits only
//! (as vLLM's automatic prefix caching does). Only full blocks are cached. The cache is an
//! LRU over blocks with a fixed capacity; blocks are inserted and touched tail first, so the
//! head of a prompt is the most recent and eviction takes tails before heads.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;

use lru::LruCache;

/// Chained hashes of a prompt's full blocks, seeded by its namespace (model and cache salt).
pub(crate) fn block_hashes(namespace: u64, prompt: &[u8], block_bytes: usize) -> Vec<u64> {
    let mut previous = namespace;
    prompt
        .chunks_exact(block_bytes.max(1))
        .map(|block| {
            let mut hasher = DefaultHasher::new();
            previous.hash(&mut hasher);
            block.hash(&mut hasher);
            previous = hasher.finish();
            previous
        })
        .collect()
}

/// The namespace a prompt's blocks live in: prompts of different models or cache salts never
/// share blocks.
pub(crate) fn namespace(model: &str, cache_salt: Option<&str>) -> u64 {
    let mut hasher = DefaultHasher::new();
    model.hash(&mut hasher);
    cache_salt.hash(&mut hasher);
    hasher.finish()
}

/// An LRU set of block hashes (`lru`'s map with unit values); no map at all when the
/// capacity is 0.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    blocks: Option<LruCache<u64, ()>>,
}

impl PrefixCache {
    pub(crate) fn new(capacity_blocks: usize) -> Self {
        Self {
            blocks: NonZeroUsize::new(capacity_blocks).map(LruCache::new),
        }
    }

    /// How many leading blocks of `hashes` are cached; touches those blocks.
    pub(crate) fn cached_prefix_blocks(&mut self, hashes: &[u64]) -> usize {
        let Some(blocks) = &mut self.blocks else {
            return 0;
        };
        let hits = hashes
            .iter()
            .take_while(|hash| blocks.contains(hash))
            .count();
        for hash in hashes[..hits].iter().rev() {
            blocks.promote(hash);
        }
        hits
    }

    /// Caches all of `hashes`, evicting the least recently used blocks beyond capacity.
    pub(crate) fn insert(&mut self, hashes: &[u64]) {
        if let Some(blocks) = &mut self.blocks {
            for &hash in hashes.iter().rev() {
                blocks.put(hash, ());
            }
        }
    }

    /// Number of cached blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.as_ref().map_or(0, LruCache::len)
    }

    pub(crate) fn capacity_blocks(&self) -> usize {
        self.blocks.as_ref().map_or(0, |blocks| blocks.cap().get())
    }

    pub(crate) fn clear(&mut self) {
        if let Some(blocks) = &mut self.blocks {
            blocks.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_blocks_get_hashes_and_they_chain() {
        let a = block_hashes(1, &[b'a'; 600], 256);
        assert_eq!(a.len(), 2);
        let mut other = vec![b'b'; 256];
        other.extend_from_slice(&[b'a'; 256]);
        let b = block_hashes(1, &other, 256);
        assert_ne!(a[1], b[1], "a block's hash depends on the blocks before it");
        assert_ne!(a, block_hashes(2, &[b'a'; 600], 256));
    }

    #[test]
    fn a_lookup_counts_leading_hits_only() {
        let mut cache = PrefixCache::new(16);
        cache.insert(&[1, 2, 3]);
        assert_eq!(cache.cached_prefix_blocks(&[1, 2, 9, 3]), 2);
        assert_eq!(cache.cached_prefix_blocks(&[9, 1, 2]), 0);
    }

    #[test]
    fn eviction_takes_tails_before_heads() {
        let mut cache = PrefixCache::new(3);
        cache.insert(&[1, 2, 3]);
        cache.insert(&[4]);
        assert_eq!(cache.cached_prefix_blocks(&[1, 2, 3]), 2);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_zero_capacity_cache_holds_nothing() {
        let mut cache = PrefixCache::new(0);
        cache.insert(&[1]);
        assert_eq!(cache.cached_prefix_blocks(&[1]), 0);
    }
}
