//! [`TlsFiles`]: certificates made for one benchmark run with `--tls`, and the
//! flags that hand them to the processes it starts.

use ps_common::certs::{CA_CERT_FILE, ClusterCerts, NODE_CERT_FILE, NODE_KEY_FILE};
use ps_proto::tls::TlsConfig;

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
}
