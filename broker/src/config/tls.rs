//! The `[tls]` table of a broker node's configuration: TLS (rustls, through
//! tonic) on the client port, and the certificate authority this node trusts
//! when it calls another member's client port (a follower passing a call on to
//! the leader). Paths are relative to the configuration file's directory.
//!
//! ```toml
//! [tls]
//! cert_file = "certs/n0.pem"      # PEM chain; its SANs name the addresses clients dial
//! key_file = "certs/n0-key.pem"   # PEM private key (PKCS#8, SEC1 or PKCS#1)
//! ca_file = "certs/ca.pem"        # PEM CA certificates the members' certificates chain to
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The `[tls]` table: all three keys, or none.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// This node's certificate chain, PEM.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM.
    pub key_file: Option<PathBuf>,
    /// The CA certificates, PEM, that other members' client ports are checked
    /// against.
    pub ca_file: Option<PathBuf>,
}

/// The client port's TLS material, read at start.
#[derive(Clone)]
pub struct ClientTls {
    /// This node's certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Its private key, PEM (`Debug` leaves it out).
    pub key_pem: Vec<u8>,
    /// The CA certificates other members' client ports are checked against, PEM.
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .finish()
    }
}

/// True when `pem` holds a PEM block whose label ends with `kind`
/// (`CERTIFICATE`; `PRIVATE KEY` also matches `EC PRIVATE KEY` and `RSA
/// PRIVATE KEY`), wherever it stands (a key file may start with `EC
/// PARAMETERS`, a combined file with the other kind).
fn holds_block(pem: &[u8], kind: &str) -> bool {
    let Ok(text) = std::str::from_utf8(pem) else {
        return false;
    };
    text.split("-----BEGIN ")
        .skip(1)
        .filter_map(|rest| rest.split_once("-----").map(|(label, _)| label))
        .any(|label| label.ends_with(kind))
}

impl TlsConfig {
    /// Makes relative paths relative to `dir` (the configuration file's).
    pub fn resolve(&mut self, dir: &Path) {
        for p in [&mut self.cert_file, &mut self.key_file, &mut self.ca_file]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }

    /// The files read, or None when the table is empty. Error: a key given
    /// without the others, a file that cannot be read, or one that holds no
    /// PEM block of the right kind, named by its key.
    pub fn load(&self) -> Result<Option<ClientTls>, String> {
        let (cert, key, ca) = match (&self.cert_file, &self.key_file, &self.ca_file) {
            (None, None, None) => return Ok(None),
            (Some(c), Some(k), Some(a)) => (c, k, a),
            _ => return Err("tls.cert_file, tls.key_file and tls.ca_file go together".into()),
        };
        let read = |key: &str, path: &Path, kind: &str| -> Result<Vec<u8>, String> {
            let bytes =
                std::fs::read(path).map_err(|e| format!("tls.{key} {}: {e}", path.display()))?;
            if holds_block(&bytes, kind) {
                Ok(bytes)
            } else {
                Err(format!("tls.{key} {} holds no PEM {kind}", path.display()))
            }
        };
        Ok(Some(ClientTls {
            cert_pem: read("cert_file", cert, "CERTIFICATE")?,
            key_pem: read("key_file", key, "PRIVATE KEY")?,
            ca_pem: read("ca_file", ca, "CERTIFICATE")?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_files_go_together_and_must_hold_their_pem_kind() {
        let dir = tempfile::tempdir().unwrap();
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
        std::fs::write(dir.path().join("c.pem"), cert).unwrap();
        std::fs::write(dir.path().join("k.pem"), key).unwrap();
        let mut t = TlsConfig {
            cert_file: Some("c.pem".into()),
            key_file: Some("k.pem".into()),
            ca_file: Some("c.pem".into()),
        };
        t.resolve(dir.path());
        let loaded = t.load().unwrap().unwrap();
        assert_eq!(loaded.key_pem, key.as_bytes());
        // A key after EC parameters (openssl ecparam -genkey) is found.
        let ec = "-----BEGIN EC PARAMETERS-----\nBggq\n-----END EC PARAMETERS-----\n\
                  -----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n";
        std::fs::write(dir.path().join("ec.pem"), ec).unwrap();
        let mut ec_key = t.clone();
        ec_key.key_file = Some(dir.path().join("ec.pem"));
        assert!(ec_key.load().is_ok());
        assert!(!format!("{loaded:?}").contains("MIIB"));
        let mut swapped = t.clone();
        swapped.key_file = t.cert_file.clone();
        assert!(swapped.load().unwrap_err().contains("tls.key_file"));
        let mut missing = t.clone();
        missing.ca_file = None;
        assert!(missing.load().unwrap_err().contains("go together"));
        let mut absent = t;
        absent.cert_file = Some(dir.path().join("nope.pem"));
        assert!(absent.load().unwrap_err().contains("tls.cert_file"));
        assert!(TlsConfig::default().load().unwrap().is_none());
    }
}
