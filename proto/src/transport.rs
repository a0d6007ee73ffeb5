//! One place for the HTTP/2 and gRPC settings of every candle-ps server and
//! channel: flow-control windows, frame size, message limits, keep-alive, TLS.
//!
//! The defaults come from measurements on 2-core machines over loopback: 64 MiB
//! stream and connection windows with 1 MiB frames move large tensors about 1.7x
//! faster than tonic's defaults; a 16 MiB frame size hurts.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Server};

use crate::auth::{AttachToken, AuthChannel, ClusterToken, RequireToken};
use crate::tls::{TlsConfig, TlsError};

/// The default limit for one decoded gRPC message, as in every gRPC implementation.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Room a message keeps for everything but tensor data (names, shapes, protobuf
/// and gRPC framing): a sixteenth of the message limit, between 1 KiB and 64 KiB.
/// Servers and clients both size payloads with it, so what one sends the other
/// accepts.
pub fn message_overhead(max_message_bytes: usize) -> usize {
    (max_message_bytes / 16).clamp(1 << 10, 64 << 10)
}

/// The most connections a server keeps open, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// HTTP/2's initial stream window, by default: as fast as 64 MiB on loopback
/// (docs/benchmarks.md), and small enough that the push streams a server keeps
/// waiting for buffer room hold little of the connection window.
pub const DEFAULT_STREAM_WINDOW_BYTES: u32 = 4 << 20;

/// A parameter server's HTTP/2 initial stream window, by default: what each
/// push stream waiting for room in the server's push buffer may send ahead.
/// Clients keep [`DEFAULT_STREAM_WINDOW_BYTES`] for the pulls they receive.
pub const DEFAULT_SERVER_STREAM_WINDOW_BYTES: u32 = 2 << 20;

/// HTTP/2's initial connection window, by default.
pub const DEFAULT_CONNECTION_WINDOW_BYTES: u32 = 128 << 20;

/// How long a server keeps a connection that asks nothing, by default.
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);

/// An idle limit: `None` is none. A name of its own, so that clap takes the
/// parser's `Option` as the value rather than as an optional flag.
pub type IdleLimit = Option<Duration>;

/// `--idle-connection-timeout`: a duration (`5m`, `90s`), or `0` or `never`
/// for no limit.
///
/// # Errors
/// When `text` is neither.
pub fn parse_idle_timeout(text: &str) -> Result<IdleLimit, String> {
    match text.trim() {
        "0" | "never" => Ok(None),
        other => match humantime::parse_duration(other) {
            Ok(duration) if duration.is_zero() => Ok(None),
            Ok(duration) => Ok(Some(duration)),
            Err(e) => Err(format!("{e} (give a duration such as 5m or 90s, or never)")),
        },
    }
}

/// HTTP/2 and gRPC settings shared by servers and clients.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportConfig {
    /// Largest message a peer accepts, in bytes.
    pub max_message_bytes: usize,
    /// HTTP/2 initial stream window, in bytes.
    pub stream_window_bytes: u32,
    /// HTTP/2 initial connection window, in bytes.
    pub connection_window_bytes: u32,
    /// HTTP/2 maximum frame size, in bytes (16 KiB to 16 MiB - 1).
    pub max_frame_bytes: u32,
    /// Let HTTP/2 size its windows from measured bandwidth-delay (overrides the windows).
    pub adaptive_window: bool,
    /// Interval of HTTP/2 keep-alive pings, which detect dead peers.
    pub keepalive_interval: Duration,
    /// How long a keep-alive ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// How long a client waits for a TCP connection.
    pub connect_timeout: Duration,
    /// TLS on every server and channel; plain TCP when `None`.
    pub tls: Option<TlsConfig>,
    /// The cluster token channels send and servers require; none when `None`.
    pub token: Option<ClusterToken>,
    /// The most connections a server keeps open; more are closed as they come.
    pub max_connections: usize,
    /// A server closes a connection that has had no request in flight this
    /// long; never when `None`.
    pub idle_connection_timeout: Option<Duration>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            stream_window_bytes: DEFAULT_STREAM_WINDOW_BYTES,
            connection_window_bytes: DEFAULT_CONNECTION_WINDOW_BYTES,
            max_frame_bytes: 1 << 20,
            adaptive_window: false,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
            tls: None,
            token: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_connection_timeout: Some(DEFAULT_IDLE_CONNECTION_TIMEOUT),
        }
    }
}

