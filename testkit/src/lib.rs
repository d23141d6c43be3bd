//! One kit for LedgerMQ's harnesses (the integration tests of every crate, the
//! Jepsen harness, the benchmarks): it links only the generated protocols
//! ([`ledgermq_proto`]), never the broker, the Raft node or the store.
//!
//! - [`ports`]: free loopback ports and waiting for a listener.
//! - [`bins`]: where the workspace's binaries (`mqbroker`, `mqnamesrv`, ...) are.
//! - [`broker_toml`]: a broker node's `mqbroker -c FILE` configuration, written
//!   through one type instead of by hand in every harness.
//! - [`cluster`]: a local cluster of real processes on loopback.
#![deny(missing_docs)]

pub mod bins;
pub mod broker_toml;
pub mod cluster;
pub mod ports;

pub use bins::bin;
pub use broker_toml::{AuthToml, BrokerToml, UserToml};
pub use ports::{free_port, wait_listening};

/// Failures of the kit's helpers.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// A workspace binary was not found in any of the directories searched.
    #[error("binary {name} not found in {searched:?}: run `cargo build --bins` (add --release for release builds) first")]
    BinaryNotFound {
        /// The binary's name.
        name: String,
        /// The directories searched, in order.
        searched: Vec<std::path::PathBuf>,
    },
    /// Nothing listened on an address before the deadline.
    #[error("nothing listens on {addr} after {waited_ms} ms")]
    NotListening {
        /// `host:port`.
        addr: String,
        /// How long the kit waited.
        waited_ms: u128,
    },
    /// A broker group had no leader the name server knew of before the deadline.
    #[error("group {group} has no leader after {waited_ms} ms")]
    NoLeader {
        /// The broker group.
        group: String,
        /// How long the kit waited.
        waited_ms: u128,
    },
    /// `mqadmin` exited with a failure.
    #[error("mqadmin {args:?} failed: {output}")]
    Admin {
        /// Its arguments.
        args: Vec<String>,
        /// Its standard output and error.
        output: String,
    },
    /// A configuration file could not be read, parsed or written.
    #[error("configuration {path}: {reason}")]
    Config {
        /// The file.
        path: std::path::PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Starting a process or a file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What the kit was doing.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl KitError {
    /// Wraps an I/O error with what the kit was doing.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| KitError::Io { what, source }
    }
}
