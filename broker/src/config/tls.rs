//! The `[tls]` table of a broker node's configuration ([`ledgermq_tls::TlsFiles`],
//! all three keys or none, paths relative to the configuration file): TLS
//! (rustls, through tonic) on the client port, the CA this node checks other
//! members' client ports against when it passes a call on, and mutual TLS on
//! the Raft peer port with the same certificate, key and CA.
//!
//! ```toml
//! [tls]
//! cert_file = "certs/n0.pem"      # PEM chain; its SANs name the addresses clients and peers dial
//! key_file = "certs/n0-key.pem"   # PEM private key (PKCS#8, SEC1 or PKCS#1)
//! ca_file = "certs/ca.pem"        # PEM CA certificates the members' certificates chain to
//! ```

/// The `[tls]` table.
pub type TlsConfig = ledgermq_tls::TlsFiles;

/// The node's TLS material, read at start.
pub type ClientTls = ledgermq_tls::TlsMaterial;
