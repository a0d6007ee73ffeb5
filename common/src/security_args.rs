//! [`SecurityArgs`]: the `--tls-*` flags (and `PS_TLS_*` variables) and the
//! cluster token every candle-ps program takes, and [`SecurityArgs::apply`],
//! which reads what they name into a `TransportConfig`.
//!
//! The token comes from `--token-file` (`PS_TOKEN_FILE`) or the `PS_TOKEN`
//! variable, never from a command-line argument, which `ps` would show to every
//! user of the machine. It is one secret for every process, or `server=` and
//! `worker=` lines that give each role its own (see `ps_proto::auth`).
//!
//! TLS is on when `--tls-ca` is given: every process connects to something (a
//! server to its scheduler, a worker to its servers, `health` to its target), so
//! every process needs the CA that signed its peers. A process that serves also
//! needs `--tls-cert` and `--tls-key`; mutual TLS adds `--tls-client-ca` on the
//! serving side and `--tls-client-cert`/`--tls-client-key` on the connecting side.

use std::path::{Path, PathBuf};

use ps_proto::auth::{ClusterToken, Role, TokenError};
use ps_proto::tls::{DEFAULT_SERVER_NAME, PemIdentity, TlsConfig};
use ps_proto::transport::TransportConfig;

/// The variable a token may be given in.
pub const TOKEN_VARIABLE: &str = "PS_TOKEN";

/// TLS and token flags, flattened into each program's arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecurityArgs {
    /// A file holding the cluster token every request must carry (or set
    /// PS_TOKEN): one secret, or `server=SECRET` and `worker=SECRET` lines
    /// (servers and the scheduler hold both, workers their own); without
    /// either, requests need none.
    #[arg(long, env = "PS_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
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

/// Why the TLS or token flags could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityArgsError {
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
    /// The token is unusable.
    #[error("{source_name}: {reason}")]
    Token {
        /// Where it came from.
        source_name: String,
        /// What is wrong.
        reason: TokenError,
    },
    /// A TLS flag other than `--tls-ca` was given without it.
    #[error("{flag} was given without --tls-ca: TLS needs the CA that signed this process's peers")]
    NoCa {
        /// The flag given.
        flag: &'static str,
    },
}

impl SecurityArgs {
    /// Sets `transport`'s TLS and token from the flags and `PS_TOKEN`, for a
    /// process that presents the secret of `role` when the token has roles.
    ///
    /// # Errors
    /// As [`SecurityArgs::tls`] and [`SecurityArgs::token`].
    pub fn apply(
        &self,
        role: Role,
        transport: &mut TransportConfig,
    ) -> Result<(), SecurityArgsError> {
        transport.tls = self.tls()?;
        transport.token = self.token(role, std::env::var(TOKEN_VARIABLE).ok())?;
        Ok(())
    }

    /// The cluster token: `--token-file`'s contents, else `variable` (the value
    /// of `PS_TOKEN`), else none; presenting the secret of `role`.
    ///
    /// # Errors
    /// An unreadable file, an empty or malformed token, or one with roles but
    /// none for `role`.
    pub fn token(
        &self,
        role: Role,
        variable: Option<String>,
    ) -> Result<Option<ClusterToken>, SecurityArgsError> {
        let (text, source_name) = match (&self.token_file, variable) {
            (Some(path), _) => {
                let bytes = read("--token-file", path)?;
                let text = String::from_utf8(bytes).unwrap_or_default();
                (text, format!("--token-file {}", path.display()))
            }
            (None, Some(text)) => (text, TOKEN_VARIABLE.to_string()),
            (None, None) => return Ok(None),
        };
        ClusterToken::new(&text)
            .and_then(|token| token.presenting(role))
            .map(Some)
            .map_err(|reason| SecurityArgsError::Token {
                source_name,
                reason,
            })
    }

    /// The TLS settings the flags describe: `None` (plain TCP) when no flag is
    /// given.
    ///
    /// # Errors
    /// An unreadable file, or a TLS flag without `--tls-ca`.
    pub fn tls(&self) -> Result<Option<TlsConfig>, SecurityArgsError> {
        let Some(ca) = &self.tls_ca else {
            return match self.first_flag_given() {
                Some(flag) => Err(SecurityArgsError::NoCa { flag }),
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
) -> Result<Option<PemIdentity>, SecurityArgsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(PemIdentity {
            cert: read(cert_flag, cert)?,
            key: read(key_flag, key)?,
        })),
        _ => Ok(None),
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, SecurityArgsError> {
    std::fs::read(path).map_err(|source| SecurityArgsError::Read {
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
        assert_eq!(SecurityArgs::default().tls().unwrap(), None);
    }

    #[test]
    fn the_files_written_by_certs_load() {
        let dir = tempfile::tempdir().unwrap();
        ClusterCerts::generate(&[], 1)
            .unwrap()
            .write(dir.path())
            .unwrap();
        let args = SecurityArgs {
            tls_ca: Some(dir.path().join(CA_CERT_FILE)),
            tls_cert: Some(dir.path().join(NODE_CERT_FILE)),
            tls_key: Some(dir.path().join(NODE_KEY_FILE)),
            tls_server_name: DEFAULT_SERVER_NAME.into(),
            ..SecurityArgs::default()
        };
        let tls = args.tls().unwrap().unwrap();
        assert!(tls.identity.is_some() && tls.client_identity.is_none());
        assert!(tls.server().is_ok());
    }

    #[test]
    fn a_certificate_without_a_ca_is_refused() {
        let args = SecurityArgs {
            tls_cert: Some("node.pem".into()),
            tls_key: Some("node-key.pem".into()),
            ..SecurityArgs::default()
        };
        let error = args.tls().unwrap_err().to_string();
        assert!(
            error.contains("--tls-cert") && error.contains("--tls-ca"),
            "{error}"
        );
    }

    #[test]
    fn the_token_comes_from_its_file_before_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let args = SecurityArgs {
            token_file: Some(file),
            ..SecurityArgs::default()
        };
        let expected = ClusterToken::new("from-file").unwrap();
        assert_eq!(
            args.token(Role::Worker, Some("from-env".into())).unwrap(),
            Some(expected)
        );
        let without_file = SecurityArgs::default();
        let from_env = without_file
            .token(Role::Worker, Some("from-env".into()))
            .unwrap();
        assert_eq!(from_env, Some(ClusterToken::new("from-env").unwrap()));
        assert_eq!(without_file.token(Role::Worker, None).unwrap(), None);
        let empty = without_file
            .token(Role::Worker, Some(" ".into()))
            .unwrap_err()
            .to_string();
        assert!(
            empty.contains("PS_TOKEN") && empty.contains("empty"),
            "{empty}"
        );
    }

    #[test]
    fn a_worker_token_file_cannot_start_a_server() {
        let args = SecurityArgs::default();
        let worker_line = Some("worker=w".to_string());
        assert!(args.token(Role::Worker, worker_line.clone()).is_ok());
        let error = args
            .token(Role::Server, worker_line)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("PS_TOKEN") && error.contains("server="),
            "{error}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let args = SecurityArgs {
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..SecurityArgs::default()
        };
        let error = args.tls().unwrap_err().to_string();
        assert!(error.contains("--tls-ca /nonexistent/ca.pem"), "{error}");
    }
}
