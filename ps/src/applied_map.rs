//! [`AppliedMap`]: the shard-map version a server has applied, and what it does
//! with a request routed by another version. An older one is refused as stale
//! (the worker refreshes and retries). A newer one means this server is behind the
//! scheduler: it asks its follower to fetch the map now and waits briefly, so a
//! worker that learnt of a new map first (for example the group size of a group
//! that just formed) is not refused for the server's lag. With a values arena,
//! the version applied is also written into it, so that a worker reading values
//! there with no request reads them only when it routes by that map, or by
//! none ([`Arena::publish_map`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ps_proto::ids::MapVersion;
use ps_shm::arena::Arena;
use tokio::sync::{Notify, watch};

use crate::error::{Error, Result};

/// How long a request routed by a newer map waits for this server to apply it.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// The applied shard-map version of one server.
#[derive(Debug)]
pub struct AppliedMap {
    applied: watch::Sender<MapVersion>,
    wanted: Notify,
    following: AtomicBool,
    /// The values arena that says which version is applied, if any.
    arena: OnceLock<Arc<Arena>>,
}

impl Default for AppliedMap {
    fn default() -> Self {
        Self {
            applied: watch::Sender::new(MapVersion::UNROUTED),
            wanted: Notify::new(),
            following: AtomicBool::new(false),
            arena: OnceLock::new(),
        }
    }
}

impl AppliedMap {
    /// The newest version applied (0: none).
    pub fn current(&self) -> MapVersion {
        *self.applied.borrow()
    }

    /// Records that `version` is applied; versions only increase.
    pub fn set(&self, version: MapVersion) {
        self.applied.send_if_modified(|applied| {
            let newer = version > *applied;
            if newer {
                *applied = version;
                // Under the watch's lock: one write at a time, in order.
                if let Some(arena) = self.arena.get() {
                    arena.publish_map(Some(version.get()));
                }
            }
            newer
        });
    }

    /// Writes the version applied, now and at every change, into `arena`
    /// (the first arena given; later ones are ignored).
    pub fn mirror_into(&self, arena: Arc<Arena>) {
        self.applied.send_if_modified(|applied| {
            if self.arena.set(Arc::clone(&arena)).is_ok() {
                arena.publish_map(Some(applied.get()));
            }
            false
        });
    }

    /// Resolves once a map newer than `version` is applied (never for 0: a request
    /// routed without a scheduler). A pull waiting for a version uses it to end
    /// early when placement changed under it, so the worker re-routes instead of
    /// waiting for pushes that now go elsewhere.
    pub async fn moved_past(&self, version: MapVersion) {
        if version == MapVersion::UNROUTED {
            return std::future::pending().await;
        }
        let mut applied = self.applied.subscribe();
        if applied.wait_for(|&v| v > version).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Marks this server as following a scheduler, so a newer version can be fetched.
    pub fn follow(&self) {
        self.following.store(true, Ordering::Relaxed);
    }

    /// Resolves when a request asked for a newer map than the one applied.
    pub async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// Admits a request routed by shard map `requested` (0: no scheduler, always
    /// admitted).
    ///
    /// # Errors
    /// [`Error::StaleMap`] for an older version; [`Error::MapAhead`] when this
    /// server could not apply a newer one within [`CATCH_UP_WAIT`].
    pub async fn admit(&self, requested: MapVersion) -> Result<()> {
        let current = self.current();
        if requested == MapVersion::UNROUTED || requested == current {
            return Ok(());
        }
        if requested < current {
            return Err(Error::StaleMap { requested, current });
        }
        if !self.following.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.wanted.notify_one();
        let mut applied = self.applied.subscribe();
        let caught_up = tokio::time::timeout(
            CATCH_UP_WAIT,
            applied.wait_for(|&version| version >= requested),
        )
        .await;
        match caught_up {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::MapAhead {
                requested,
                current: self.current(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn older_maps_are_stale_and_equal_or_unversioned_ones_pass() {
        let map = AppliedMap::default();
        map.set(MapVersion(3));
        map.set(MapVersion(2));
        assert_eq!(map.current(), MapVersion(3), "versions never go back");
        assert!(map.admit(MapVersion(0)).await.is_ok());
        assert!(map.admit(MapVersion(3)).await.is_ok());
        assert!(matches!(
            map.admit(MapVersion(2)).await,
            Err(Error::StaleMap {
                requested: MapVersion(2),
                current: MapVersion(3)
            })
        ));
    }

    /// A worker reading the arena with no request reads only as a request
    /// would be admitted: the arena says which map is applied, from the
    /// moment it is given and at every newer one.
    #[test]
    fn the_arena_says_which_map_is_applied() {
        use ps_shm::arena::ArenaView;
        let arena = Arena::create(1 << 20).unwrap();
        let block = arena.block(&[1.0; 1024]).unwrap();
        block.publish(Some(0));
        let file = arena.file().try_clone_to_owned().unwrap();
        let view = ArenaView::open(file, arena.bytes(), true).unwrap();
        let key = ps_proto::key::ParamKey::new("w", 0);
        let spot = arena.spot_of(bytemuck::cast_slice(block.as_slice()));
        view.remember(&key, spot.expect("a block's values start it"));
        let spot = view.spot_of(&key).unwrap();
        let read = |routed_by| view.read_current(spot, (0, routed_by), &mut [0u8; 4096]);

        let map = AppliedMap::default();
        map.set(MapVersion(2));
        map.mirror_into(Arc::clone(&arena));
        assert_eq!(
            (read(1), read(2)),
            (None, Some(0)),
            "applied before the arena came"
        );
        map.set(MapVersion(3));
        assert_eq!((read(2), read(3), read(0)), (None, Some(0), Some(0)));
    }

    #[tokio::test]
    async fn a_newer_map_waits_for_the_follower_to_apply_it() {
        let map = Arc::new(AppliedMap::default());
        map.follow();
        map.set(MapVersion(1));
        let follower = tokio::spawn({
            let map = Arc::clone(&map);
            async move {
                map.wanted().await;
                map.set(MapVersion(2));
            }
        });
        map.admit(MapVersion(2)).await.unwrap();
        follower.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_map_that_never_comes_is_unavailable_not_a_hang() {
        let map = AppliedMap::default();
        map.follow();
        map.set(MapVersion(1));
        let error = map.admit(MapVersion(4)).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(error.to_string().contains("version 4"), "{error}");
    }
}
