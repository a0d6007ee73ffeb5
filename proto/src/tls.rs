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
//!
//! Every connection prefers AES-128-GCM (see [`install_cipher_preference`]).

use std::sync::Once;

use rustls::CipherSuite;
use rustls::crypto::CryptoProvider;
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
        install_cipher_preference();
        let identity = self.identity.as_ref().ok_or(TlsError::NoIdentity)?;
        let mut config = ServerTlsConfig::new().identity(identity.to_tonic());
        if let Some(client_ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(client_ca));
        }
        Ok(config)
    }

    /// tonic's settings for a channel that trusts [`TlsConfig::ca`].
    pub fn client(&self) -> ClientTlsConfig {
        install_cipher_preference();
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .domain_name(self.server_name.clone());
        if let Some(identity) = &self.client_identity {
            config = config.identity(identity.to_tonic());
        }
        config
    }
}

/// The suite every connection offers first: AES-128-GCM needs 10 AES rounds per
/// block against AES-256-GCM's 14, and the cipher is the largest single cost of a
/// TLS stream on the server (docs/security.md). Both are TLS 1.3's standard AEADs.
pub const PREFERRED_CIPHER_SUITE: CipherSuite = CipherSuite::TLS13_AES_128_GCM_SHA256;

/// ring's provider with [`PREFERRED_CIPHER_SUITE`] moved to the front; the other
/// suites keep their order.
pub fn preferred_provider() -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != PREFERRED_CIPHER_SUITE);
    provider
}

/// Makes [`preferred_provider`] the process's rustls provider, which tonic's TLS
/// settings use for every server and channel (a client offers its suites in
/// order and the server takes the first it supports). [`TlsConfig::server`] and
/// [`TlsConfig::client`] call it, so a process never needs to; a provider the
/// process installed earlier stays.
pub fn install_cipher_preference() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // An error means a provider is already installed, which is the caller's choice.
        let _ = preferred_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_suite_comes_first_and_no_suite_is_lost() {
        let provider = preferred_provider();
        let default = rustls::crypto::ring::default_provider();
        assert_eq!(provider.cipher_suites[0].suite(), PREFERRED_CIPHER_SUITE);
        assert_eq!(provider.cipher_suites.len(), default.cipher_suites.len());
        assert!(
            default.cipher_suites[0].suite() != PREFERRED_CIPHER_SUITE,
            "ring's own order would already pick it; this module would be moot"
        );
    }

    #[test]
    fn building_a_tonic_config_installs_the_preference() {
        let config = TlsConfig {
            ca: Vec::new(),
            identity: None,
            client_ca: None,
            client_identity: None,
            server_name: DEFAULT_SERVER_NAME.into(),
        };
        let _ = config.client();
        let installed = CryptoProvider::get_default().expect("a process provider");
        assert_eq!(installed.cipher_suites[0].suite(), PREFERRED_CIPHER_SUITE);
    }
}
