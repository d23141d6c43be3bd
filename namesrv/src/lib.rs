//! LedgerMQ's name server (RocketMQ's NameServer): broker nodes register and
//! heartbeat to every name server; name servers never talk to each other; routes
//! (topic → broker groups with each group's current leader) are derived from what the
//! nodes last said. Restarting a name server loses nothing that matters: the next
//! heartbeats repopulate it.
//!
//! - [`registry`]: the registry and route derivation (no I/O).
//! - [`server`]: the gRPC service, the expiry scan, `serve` (both protocols
//!   on one port).
//! - [`remoting`]: the 4.x remoting protocol's requests, answered from the
//!   registry (no I/O).
//! - [`registrar`]: what a broker node runs: one heartbeat task per name server.
//! - [`metrics`]: the Prometheus endpoint (`mqbroker`'s too) and the name
//!   server's metrics.
//! - [`security`]: authenticated broker registration and the port's TLS.
//! - [`properties`]: Java `.properties` files (RocketMQ configurations).
//! - [`logging`]: process logging for `mqnamesrv` and `mqbroker` (text or JSON
//!   lines, colour only on a terminal).
#![deny(missing_docs)]

pub mod logging;
pub mod metrics;
pub mod properties;
pub mod registrar;
pub mod registry;
pub mod remoting;
pub mod security;
pub mod server;

/// The generated name server protocol (`ledgermq.namesrv`), from [`ledgermq_proto`].
pub use ledgermq_proto::namesrv_pb as pb;

/// Failures of the name server and its clients.
#[derive(Debug, thiserror::Error)]
pub enum NameSrvError {
    /// The configuration file could not be read or parsed.
    #[error("configuration: {0}")]
    Config(String),
    /// Binding or serving failed.
    #[error("transport: {0}")]
    Transport(String),
    /// A call to a name server failed.
    #[error("name server {addr}: {reason}")]
    Call {
        /// The name server's address.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// Wall clock in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
