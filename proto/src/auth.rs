//! The cluster token: a shared secret every request to a parameter server, the
//! scheduler or a benchmark server carries as `authorization: Bearer <token>`.
//!
//! Channels attach it with [`AttachToken`]; servers check it with
//! [`RequireToken`] and answer `UNAUTHENTICATED` when it is missing or wrong.
//! The health service is left open, so probes and container health checks need
//! no secret. The comparison takes the same time whatever the token sent.

use std::sync::Arc;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The metadata key the token travels in.
const AUTHORIZATION: &str = "authorization";

/// A channel that carries the cluster token (if any) on every request.
pub type AuthChannel = InterceptedService<Channel, AttachToken>;

/// The cluster's shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken {
    header: AsciiMetadataValue,
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

impl ClusterToken {
    /// A token from its text, without surrounding white space.
    ///
    /// # Errors
    /// A message when it is empty or not printable ASCII without spaces.
    pub fn new(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the cluster token is empty".into());
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the cluster token must be printable ASCII without spaces".into());
        }
        let header = MetadataValue::try_from(format!("Bearer {text}"))
            .map_err(|e| format!("the cluster token cannot travel in a header: {e}"))?;
        Ok(Self { header })
    }
}

/// Adds the cluster token to each request of a channel (nothing without one).
#[derive(Debug, Clone, Default)]
pub struct AttachToken(Option<ClusterToken>);

impl AttachToken {
    /// Attaches `token`, when there is one.
    pub fn new(token: Option<ClusterToken>) -> Self {
        Self(token)
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, token.header.clone());
        }
        Ok(request)
    }
}

/// Refuses requests without the cluster token (lets everything through without one).
#[derive(Debug, Clone, Default)]
pub struct RequireToken(Option<Arc<ClusterToken>>);

impl RequireToken {
    /// Requires `token`, when there is one.
    pub fn new(token: Option<ClusterToken>) -> Self {
        Self(token.map(Arc::new))
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        match request.metadata().get(AUTHORIZATION) {
            Some(sent) if same_secret(sent.as_bytes(), expected.header.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated(
                "wrong cluster token: give this client the token the cluster was started with (PS_TOKEN or --token-file)",
            )),
            None => Err(Status::unauthenticated(
                "this cluster requires a token: give the client the cluster's token (PS_TOKEN or --token-file)",
            )),
        }
    }
}

/// Whether two secrets are equal, compared in time that depends only on their
/// lengths, not on where they differ.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(token: Option<&str>) -> Request<()> {
        let mut attach = AttachToken::new(token.map(|t| ClusterToken::new(t).unwrap()));
        attach.call(Request::new(())).unwrap()
    }

    #[test]
    fn the_right_token_passes_and_others_are_unauthenticated() {
        let mut require = RequireToken::new(Some(ClusterToken::new("s3cret").unwrap()));
        assert!(require.call(request_with(Some("s3cret"))).is_ok());
        for (sent, says) in [(Some("s3cre"), "wrong"), (None, "requires a token")] {
            let status = require.call(request_with(sent)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
            assert!(status.message().contains(says), "{}", status.message());
        }
    }

    #[test]
    fn without_a_token_everything_passes() {
        let mut require = RequireToken::default();
        assert!(require.call(request_with(Some("anything"))).is_ok());
        assert!(require.call(request_with(None)).is_ok());
    }

    #[test]
    fn bad_tokens_are_refused_and_white_space_is_trimmed() {
        assert!(ClusterToken::new("  \n").is_err());
        assert!(ClusterToken::new("two words").is_err());
        assert_eq!(
            ClusterToken::new("abc\n").unwrap(),
            ClusterToken::new("abc").unwrap()
        );
    }
}
