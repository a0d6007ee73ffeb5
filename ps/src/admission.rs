//! [`Admitted`]: the one step every data-carrying request passes before the
//! store sees it. Its shard-map version is admitted first ([`Admitted::map`]:
//! a stale map is refused, a newer one waited for), and only then is the memory
//! it will hold charged to the budget ([`Admitted::charge`]); a stream does both
//! for each message, growing one charge ([`Admitted::add_to`]).
//!
//! The store charges the footprint of keys it creates itself, under its lock
//! (`Store::register`): that charge lasts as long as the key, while the ones
//! here last as long as the request.

use crate::budget::Charge;
use crate::error::Result;
use crate::store::Store;
use ps_proto::ids::MapVersion;

/// A request whose shard-map version this server admitted.
#[must_use = "an admitted request is charged next"]
pub(crate) struct Admitted<'a> {
    store: &'a Store,
}

impl<'a> Admitted<'a> {
    /// Admits a request routed by `map_version` (`ps.v1`'s `map_version` field).
    ///
    /// # Errors
    /// `StaleMap`, or `MapAhead` when this server could not catch up in time.
    pub(crate) async fn map(store: &'a Store, map_version: u64) -> Result<Self> {
        store.map().admit(MapVersion(map_version)).await?;
        Ok(Self { store })
    }

    /// Charges `bytes` (what `what` names) to the memory budget for as long as
    /// the returned charge lives.
    ///
    /// # Errors
    /// `OverBudget`.
    pub(crate) fn charge(self, bytes: usize, what: impl FnOnce() -> String) -> Result<Charge> {
        self.store.budget().charge(bytes, what)
    }

    /// Adds `bytes` to `charge`, a stream's charge for what it buffered so far.
    ///
    /// # Errors
    /// `OverBudget`, and `charge` keeps what it had.
    pub(crate) fn add_to(
        self,
        charge: &mut Charge,
        bytes: usize,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        charge.grow(bytes, what)
    }
}
