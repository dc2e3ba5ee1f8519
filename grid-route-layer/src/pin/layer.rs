//! [`PinLayer`] and [`PinKeys`], the shared handle on the tag keys that a reload rotates.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use arc_swap::ArcSwap;
use tower::Layer;

use super::service::PinService;
use super::tag::{BadTag, IdKind, TagKeys, TagStamp, UntaggedId};
use crate::grid::{ClusterDigest, Grid, SiteName};

/// The tag keys every [`PinService`] of a gateway reads, swapped atomically on reload.
///
/// Clones share the keys. The gateway keeps one clone and calls [`set`](Self::set) with the
/// keys it reloaded: from then on new ids are signed with the current key, and ids signed
/// with the previous key verify only while the configuration names it (see [`TagKeys`]).
/// Requests read the keys with one atomic load and never wait for a reload.
#[derive(Clone)]
pub struct PinKeys {
    shared: Arc<SharedKeys>,
}

struct SharedKeys {
    keys: ArcSwap<TagKeys>,
}

impl PinKeys {
    /// A handle on `keys`.
    pub fn new(keys: TagKeys) -> Self {
        Self {
            shared: Arc::new(SharedKeys {
                keys: ArcSwap::from_pointee(keys),
            }),
        }
    }

    /// The keys as they are now; hold them for the length of one decision.
    pub fn load(&self) -> Arc<TagKeys> {
        self.shared.keys.load_full()
    }

    /// Replaces the keys: requests read the old keys or the new ones, never a mix.
    pub fn set(&self, keys: TagKeys) {
        self.shared.keys.store(Arc::new(keys));
    }

    /// Checks a tagged id of `kind` with the current keys; see [`TagKeys::untag`].
    pub fn untag(&self, kind: IdKind, tagged: &str) -> Result<UntaggedId, BadTag> {
        self.shared.keys.load().untag(kind, tagged)
    }

    /// The stamp for ids stored at `site` in the cluster with `digest`, under the current
    /// key; see [`TagKeys::stamp`].
    pub fn stamp(&self, site: &SiteName, digest: ClusterDigest) -> TagStamp {
        self.shared.keys.load().stamp(site, digest)
    }
}

impl From<TagKeys> for PinKeys {
    fn from(keys: TagKeys) -> Self {
        Self::new(keys)
    }
}

impl Default for PinKeys {
    /// No key: tags carry an empty mac and any well-formed tag is accepted.
    fn default() -> Self {
        Self::new(TagKeys::default())
    }
}

impl fmt::Debug for PinKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `TagKeys`'s own `Debug` never shows a key.
        f.debug_tuple("PinKeys")
            .field(&*self.shared.keys.load())
            .finish()
    }
}

/// Pins requests that name stored responses or conversations to the cluster that stored
/// them, and tags the ids in their answers. See the [module docs](super).
///
/// Place it right inside [`KeyingLayer`](crate::keying::KeyingLayer): it reads the body
/// keying buffered ([`BufferedBody`](crate::route::BufferedBody)) and sets
/// [`Pinned`](crate::route::Pinned) for the layers inside.
#[derive(Clone, Debug)]
pub struct PinLayer {
    shared: Arc<Shared>,
}

/// What every [`PinService`] made by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) grid: Grid,
    pub(crate) keys: PinKeys,
    /// Turns through equally loaded clusters for new conversations.
    pub(crate) turn: AtomicUsize,
}

impl PinLayer {
    /// Pins to the clusters of `grid`, checking and writing tags with `keys` (keep a
    /// clone of them to rotate the key on reload).
    pub fn new(grid: Grid, keys: PinKeys) -> Self {
        Self {
            shared: Arc::new(Shared {
                grid,
                keys,
                turn: AtomicUsize::new(0),
            }),
        }
    }
}

impl<S> Layer<S> for PinLayer {
    type Service = PinService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PinService::with_shared(inner, Arc::clone(&self.shared))
    }
}
