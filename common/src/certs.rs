//! [`ClusterCerts`]: a cluster's own CA and the certificate its processes serve
//! and connect with, made with rcgen so that nobody needs `openssl` by hand.
//!
//! The node certificate names [`DEFAULT_SERVER_NAME`] (what every channel checks,
//! see `ps_proto::tls`), `localhost` and `127.0.0.1`, plus any names asked for,
//! and is good for both server and client authentication, so one certificate
//! serves a process's servers and its mutual-TLS channels.

use std::path::{Path, PathBuf};

use ps_proto::tls::{DEFAULT_SERVER_NAME, PemIdentity, TlsConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// The files [`ClusterCerts::write`] creates, as the `--tls-*` flags name them.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key: keep it off the cluster's machines.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The node certificate, for `--tls-cert` and `--tls-client-cert`.
pub const NODE_CERT_FILE: &str = "node.pem";
/// The node key, for `--tls-key` and `--tls-client-key`.
pub const NODE_KEY_FILE: &str = "node-key.pem";
/// A cluster token, for `--token-file`, when one is asked for.
pub const TOKEN_FILE: &str = "token";
/// The workers' own line of a token with roles, for their `--token-file`.
pub const WORKER_TOKEN_FILE: &str = "worker-token";

/// A new random cluster token: 32 bytes from the system's random source, in hex.
///
/// # Errors
/// When the random source cannot be read.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(to_hex(&bytes))
}

/// `bytes` in lower-case hex, two digits each.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `token` to `dir/token`, readable by its owner only.
///
/// # Errors
/// Any I/O error.
pub fn write_token(dir: &Path, token: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(TOKEN_FILE);
    write_file(&path, format!("{token}\n").as_bytes(), true)?;
    Ok(path)
}

/// Writes a token with roles: `dir/token` with a new random `server=` and
/// `worker=` secret (for the scheduler and the servers) and `dir/worker-token`
/// with the worker's line only (for the workers), both readable by their owner
/// only.
///
/// # Errors
/// When the random source cannot be read, or any I/O error.
pub fn write_role_tokens(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let worker_line = format!("worker={}\n", random_token()?);
    let both = format!("server={}\n{worker_line}", random_token()?);
    let (token, worker_token) = (dir.join(TOKEN_FILE), dir.join(WORKER_TOKEN_FILE));
    write_file(&token, both.as_bytes(), true)?;
    write_file(&worker_token, worker_line.as_bytes(), true)?;
    Ok(vec![token, worker_token])
}

/// A CA and a node certificate signed by it, all PEM.
#[derive(Clone)]
pub struct ClusterCerts {
    /// The CA certificate.
    pub ca_cert: String,
    /// The CA's private key.
    pub ca_key: String,
    /// The node certificate.
    pub node_cert: String,
    /// The node certificate's private key.
    pub node_key: String,
}

impl std::fmt::Debug for ClusterCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCerts").finish_non_exhaustive()
    }
}

impl ClusterCerts {
    /// A new CA and a node certificate for the default names and `extra_names`
    /// (host names or IP addresses), both valid for `days` days from an hour ago.
    ///
    /// # Errors
    /// A name that is not a valid DNS name or IP address.
    pub fn generate(extra_names: &[String], days: u32) -> Result<Self, rcgen::Error> {
        let not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        let not_after = OffsetDateTime::now_utc() + Duration::days(i64::from(days));

        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "candle-ps cluster CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        (ca.not_before, ca.not_after) = (not_before, not_after);
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;

        let mut names = vec![
            DEFAULT_SERVER_NAME.to_string(),
            "localhost".into(),
            "127.0.0.1".into(),
        ];
        for name in extra_names {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let mut node = CertificateParams::new(names)?;
        node.distinguished_name
            .push(DnType::CommonName, DEFAULT_SERVER_NAME);
        node.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        node.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        node.use_authority_key_identifier_extension = true;
        (node.not_before, node.not_after) = (not_before, not_after);
        let node_key = KeyPair::generate()?;
        let issuer = Issuer::new(ca, &ca_key);
        let node_cert = node.signed_by(&node_key, &issuer)?;

        Ok(Self {
            ca_cert: ca_cert.pem(),
            ca_key: ca_key.serialize_pem(),
            node_cert: node_cert.pem(),
            node_key: node_key.serialize_pem(),
        })
    }

    /// Writes the four files into `dir` (created if missing); the keys are
    /// readable by their owner only. Returns the paths written.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn write(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let files = [
            (CA_CERT_FILE, &self.ca_cert, false),
            (CA_KEY_FILE, &self.ca_key, true),
            (NODE_CERT_FILE, &self.node_cert, false),
            (NODE_KEY_FILE, &self.node_key, true),
        ];
        let mut written = Vec::new();
        for (name, pem, secret) in files {
            let path = dir.join(name);
            write_file(&path, pem.as_bytes(), secret)?;
            written.push(path);
        }
        Ok(written)
    }

    /// TLS for a process of this cluster: trusts the CA, serves with the node
    /// certificate and, with `mutual`, asks clients for one and presents it.
    pub fn tls_config(&self, mutual: bool) -> TlsConfig {
        let node = PemIdentity {
            cert: self.node_cert.clone().into_bytes(),
            key: self.node_key.clone().into_bytes(),
        };
        TlsConfig {
            ca: self.ca_cert.clone().into_bytes(),
            identity: Some(node.clone()),
            client_ca: mutual.then(|| self.ca_cert.clone().into_bytes()),
            client_identity: mutual.then_some(node),
            server_name: DEFAULT_SERVER_NAME.to_string(),
        }
    }
}

#[cfg(unix)]
fn write_file(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(not(unix))]
fn write_file(path: &Path, bytes: &[u8], _secret: bool) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_and_a_node_certificate_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let certs = ClusterCerts::generate(&["server-1".into()], 30).unwrap();
        let written = certs.write(dir.path()).unwrap();
        assert_eq!(written.len(), 4);
        for path in &written {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with("-----BEGIN "), "{}", path.display());
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |name| {
                let meta = std::fs::metadata(dir.path().join(name)).unwrap();
                meta.permissions().mode() & 0o777
            };
            assert_eq!(mode(NODE_KEY_FILE), 0o600);
            assert_eq!(mode(CA_KEY_FILE), 0o600);
        }
    }

    #[test]
    fn tokens_are_random_and_written_for_the_owner_only() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let dir = tempfile::tempdir().unwrap();
        let path = write_token(dir.path(), &a).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), a);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn role_tokens_give_the_scheduler_both_secrets_and_workers_theirs() {
        use ps_proto::auth::{ClusterToken, Role};
        let dir = tempfile::tempdir().unwrap();
        let written = write_role_tokens(dir.path()).unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(written.len(), 2);
        let both = ClusterToken::new(&read(TOKEN_FILE)).unwrap();
        assert!(both.has_roles());
        assert!(both.clone().presenting(Role::Server).is_ok());
        let worker = ClusterToken::new(&read(WORKER_TOKEN_FILE)).unwrap();
        assert!(worker.clone().presenting(Role::Worker).is_ok());
        assert!(worker.presenting(Role::Server).is_err());
        assert!(read(TOKEN_FILE).contains(read(WORKER_TOKEN_FILE).trim()));
    }

    #[test]
    fn a_name_that_is_not_a_host_name_is_refused() {
        assert!(ClusterCerts::generate(&["bäd-nöme".into()], 30).is_err());
    }
}
