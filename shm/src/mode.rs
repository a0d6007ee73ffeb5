//! [`DataPathMode`]: `--data-path auto|grpc|shm`, on servers and workers alike.

use std::fmt;
use std::str::FromStr;

/// Which data path a server offers, or a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPathMode {
    /// Shared memory with a server on this host, gRPC otherwise (the default).
    #[default]
    Auto,
    /// gRPC only.
    Grpc,
    /// Shared memory only: a server that cannot offer it, or a worker that
    /// cannot take it, fails with the reason.
    Shm,
}

impl DataPathMode {
    /// Whether shared memory is tried at all.
    pub fn tries_shm(self) -> bool {
        self != Self::Grpc
    }
}

impl fmt::Display for DataPathMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Grpc => "grpc",
            Self::Shm => "shm",
        })
    }
}

impl FromStr for DataPathMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "grpc" => Ok(Self::Grpc),
            "shm" => Ok(Self::Shm),
            other => Err(format!(
                "unknown data path {other:?}: use auto, grpc or shm"
            )),
        }
    }
}
