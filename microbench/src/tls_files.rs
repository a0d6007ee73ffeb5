//! [`TlsFiles`]: certificates made for one benchmark run with `--tls`, the flags
//! that hand them to the processes it starts, and the rustls settings of the raw
//! TLS baseline, with the cipher preference of the gRPC path.

use std::sync::Arc;

use anyhow::Context;
use ps_common::certs::{CA_CERT_FILE, ClusterCerts, NODE_CERT_FILE, NODE_KEY_FILE};
use ps_proto::tls::{TlsConfig, install_cipher_preference};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a `--tls` run, in a folder that lives as long as the run.
pub struct TlsFiles {
    dir: tempfile::TempDir,
    /// The client and server settings that use them.
    pub config: TlsConfig,
}

impl TlsFiles {
    /// A CA and a node certificate for loopback, written to a new folder.
    ///
    /// # Errors
    /// When the certificates cannot be made or written.
    pub fn new() -> anyhow::Result<Self> {
        let certs = ClusterCerts::generate(&[], 1)?;
        let dir = tempfile::tempdir()?;
        certs.write(dir.path())?;
        Ok(Self {
            dir,
            config: certs.tls_config(false),
        })
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    /// What a process that only connects needs.
    pub fn client_args(&self) -> Vec<String> {
        vec!["--tls-ca".into(), self.path(CA_CERT_FILE)]
    }

    /// What a server needs.
    pub fn server_args(&self) -> Vec<String> {
        let mut args = self.client_args();
        args.extend(["--tls-cert".into(), self.path(NODE_CERT_FILE)]);
        args.extend(["--tls-key".into(), self.path(NODE_KEY_FILE)]);
        args
    }

    /// The raw TLS baseline's server settings: this run's node certificate.
    ///
    /// # Errors
    /// When the certificate or key does not parse.
    pub fn baseline_server(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        install_cipher_preference();
        let identity = self
            .config
            .identity
            .as_ref()
            .context("a node certificate")?;
        let chain = CertificateDer::pem_slice_iter(&identity.cert)
            .collect::<Result<Vec<_>, _>>()
            .context("the node certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&identity.key).context("the node key")?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Ok(Arc::new(config))
    }

    /// The raw TLS baseline's client settings: this run's CA as the only root.
    ///
    /// # Errors
    /// When the CA does not parse.
    pub fn baseline_client(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        install_cipher_preference();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.config.ca) {
            roots.add(cert.context("the CA certificate")?)?;
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// The name the node certificate carries.
    pub fn server_name(&self) -> &str {
        &self.config.server_name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{BaselineServer, TcpPeer};
    use ps_proto::tls::PREFERRED_CIPHER_SUITE;

    #[tokio::test]
    async fn the_raw_tls_baseline_round_trips_with_the_preferred_suite() {
        let files = TlsFiles::new().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = BaselineServer::start_tls(listener, files.baseline_server().unwrap()).unwrap();
        let addr = server.addr().to_string();
        let client = files.baseline_client().unwrap();
        let mut peer = TcpPeer::connect_tls(&addr, client, files.server_name())
            .await
            .unwrap();
        assert_eq!(peer.cipher_suite(), Some(PREFERRED_CIPHER_SUITE));
        let acked = tokio::task::spawn_blocking(move || {
            let large = vec![9u8; 3 << 20];
            (peer.sink(&[1; 100]).unwrap(), peer.sink(&large).unwrap())
        })
        .await
        .unwrap();
        assert_eq!(acked, (100, 3 << 20));
    }

    #[tokio::test]
    async fn a_grpc_channel_offers_the_preferred_suite_first() {
        let files = TlsFiles::new().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config = files.baseline_server().unwrap();
        // The server takes the client's first choice, so what it agrees on is
        // what tonic's channel offered first.
        let agreed = tokio::task::spawn_blocking(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut session = rustls::ServerConnection::new(config).unwrap();
            while session.is_handshaking() {
                session.complete_io(&mut socket).unwrap();
            }
            session.negotiated_cipher_suite().map(|s| s.suite())
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(files.config.client())
            .unwrap()
            .connect()
            .await;
        let agreed = tokio::time::timeout(std::time::Duration::from_secs(30), agreed)
            .await
            .expect("the handshake ends")
            .unwrap();
        assert_eq!(agreed, Some(PREFERRED_CIPHER_SUITE), "channel: {channel:?}");
    }

    #[tokio::test]
    async fn a_plain_client_gets_nothing_from_the_raw_tls_baseline() {
        let files = TlsFiles::new().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = BaselineServer::start_tls(listener, files.baseline_server().unwrap()).unwrap();
        let mut peer = TcpPeer::connect(&server.addr().to_string()).await.unwrap();
        let answer = tokio::task::spawn_blocking(move || peer.sink(&[1; 100]))
            .await
            .unwrap();
        assert!(answer.is_err(), "plain TCP to a TLS port: {answer:?}");
    }
}
