//! LedgerMQ's Jepsen-style partition tests: the `jepsen` binary runs a 3-node group
//! and a name server as real processes in network namespaces, a workload of
//! producers and consumers, and a nemesis; then checks the history and the replicas.
//!
//! - [`runner`]: one run, from hosts to the run folder.
//! - [`access`]: how the run's clients reach the cluster, plain or secure (TLS,
//!   signed calls, ACLs).
//! - [`evaluate`]: the checkers over a finished run, and its verdict.
//! - [`history`]: invoke / ok / fail / info ops as JSON lines.
//! - [`checker`]: total-queue, order (queue offsets, message groups).
//! - [`fifo`]: one message of a group in flight at a time; acks answered OK are final.
//! - [`availability`]: RTO, throughput during faults against the fault-free rate.
//! - [`nemesis`]: fault kinds, partition shapes (grudges) and seeded fault plans.
//! - [`net`]: the namespace and address plan, and the nftables rules of a grudge.
//! - [`hosts`]: creating and removing the namespaced network, applying grudges.
//! - [`procs`]: the name server and broker nodes running on those hosts.
//! - [`workload`]: producers and consumers over the gRPC protocol, recording the
//!   history, from inside the clients' namespace.
//! - [`faults`]: injecting each fault kind into the cluster and undoing it.
//! - [`node_env`]: each node's own disk, its clock (libfaketime) and fsync delay.
//! - [`drain`]: the drain goes on until consumer offsets reach the queues' ends.
//! - [`disk`]: power loss and damaged tails on a stopped node's files.
//! - [`audit`]: the replica audit (committed prefix, ConsumeQueues vs commit).
//! - [`reverts`]: under SYNC_FLUSH, a follower's log never reverts but after damage.
//! - [`roles`]: each node's role and term over the run, sampled for the report.
//! - [`routes`]: the leader as the nodes say, and the name server's route check.
//! - [`retention`]: forcing retention on the leader while a follower is down.
//! - [`report`]: per-second series and the HTML report.

#![deny(missing_docs)]
pub mod access;
pub mod audit;
pub mod availability;
pub mod checker;
pub mod disk;
pub mod drain;
pub mod evaluate;
pub mod faults;
pub mod fifo;
pub mod history;
pub mod hosts;
pub mod nemesis;
pub mod net;
pub mod node_env;
pub mod procs;
pub mod report;
pub mod retention;
pub mod reverts;
pub mod roles;
pub mod routes;
pub mod runner;
pub mod workload;

/// Failures of the harness.
#[derive(Debug, thiserror::Error)]
pub enum JepsenError {
    /// Reading or writing a file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A history line could not be encoded or decoded.
    #[error("history: {0}")]
    History(String),
    /// Setting up or changing the test hosts failed (needs root, iproute2, nftables).
    #[error("test hosts: {0}")]
    Host(String),
}
