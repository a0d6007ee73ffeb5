//! [`ParamKey`]: the name of one stored tensor, a parameter or one partition of it.

use std::fmt;

/// A parameter name and partition index; a whole tensor is part 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamKey {
    /// Parameter name, for example `fc1.weight`.
    pub name: String,
    /// Partition index.
    pub part: u32,
}

impl ParamKey {
    /// A key from its parts.
    pub fn new(name: impl Into<String>, part: u32) -> Self {
        Self {
            name: name.into(),
            part,
        }
    }
}

impl fmt::Display for ParamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`#{}", self.name, self.part)
    }
}
