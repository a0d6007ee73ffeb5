//! TLS for every candle-ps server and channel, through tonic's rustls support (no
//! OpenSSL): [`TlsConfig`] holds the PEM material a process was given and turns
//! it into tonic's server and client settings.
//!
//! Every channel checks the server's certificate against the cluster's CA and
//! against one name, [`DEFAULT_SERVER_NAME`] unless told otherwise, rather than
//! against the address it dialled: servers advertise addresses (container
//! hostnames, pod IPs) that nobody can know when the certificates are made, and
//! a certificate signed by the cluster's own CA for the cluster's name is what
//! makes a peer a member.

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The name every certificate `ps-scheduler certs` writes carries, and the name
/// channels check by default.
pub const DEFAULT_SERVER_NAME: &str = "candle-ps";

/// A certificate chain and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct PemIdentity {
    /// The certificate chain, leaf first.
    pub cert: Vec<u8>,
    /// The private key.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for PemIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemIdentity")
            .field("cert_bytes", &self.cert.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

impl PemIdentity {
    fn to_tonic(&self) -> Identity {
        Identity::from_pem(&self.cert, &self.key)
    }
}

/// The TLS material of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// CA certificates (PEM) that the servers this process connects to must be
    /// signed by.
    pub ca: Vec<u8>,
    /// The certificate this process's servers present; a process that serves
    /// nothing needs none.
    pub identity: Option<PemIdentity>,
    /// Mutual TLS: this process's servers refuse clients without a certificate
    /// signed by this CA (PEM).
    pub client_ca: Option<Vec<u8>>,
    /// Mutual TLS: the certificate this process's channels present.
    pub client_identity: Option<PemIdentity>,
    /// The name servers' certificates must carry.
    pub server_name: String,
}

/// Why a TLS server could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A process serving over TLS was given no certificate.
    #[error("serving over TLS needs a certificate and key (--tls-cert and --tls-key)")]
    NoIdentity,
    /// tonic refused the material.
    #[error("TLS setup failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl TlsConfig {
    /// tonic's settings for a server presenting [`TlsConfig::identity`].
    ///
    /// # Errors
    /// `NoIdentity` when there is no certificate to present.
    pub fn server(&self) -> Result<ServerTlsConfig, TlsError> {
        let identity = self.identity.as_ref().ok_or(TlsError::NoIdentity)?;
        let mut config = ServerTlsConfig::new().identity(identity.to_tonic());
        if let Some(client_ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(client_ca));
        }
        Ok(config)
    }

    /// tonic's settings for a channel that trusts [`TlsConfig::ca`].
    pub fn client(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .domain_name(self.server_name.clone());
        if let Some(identity) = &self.client_identity {
            config = config.identity(identity.to_tonic());
        }
        config
    }
}
