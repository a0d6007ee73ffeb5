//! The cluster token: a shared secret every request to a parameter server, the
//! scheduler or a benchmark server carries as `authorization: Bearer <token>`.
//!
//! Channels attach it with [`AttachToken`]; servers check it with
//! [`RequireToken`] and answer `UNAUTHENTICATED` when it is missing or wrong.
//! The health service is left open, so probes and container health checks need
//! no secret. The comparison takes the same time whatever the token sent.
//!
//! A token may give servers and workers different secrets ([`ClusterToken`]);
//! [`RequireToken`] records the roles a request's secret grants ([`Granted`]),
//! and `ps_common::access` checks each method's [`Role`] against them.

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

/// What a credential lets its holder do, where that matters: only a server may
/// register as a server, only a worker may take a rank or send gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A parameter server.
    Server,
    /// A worker (and the benchmarks' simulated workers).
    Worker,
}

impl Role {
    /// The role's name, as the cluster token's lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Worker => "worker",
        }
    }
}

/// The roles the credential of a request granted. [`RequireToken`] puts it in
/// the request's extensions; `ps_common::access` checks each method's role with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    server: bool,
    worker: bool,
}

impl Granted {
    const ALL: Granted = Granted {
        server: true,
        worker: true,
    };

    /// The roles of a secret that grants only `role`.
    pub fn only(role: Role) -> Self {
        Granted {
            server: role == Role::Server,
            worker: role == Role::Worker,
        }
    }

    /// Whether `role` was granted.
    pub fn allows(self, role: Role) -> bool {
        match role {
            Role::Server => self.server,
            Role::Worker => self.worker,
        }
    }
}

/// The cluster's secrets: the ones this process accepts, with the roles each
/// grants, and the one it presents.
///
/// Its text is either one token, which every process holds and which grants
/// every role, or lines `server=SECRET` and `worker=SECRET`: the scheduler and
/// the servers hold both lines, workers only theirs, so a worker's secret cannot
/// register a server and a server's cannot take a rank.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken {
    accepted: Vec<(AsciiMetadataValue, Granted)>,
    presented: Option<AsciiMetadataValue>,
    roles: bool,
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

impl ClusterToken {
    /// The secrets in `text`: one token, or `server=` and `worker=` lines. A
    /// process presents its worker secret, or its only one, until
    /// [`ClusterToken::presenting`] says otherwise.
    ///
    /// # Errors
    /// [`TokenError`] when it is empty, a secret is not printable ASCII
    /// without spaces, or a line names another role or repeats one.
    pub fn new(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TokenError::Empty);
        }
        let has_roles = text.lines().any(|line| {
            let line = line.trim_start();
            line.starts_with("server=") || line.starts_with("worker=")
        });
        if !has_roles {
            let header = bearer(text)?;
            return Ok(Self {
                accepted: vec![(header.clone(), Granted::ALL)],
                presented: Some(header),
                roles: false,
            });
        }
        let mut token = Self {
            accepted: Vec::new(),
            presented: None,
            roles: true,
        };
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (role, secret) = line.split_once('=').ok_or(TokenError::NotARoleLine)?;
            let role = match role.trim() {
                "server" => Role::Server,
                "worker" => Role::Worker,
                other => return Err(TokenError::UnknownRole(other.to_string())),
            };
            if token.secret_of(role).is_some() {
                return Err(TokenError::Repeated(role.name()));
            }
            token
                .accepted
                .push((bearer(secret.trim())?, Granted::only(role)));
        }
        token.presented = token
            .secret_of(Role::Worker)
            .or_else(|| token.secret_of(Role::Server));
        Ok(token)
    }

    /// The same secrets, presenting the one of `role`.
    ///
    /// # Errors
    /// [`TokenError::NoSecretFor`] when the token has roles but no secret for `role`.
    pub fn presenting(mut self, role: Role) -> Result<Self, TokenError> {
        if self.roles {
            let secret = self.secret_of(role);
            self.presented = Some(secret.ok_or(TokenError::NoSecretFor(role.name()))?);
        }
        Ok(self)
    }

    /// Whether the token grants different secrets to servers and workers.
    pub fn has_roles(&self) -> bool {
        self.roles
    }

    fn secret_of(&self, role: Role) -> Option<AsciiMetadataValue> {
        self.accepted
            .iter()
            .find(|(_, granted)| *granted == Granted::only(role))
            .map(|(header, _)| header.clone())
    }

    /// The roles `sent` (an `authorization` header) grants, if it is one of ours.
    fn grants(&self, sent: &[u8]) -> Option<Granted> {
        // Every secret is compared, whichever matches, so the time taken does
        // not tell which one a guess came close to.
        self.accepted.iter().fold(None, |found, (header, granted)| {
            let same = same_secret(sent, header.as_bytes());
            found.or(same.then_some(*granted))
        })
    }
}

