//! The numbers every process passes around, each with a name of its own so a
//! signature says which one it takes: a worker's [`Rank`], a training [`Step`],
//! a key's [`Version`] (pushes applied), a shard map's [`MapVersion`] and a
//! parameter server's [`ServerId`].
//!
//! On the wire they stay plain integers (`ps.v1` is unchanged); code converts at
//! the edge with `From`/`.get()` and uses the named type inside.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The plain integer, as the wire carries it.
            pub const fn get(self) -> $inner {
                self.0
            }

            /// The one after this one.
            pub const fn next(self) -> Self {
                Self(self.0 + 1)
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                Self(value)
            }
        }

        impl From<$name> for $inner {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        // Both print the bare number: messages already say which id it is, and a
        // list of ranks reads `[0, 2]` as it did when they were plain integers.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

id!(
    /// A worker's place in its group, `0..group size`.
    Rank(u32)
);

id!(
    /// One training step of one worker; a gradient is applied once per `(Rank, Step)`.
    Step(u64)
);

id!(
    /// How many updates a stored key has taken (0: as registered).
    Version(u64)
);

id!(
    /// The version of a published shard map (0: routed without a scheduler).
    MapVersion(u64)
);

id!(
    /// A parameter server's index in the shard map's server list.
    ServerId(u32)
);

impl Version {
    /// The version a key reaches once `step` is applied (BSP: step `t` makes `t + 1`).
    pub const fn after(step: Step) -> Self {
        Self(step.0 + 1)
    }

    /// The version that holds steps `0..step`: the one a worker whose next
    /// step is `step` has loaded.
    pub const fn before(step: Step) -> Self {
        Self(step.0)
    }

    /// The step a worker that loaded this version pushes next: version `v`
    /// holds steps `0..v`, so the group is at step `v`.
    pub const fn next_step(self) -> Step {
        Step(self.0)
    }

    /// The step whose completion gave this version (`None` at version 0).
    pub const fn last_step(self) -> Option<Step> {
        match self.0.checked_sub(1) {
            Some(step) => Some(Step(step)),
            None => None,
        }
    }
}

impl MapVersion {
    /// Requests routed without a scheduler carry map version 0.
    pub const UNROUTED: Self = Self(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_holds_the_steps_before_it() {
        assert_eq!(Version::before(Step(4)).next_step(), Step(4));
        assert_eq!(Version::after(Step(4)), Version::before(Step(5)));
        assert_eq!(Version::after(Step(4)).last_step(), Some(Step(4)));
    }

    #[test]
    fn display_is_the_plain_integer_so_messages_read_as_before() {
        assert_eq!(format!("worker {}", Rank(3)), "worker 3");
        assert_eq!(format!("{:>4}", Step(7)), "   7");
        assert_eq!(MapVersion(5).to_string(), "5");
        assert_eq!(format!("{:?}", [Rank(0), Rank(2)]), "[0, 2]");
    }

    #[test]
    fn ids_order_and_convert_like_their_integers() {
        assert!(Step(1) < Step(2));
        assert_eq!(Step(1).next(), Step(2));
        assert_eq!(u64::from(Version(9)), 9);
        assert_eq!(Rank::from(4).get(), 4);
    }

    #[test]
    fn serde_writes_the_plain_integer() {
        let text = serde_json::to_string(&MapVersion(12)).unwrap();
        assert_eq!(text, "12");
        let back: MapVersion = serde_json::from_str(&text).unwrap();
        assert_eq!(back, MapVersion(12));
    }
}
