//! A hasher that passes prefix keys through unchanged.

use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a `u64` prefix key to itself.
///
/// Prefix keys are already the output of a keyed SipHash, uniformly random over 64 bits, so
/// hashing them again costs time and buys nothing. Keys that were *not* random (small
/// integers in a test, say) still work: the map only probes more, it never answers wrong.
#[derive(Default, Clone, Copy)]
pub(crate) struct PassThroughHasher(u64);

impl fmt::Debug for PassThroughHasher {
    // Its state is the last key hashed, and keys never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PassThroughHasher")
    }
}

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }

    // Only `u64` keys are hashed in the index; any other input is folded in so the hasher
    // stays correct (if slow) should a caller ever hash something else with it.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

/// Builds [`PassThroughHasher`]s for the per-cluster maps.
pub(crate) type PassThroughState = BuildHasherDefault<PassThroughHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    #[test]
    fn a_key_hashes_to_itself() {
        let key = 0x9e37_79b9_7f4a_7c15_u64;
        assert_eq!(PassThroughState::default().hash_one(key), key);
        let mut hasher = PassThroughHasher::default();
        key.hash(&mut hasher);
        assert_eq!(hasher.finish(), key);
        assert!(!format!("{hasher:?}").contains(&format!("{key:x}")));
    }
}