fn bearer(secret: &str) -> Result<AsciiMetadataValue, TokenError> {
    if secret.is_empty() {
        return Err(TokenError::EmptySecret);
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::NotPrintable);
    }
    MetadataValue::try_from(format!("Bearer {secret}"))
        .map_err(|e| TokenError::NotAHeader(e.to_string()))
}

/// Why a cluster token cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Nothing in the token.
    #[error("the cluster token is empty")]
    Empty,
    /// A role line without its secret.
    #[error("a secret of the cluster token is empty")]
    EmptySecret,
    /// Spaces or characters a header cannot carry.
    #[error("the cluster token must be printable ASCII without spaces")]
    NotPrintable,
    /// Refused as a header value.
    #[error("the cluster token cannot travel in a header: {0}")]
    NotAHeader(String),
    /// A line of a token with roles that is not `role=SECRET`.
    #[error("a cluster token with roles has one `server=SECRET` or `worker=SECRET` per line")]
    NotARoleLine,
    /// A role other than server and worker.
    #[error("unknown role `{0}` in the cluster token: the roles are server and worker")]
    UnknownRole(String),
    /// A role given twice.
    #[error("the cluster token gives the {0} secret twice")]
    Repeated(&'static str),
    /// No secret for the role this process presents.
    #[error("the cluster token has no `{0}=` line, and a {0} presents its own secret")]
    NoSecretFor(&'static str),
}

/// Adds the cluster token to each request of a channel (nothing without one).
#[derive(Debug, Clone, Default)]
pub struct AttachToken(Option<AsciiMetadataValue>);

impl AttachToken {
    /// Attaches the secret `token` presents, when there is one.
    pub fn new(token: Option<ClusterToken>) -> Self {
        Self(token.and_then(|t| t.presented))
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, header.clone());
        }
        Ok(request)
    }
}

/// Refuses requests without one of the cluster's secrets, and records the roles
/// the one sent grants (lets everything through without a token).
#[derive(Debug, Clone, Default)]
pub struct RequireToken(Option<Arc<ClusterToken>>);

impl RequireToken {
    /// Requires `token`, when there is one.
    pub fn new(token: Option<ClusterToken>) -> Self {
        Self(token.map(Arc::new))
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        let sent = request.metadata().get(AUTHORIZATION).map(|v| v.as_bytes());
        match sent.map(|sent| expected.grants(sent)) {
            Some(Some(granted)) => {
                request.extensions_mut().insert(granted);
                Ok(request)
            }
            Some(None) => Err(Status::unauthenticated(
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

    fn granted(token: &ClusterToken, role: Role) -> Result<Granted, Status> {
        let mut require = RequireToken::new(Some(token.clone()));
        let sent = request_with_token(token.clone().presenting(role).unwrap());
        let passed = require.call(sent)?;
        Ok(*passed.extensions().get::<Granted>().unwrap())
    }

    fn request_with_token(token: ClusterToken) -> Request<()> {
        AttachToken::new(Some(token))
            .call(Request::new(()))
            .unwrap()
    }

    #[test]
    fn role_secrets_grant_their_role_only() {
        let both = ClusterToken::new("server=s-secret\nworker=w-secret\n").unwrap();
        assert!(both.has_roles());
        let server = granted(&both, Role::Server).unwrap();
        assert!(server.allows(Role::Server) && !server.allows(Role::Worker));
        let worker = granted(&both, Role::Worker).unwrap();
        assert!(worker.allows(Role::Worker) && !worker.allows(Role::Server));
        // A worker's file holds its own line only: it cannot present a server's.
        let worker_only = ClusterToken::new("worker=w-secret").unwrap();
        let error = worker_only.presenting(Role::Server).unwrap_err();
        assert!(error.to_string().contains("server="), "{error}");
    }

    #[test]
    fn one_token_grants_every_role() {
        let token = ClusterToken::new("shared").unwrap();
        assert!(!token.has_roles());
        // Base64 padding is part of a single token, not a role line.
        assert!(!ClusterToken::new("c2hhcmVk==").unwrap().has_roles());
        for role in [Role::Server, Role::Worker] {
            assert_eq!(granted(&token, role).unwrap(), Granted::ALL);
        }
    }

    #[test]
    fn a_role_secret_grants_its_role_alone() {
        for role in [Role::Server, Role::Worker] {
            let other = match role {
                Role::Server => Role::Worker,
                Role::Worker => Role::Server,
            };
            assert!(Granted::only(role).allows(role));
            assert!(!Granted::only(role).allows(other));
        }
    }

    #[test]
    fn malformed_role_lines_are_refused() {
        for (text, says) in [
            ("worker=a\nadmin=x", "unknown role"),
            ("server=a\nserver=b", "twice"),
            ("server=a\nworker", "per line"),
            ("worker=", "empty"),
        ] {
            let error = ClusterToken::new(text).unwrap_err();
            assert!(error.to_string().contains(says), "{text}: {error}");
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