/// HTTP/2's smallest largest frame.
const MIN_FRAME_BYTES: u32 = 16 << 10;
/// HTTP/2's largest frame.
const MAX_FRAME_BYTES: u32 = (16 << 20) - 1;
/// HTTP/2's default window, the smallest this transport takes.
const MIN_WINDOW_BYTES: u32 = 65_535;
/// HTTP/2's largest window.
const MAX_WINDOW_BYTES: u32 = (1 << 31) - 1;
/// The smallest message limit that carries a request.
const MIN_MESSAGE_BYTES: usize = 4 << 10;
/// The largest message limit: a gRPC message's length prefix is 32 bits.
const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// A transport setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The frame size HTTP/2 does not allow.
    #[error(
        "max frame size {0} is outside HTTP/2's range {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES} bytes"
    )]
    FrameSize(u32),
    /// A window HTTP/2 does not allow.
    #[error(
        "{name} {value} is outside HTTP/2's range {MIN_WINDOW_BYTES}..={MAX_WINDOW_BYTES} bytes"
    )]
    Window {
        /// Which window.
        name: &'static str,
        /// Its size in bytes.
        value: u32,
    },
    /// No connection would be taken.
    #[error("--max-connections must be at least 1")]
    NoConnections,
    /// A message limit too small for any request, or past what gRPC's
    /// length prefix can say.
    #[error(
        "max message size {0} bytes is outside 4KiB..=4GiB-1: a smaller one carries no request, a larger one does not fit gRPC's 32-bit length"
    )]
    MessageLimit(usize),
}

impl TransportConfig {
    /// Checks the values HTTP/2 constrains.
    ///
    /// # Errors
    /// The setting that is out of range, with its allowed range.
    pub fn validate(&self) -> Result<(), TransportError> {
        if !(MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&self.max_frame_bytes) {
            return Err(TransportError::FrameSize(self.max_frame_bytes));
        }
        for (name, value) in [
            ("stream window", self.stream_window_bytes),
            ("connection window", self.connection_window_bytes),
        ] {
            if !(MIN_WINDOW_BYTES..=MAX_WINDOW_BYTES).contains(&value) {
                return Err(TransportError::Window { name, value });
            }
        }
        if self.max_connections == 0 {
            return Err(TransportError::NoConnections);
        }
        if !(MIN_MESSAGE_BYTES..=MAX_MESSAGE_BYTES).contains(&self.max_message_bytes) {
            return Err(TransportError::MessageLimit(self.max_message_bytes));
        }
        Ok(())
    }

    /// The most tensor data one message carries: the message limit less
    /// [`message_overhead`].
    pub fn payload_limit(&self) -> usize {
        self.max_message_bytes
            .saturating_sub(message_overhead(self.max_message_bytes))
    }

    /// The most concurrent streams a server takes on one connection: one less
    /// than the stream windows that fit in the connection window. A server
    /// holds back push streams while its push buffer is full; each of them can
    /// have sent at most one stream window, so the ones held back never fill
    /// the connection window that the stream being read needs.
    pub fn max_streams(&self) -> u32 {
        (self.connection_window_bytes / self.stream_window_bytes.max(1))
            .saturating_sub(1)
            .max(1)
    }

    /// A server builder with these settings.
    ///
    /// # Errors
    /// With TLS, when there is no certificate to serve or tonic refuses it.
    pub fn server(&self) -> Result<Server, TlsError> {
        let mut builder = Server::builder();
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.server()?)?;
        }
        Ok(builder
            .initial_stream_window_size(self.stream_window_bytes)
            .initial_connection_window_size(self.connection_window_bytes)
            .max_frame_size(self.max_frame_bytes)
            .max_concurrent_streams(Some(self.max_streams()))
            .http2_adaptive_window(Some(self.adaptive_window))
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .tcp_nodelay(true))
    }

    /// `grpc`, a generated client or server, reading and writing messages of up
    /// to [`TransportConfig::max_message_bytes`].
    pub fn limited<G: MessageLimits>(&self, grpc: G) -> G {
        grpc.limit_messages(self.max_message_bytes)
    }

    /// `channel`, sending the cluster token with every request.
    pub fn authed(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, AttachToken::new(self.token.clone()))
    }

    /// `service`, refusing requests without the cluster token with
    /// `UNAUTHENTICATED` (the health service is served without it).
    pub fn guarded<S>(&self, service: S) -> InterceptedService<S, RequireToken> {
        InterceptedService::new(service, RequireToken::new(self.token.clone()))
    }

    /// Whether servers and channels use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A client endpoint for `uri` with these settings; with TLS, an `http://`
    /// URI is dialled as `https://`.
    ///
    /// # Errors
    /// When `uri` is not a valid URI.
    pub fn endpoint(&self, uri: impl Into<String>) -> Result<Endpoint, tonic::transport::Error> {
        let mut uri = uri.into();
        if let (Some(_), Some(rest)) = (&self.tls, uri.strip_prefix("http://")) {
            uri = format!("https://{rest}");
        }
        let mut endpoint = Endpoint::from_shared(uri)?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.client())?;
        }
        Ok(endpoint
            .initial_stream_window_size(self.stream_window_bytes)
            .initial_connection_window_size(self.connection_window_bytes)
            .max_frame_size(self.max_frame_bytes)
            .http2_adaptive_window(self.adaptive_window)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true))
    }
}

