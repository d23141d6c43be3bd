//! The `[tls]` table of a node's configuration file (a broker node's and a name
//! server's): where its certificate, key and CA are, relative to the file.
//!
//! ```toml
//! [tls]
//! cert_file = "certs/n0.pem"      # PEM chain; its SANs name the addresses others dial
//! key_file = "certs/n0-key.pem"   # PEM private key (PKCS#8, SEC1 or PKCS#1)
//! ca_file = "certs/ca.pem"        # PEM CA certificates the members' certificates chain to
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TlsMaterial;

/// The `[tls]` table.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// This node's certificate chain, PEM.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM.
    pub key_file: Option<PathBuf>,
    /// The CA certificates, PEM, the other end is checked against.
    pub ca_file: Option<PathBuf>,
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

impl TlsFiles {
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

    /// The files read and checked ([`TlsMaterial::check`]), or None when the
    /// table is empty. `need_ca`: `ca_file` goes with the other two (a node
    /// that checks the other end); without it, `ca_file` is optional and
    /// `ca_pem` empty when it is not given (a server that checks no client).
    /// Error, naming the key: a key given without the others, a file that
    /// cannot be read or holds no PEM block of the right kind, a certificate
    /// rustls cannot parse or a key that is not the certificate's.
    pub fn load(&self, need_ca: bool) -> Result<Option<TlsMaterial>, String> {
        let (cert, key) = match (&self.cert_file, &self.key_file, &self.ca_file) {
            (None, None, None) => return Ok(None),
            (Some(c), Some(k), Some(_)) => (c, k),
            (Some(c), Some(k), None) if !need_ca => (c, k),
            _ if need_ca => {
                return Err("tls.cert_file, tls.key_file and tls.ca_file go together".into())
            }
            _ => return Err("tls.cert_file and tls.key_file go together".into()),
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
        let material = TlsMaterial {
            cert_pem: read("cert_file", cert, "CERTIFICATE")?,
            key_pem: read("key_file", key, "PRIVATE KEY")?,
            ca_pem: match &self.ca_file {
                Some(ca) => read("ca_file", ca, "CERTIFICATE")?,
                None => Vec::new(),
            },
        };
        // A certificate that does not parse, or a key that is not its own,
        // stops the start here rather than failing every handshake later.
        material.check().map_err(|e| format!("tls: {e}"))?;
        Ok(Some(material))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_go_together_and_must_hold_their_pem_kind() {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let dir = tempfile::tempdir().unwrap();
        for f in ["member.pem", "member-key.pem", "ca.pem", "rogue-key.pem"] {
            std::fs::copy(testdata.join(f), dir.path().join(f)).unwrap();
        }
        let mut t = TlsFiles {
            cert_file: Some("member.pem".into()),
            key_file: Some("member-key.pem".into()),
            ca_file: Some("ca.pem".into()),
        };
        t.resolve(dir.path());
        let loaded = t.load(true).unwrap().unwrap();
        assert_eq!(
            loaded.key_pem,
            std::fs::read(testdata.join("member-key.pem")).unwrap()
        );
        assert!(!format!("{loaded:?}").contains("PRIVATE"));
        // A key after EC parameters (openssl ecparam -genkey) is found.
        let key = std::fs::read_to_string(testdata.join("member-key.pem")).unwrap();
        let ec = format!(
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{key}"
        );
        std::fs::write(dir.path().join("ec.pem"), ec).unwrap();
        let mut ec_key = t.clone();
        ec_key.key_file = Some(dir.path().join("ec.pem"));
        assert!(ec_key.load(true).is_ok(), "{:?}", ec_key.load(true));
        let mut swapped = t.clone();
        swapped.key_file = t.cert_file.clone();
        assert!(swapped.load(true).unwrap_err().contains("tls.key_file"));
        let mut not_its_key = t.clone();
        not_its_key.key_file = Some(dir.path().join("rogue-key.pem"));
        assert!(not_its_key.load(true).unwrap_err().starts_with("tls: "));
        let mut no_ca = t.clone();
        no_ca.ca_file = None;
        assert!(no_ca.load(true).unwrap_err().contains("go together"));
        assert!(no_ca.load(false).unwrap().unwrap().ca_pem.is_empty());
        let mut absent = t;
        absent.cert_file = Some(dir.path().join("nope.pem"));
        assert!(absent.load(true).unwrap_err().contains("tls.cert_file"));
        assert!(TlsFiles::default().load(true).unwrap().is_none());
    }
}
