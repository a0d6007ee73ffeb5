//! How the workers of a `kv` phase reach the servers: a data path of the
//! product (`grpc`, `shm`, `auto`), or `uds`, gRPC over each server's
//! Unix-domain socket (`ps-server --listen-unix`), the same-host step a user
//! would try first (issue 38 measures it beside the others).

use std::fmt;
use std::str::FromStr;

use ps_shm::DataPathMode;

/// One way to reach the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPath {
    /// A data path of the client's, over the servers' TCP addresses.
    Mode(DataPathMode),
    /// gRPC over each server's Unix-domain socket.
    Uds,
}

impl KvPath {
    /// The client's data path: gRPC over a socket is gRPC.
    pub fn mode(self) -> DataPathMode {
        match self {
            Self::Mode(mode) => mode,
            Self::Uds => DataPathMode::Grpc,
        }
    }

    /// Whether the workers may go through shared memory.
    pub fn tries_shm(self) -> bool {
        self.mode().tries_shm()
    }
}

impl FromStr for KvPath {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "uds" => Ok(Self::Uds),
            other => other
                .parse()
                .map(Self::Mode)
                .map_err(|_| format!("unknown data path {other:?}: use grpc, shm, auto or uds")),
        }
    }
}

impl fmt::Display for KvPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mode(mode) => write!(f, "{mode}"),
            Self::Uds => f.write_str("uds"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_reads_back_as_it_prints() {
        for text in ["grpc", "shm", "auto", "uds"] {
            let path: KvPath = text.parse().unwrap();
            assert_eq!(path.to_string(), text);
        }
        assert_eq!(KvPath::Uds.mode(), DataPathMode::Grpc);
        assert!(!KvPath::Uds.tries_shm());
        let error = "tcp".parse::<KvPath>().unwrap_err();
        assert!(error.contains("uds"), "{error}");
    }
}