/// `http://ADDR` for a `host:port` address; an address that already has a scheme
/// is returned unchanged.
pub fn http_uri(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_timeouts_read_as_durations_or_never() {
        assert_eq!(parse_idle_timeout("5m"), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_idle_timeout("90s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_idle_timeout("never"), Ok(None));
        assert_eq!(parse_idle_timeout("0"), Ok(None));
        assert_eq!(parse_idle_timeout("0s"), Ok(None));
        let error = parse_idle_timeout("soon").unwrap_err();
        assert!(error.contains("5m"), "{error}");
    }

    #[test]
    fn payloads_leave_room_for_names_shapes_and_framing() {
        let limit = |max_message_bytes| {
            TransportConfig {
                max_message_bytes,
                ..TransportConfig::default()
            }
            .payload_limit()
        };
        assert_eq!(limit(4 << 20), (4 << 20) - (64 << 10));
        assert_eq!(limit(64 << 10), 60 << 10);
        assert_eq!(limit(4096), 3072);
        let tiny = TransportConfig {
            max_message_bytes: 2048,
            ..TransportConfig::default()
        };
        assert!(
            tiny.validate()
                .unwrap_err()
                .to_string()
                .contains("4KiB..=4GiB-1")
        );
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(TransportConfig::default().validate(), Ok(()));
    }

    #[test]
    fn a_message_limit_past_a_grpc_length_or_under_a_request_is_refused() {
        for max_message_bytes in [1 << 10, 1 << 32] {
            let config = TransportConfig {
                max_message_bytes,
                ..TransportConfig::default()
            };
            let refused = config.validate().unwrap_err().to_string();
            assert!(refused.contains("4KiB..=4GiB-1"), "{refused}");
        }
        let largest = TransportConfig {
            max_message_bytes: u32::MAX as usize,
            ..TransportConfig::default()
        };
        assert_eq!(largest.validate(), Ok(()));
    }

    #[test]
    fn out_of_range_frame_size_is_named() {
        let config = TransportConfig {
            max_frame_bytes: 16 << 20,
            ..TransportConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("max frame size")
        );
    }

    #[test]
    fn streams_held_back_never_fill_the_connection_window() {
        let streams = |stream_window_bytes, connection_window_bytes| {
            TransportConfig {
                stream_window_bytes,
                connection_window_bytes,
                ..TransportConfig::default()
            }
            .max_streams()
        };
        assert_eq!(TransportConfig::default().max_streams(), 31);
        for (stream, connection) in [(4 << 20, 128 << 20), (1 << 20, 3 << 20), (65_535, 1 << 20)] {
            let held_back = u64::from(streams(stream, connection) - 1) * u64::from(stream);
            assert!(held_back + u64::from(stream) <= u64::from(connection));
        }
        assert_eq!(streams(64 << 20, 64 << 20), 1, "at least one stream");
    }

    #[test]
    fn http_uri_adds_a_scheme_once() {
        assert_eq!(http_uri("127.0.0.1:5000"), "http://127.0.0.1:5000");
        assert_eq!(http_uri("https://ps:1"), "https://ps:1");
    }
}

/// A generated gRPC client or server whose message limits can be set: the one
/// place every candle-ps client and server gets its limits from (through
/// [`TransportConfig::limited`], or with a size of its own).
pub trait MessageLimits: Sized {
    /// This client or server, decoding and encoding messages of up to `bytes`.
    #[must_use]
    fn limit_messages(self, bytes: usize) -> Self;
}

/// [`MessageLimits`] for generated clients, by module and type name.
macro_rules! client_limits {
    ($($module:ident :: $client:ident),* $(,)?) => {$(
        impl<T> MessageLimits for crate::v1::$module::$client<T>
        where
            T: tonic::client::GrpcService<tonic::body::Body>,
            T::Error: Into<tonic::codegen::StdError>,
            T::ResponseBody: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
            <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
        {
            fn limit_messages(self, bytes: usize) -> Self {
                self.max_decoding_message_size(bytes)
                    .max_encoding_message_size(bytes)
            }
        }
    )*};
}

/// [`MessageLimits`] for generated servers, by module, type and service trait.
macro_rules! server_limits {
    ($($module:ident :: $server:ident for $service:ident),* $(,)?) => {$(
        impl<T: crate::v1::$module::$service> MessageLimits for crate::v1::$module::$server<T> {
            fn limit_messages(self, bytes: usize) -> Self {
                self.max_decoding_message_size(bytes)
                    .max_encoding_message_size(bytes)
            }
        }
    )*};
}

client_limits!(
    parameter_server_client::ParameterServerClient,
    scheduler_client::SchedulerClient,
    bench_client::BenchClient,
);

server_limits!(
    parameter_server_server::ParameterServerServer for ParameterServer,
    scheduler_server::SchedulerServer for Scheduler,
    bench_server::BenchServer for Bench,
);
