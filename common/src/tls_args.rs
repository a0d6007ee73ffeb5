//! [`TlsArgs`]: the `--tls-*` flags (and `PS_TLS_*` variables) every candle-ps
//! program takes, and [`TlsArgs::load`], which reads the files they name.
//!
//! TLS is on when `--tls-ca` is given: every process connects to something (a
//! server to its scheduler, a worker to its servers, `health` to its target), so
//! every process needs the CA that signed its peers. A process that serves also
//! needs `--tls-cert` and `--tls-key`; mutual TLS adds `--tls-client-ca` on the
//! serving side and `--tls-client-cert`/`--tls-client-key` on the connecting side.

use std::path::{Path, PathBuf};

use ps_proto::tls::{DEFAULT_SERVER_NAME, PemIdentity, TlsConfig};

/// TLS flags, flattened into each program's arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// CA certificate (PEM) that signed the servers this process connects to;
    /// turns TLS on for every server and channel of the process.
    #[arg(long, env = "PS_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Certificate (PEM) this process's servers present.
    #[arg(long, env = "PS_TLS_CERT", requires = "tls_key", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "PS_TLS_KEY", requires = "tls_cert", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: refuse clients without a certificate signed by this CA (PEM).
    #[arg(long, env = "PS_TLS_CLIENT_CA", global = true)]
    pub tls_client_ca: Option<PathBuf>,
    /// Mutual TLS: the certificate (PEM) this process's channels present.
    #[arg(
        long,
        env = "PS_TLS_CLIENT_CERT",
        requires = "tls_client_key",
        global = true
    )]
    pub tls_client_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-client-cert.
    #[arg(
        long,
        env = "PS_TLS_CLIENT_KEY",
        requires = "tls_client_cert",
        global = true
    )]
    pub tls_client_key: Option<PathBuf>,
    /// The name servers' certificates must carry (every certificate
    /// `ps-scheduler certs` writes carries the default).
    #[arg(long, env = "PS_TLS_SERVER_NAME", default_value = DEFAULT_SERVER_NAME, global = true)]
    pub tls_server_name: String,
}

/// Why the TLS flags could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsArgsError {
    /// A file named by a flag could not be read.
    #[error("cannot read {flag} {path}: {source}")]
    Read {
        /// The flag.
        flag: &'static str,
        /// Its file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A TLS flag other than `--tls-ca` was given without it.
    #[error("{flag} was given without --tls-ca: TLS needs the CA that signed this process's peers")]
    NoCa {
        /// The flag given.
        flag: &'static str,
    },
}

impl TlsArgs {
    /// The TLS settings the flags describe: `None` (plain TCP) when no flag is
    /// given.
    ///
    /// # Errors
    /// An unreadable file, or a TLS flag without `--tls-ca`.
    pub fn load(&self) -> Result<Option<TlsConfig>, TlsArgsError> {
        let Some(ca) = &self.tls_ca else {
            return match self.first_flag_given() {
                Some(flag) => Err(TlsArgsError::NoCa { flag }),
                None => Ok(None),
            };
        };
        let identity = pair(("--tls-cert", &self.tls_cert), ("--tls-key", &self.tls_key))?;
        let client_identity = pair(
            ("--tls-client-cert", &self.tls_client_cert),
            ("--tls-client-key", &self.tls_client_key),
        )?;
        let client_ca = match &self.tls_client_ca {
            Some(path) => Some(read("--tls-client-ca", path)?),
            None => None,
        };
        Ok(Some(TlsConfig {
            ca: read("--tls-ca", ca)?,
            identity,
            client_ca,
            client_identity,
            server_name: self.tls_server_name.clone(),
        }))
    }

    fn first_flag_given(&self) -> Option<&'static str> {
        [
            ("--tls-cert", &self.tls_cert),
            ("--tls-client-ca", &self.tls_client_ca),
            ("--tls-client-cert", &self.tls_client_cert),
        ]
        .into_iter()
        .find_map(|(flag, path)| path.as_ref().map(|_| flag))
    }
}

fn pair(
    (cert_flag, cert): (&'static str, &Option<PathBuf>),
    (key_flag, key): (&'static str, &Option<PathBuf>),
) -> Result<Option<PemIdentity>, TlsArgsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(PemIdentity {
            cert: read(cert_flag, cert)?,
            key: read(key_flag, key)?,
        })),
        _ => Ok(None),
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsArgsError> {
    std::fs::read(path).map_err(|source| TlsArgsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{CA_CERT_FILE, ClusterCerts, NODE_CERT_FILE, NODE_KEY_FILE};

    #[test]
    fn no_flags_mean_plain_tcp() {
        assert_eq!(TlsArgs::default().load().unwrap(), None);
    }

    #[test]
    fn the_files_written_by_certs_load() {
        let dir = tempfile::tempdir().unwrap();
        ClusterCerts::generate(&[], 1)
            .unwrap()
            .write(dir.path())
            .unwrap();
        let args = TlsArgs {
            tls_ca: Some(dir.path().join(CA_CERT_FILE)),
            tls_cert: Some(dir.path().join(NODE_CERT_FILE)),
            tls_key: Some(dir.path().join(NODE_KEY_FILE)),
            tls_server_name: DEFAULT_SERVER_NAME.into(),
            ..TlsArgs::default()
        };
        let tls = args.load().unwrap().unwrap();
        assert!(tls.identity.is_some() && tls.client_identity.is_none());
        assert!(tls.server().is_ok());
    }

    #[test]
    fn a_certificate_without_a_ca_is_refused() {
        let args = TlsArgs {
            tls_cert: Some("node.pem".into()),
            tls_key: Some("node-key.pem".into()),
            ..TlsArgs::default()
        };
        let error = args.load().unwrap_err().to_string();
        assert!(
            error.contains("--tls-cert") && error.contains("--tls-ca"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let args = TlsArgs {
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..TlsArgs::default()
        };
        let error = args.load().unwrap_err().to_string();
        assert!(error.contains("--tls-ca /nonexistent/ca.pem"), "{error}");
    }
}
