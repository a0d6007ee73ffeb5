//! [`Tuning`]: the transport knobs every subcommand takes (HTTP/2 windows, frame
//! size, adaptive window, chunk size, connections per peer), with the defaults that
//! measured best on 2-core machines (see docs/benchmarks.md).

use clap::Args;
use ps_common::flag::env_flag;
use ps_proto::transport::TransportConfig;

use ps_common::size::parse_size;

/// Largest message the benchmark peers accept: room for 256 MiB payloads.
pub const BENCH_MAX_MESSAGE_BYTES: usize = 300 << 20;

/// Transport knobs.
#[derive(Debug, Clone, Args)]
pub struct Tuning {
    /// HTTP/2 initial stream window.
    #[arg(long, env = "PS_STREAM_WINDOW", value_parser = parse_size, default_value = "4MiB")]
    pub stream_window: usize,
    /// HTTP/2 initial connection window.
    #[arg(long, env = "PS_CONNECTION_WINDOW", value_parser = parse_size, default_value = "128MiB")]
    pub connection_window: usize,
    /// HTTP/2 maximum frame size (16KiB to 16MiB-1).
    #[arg(long, env = "PS_MAX_FRAME", value_parser = parse_size, default_value = "1MiB")]
    pub max_frame: usize,
    /// Let HTTP/2 size its windows adaptively (overrides the windows).
    #[arg(long, env = "PS_ADAPTIVE_WINDOW", value_parser = env_flag())]
    pub adaptive_window: bool,
    /// Size of each message when a payload is streamed in chunks.
    #[arg(long, env = "PS_CHUNK", value_parser = parse_size, default_value = "1MiB")]
    pub chunk: usize,
    /// Connections (HTTP/2 or TCP) per peer, each with one request in flight.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Requests a simulated worker's push or pull keeps in flight to one
    /// parameter server (its keys cut into groups of similar bytes).
    #[arg(long, env = "PS_REQUESTS_PER_SERVER", default_value_t = ps_client::DEFAULT_REQUESTS_PER_SERVER)]
    pub requests_per_server: usize,
}

/// A tuning knob out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    /// A size HTTP/2 cannot express.
    #[error("--{name} {value} is too large")]
    TooLarge {
        /// The knob.
        name: &'static str,
        /// Its value.
        value: usize,
    },
    /// A count of zero.
    #[error("--connections, --chunk and --requests-per-server must be at least 1")]
    Zero,
    /// A transport setting out of range.
    #[error(transparent)]
    Transport(#[from] ps_proto::transport::TransportError),
}

impl Tuning {
    /// The transport settings these knobs describe.
    ///
    /// # Errors
    /// The out-of-range knob.
    pub fn transport(&self) -> Result<TransportConfig, TuningError> {
        let to_u32 = |name: &'static str, value: usize| {
            u32::try_from(value).map_err(|_| TuningError::TooLarge { name, value })
        };
        let config = TransportConfig {
            max_message_bytes: BENCH_MAX_MESSAGE_BYTES,
            stream_window_bytes: to_u32("stream-window", self.stream_window)?,
            connection_window_bytes: to_u32("connection-window", self.connection_window)?,
            max_frame_bytes: to_u32("max-frame", self.max_frame)?,
            adaptive_window: self.adaptive_window,
            ..TransportConfig::default()
        };
        config.validate()?;
        if self.connections == 0 || self.chunk == 0 || self.requests_per_server == 0 {
            return Err(TuningError::Zero);
        }
        Ok(config)
    }

    /// The same knobs as command-line flags, for a spawned server.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--stream-window={}", self.stream_window),
            format!("--connection-window={}", self.connection_window),
            format!("--max-frame={}", self.max_frame),
            format!("--chunk={}", self.chunk),
            format!("--connections={}", self.connections),
            format!("--requests-per-server={}", self.requests_per_server),
        ];
        if self.adaptive_window {
            args.push("--adaptive-window".into());
        }
        args
    }
}
