//! LedgerMQ's broker node: a broker core in its own terms over a Raft group, the
//! RocketMQ 5 gRPC protocol (`apache.rocketmq.v2`) as an adapter over it, and the
//! announcements that keep every name server's routes current.
//!
//! The core (its calls take and return domain types, except [`broker::Target`],
//! which hands back a 5.x client to pass a call on to the leader; failures are an
//! [`ErrorKind`]):
//! - [`broker`]: a node's service state, and finding the leader to pass calls to.
//! - `send`: the queue a message goes to, one Raft entry per send;
//!   `consume`: receive, ack, invisible time and dead letters on the leader.
//! - `consumers`, `pop`: the leader's consumption state (in flight, acks,
//!   offsets), `receipt`: receipt handles, `filter`: tag filters.
//! - `message`: stored property names and the checks a message passes.
//! - `leader_term`: the services that run only while this node leads a term
//!   (the consumer-offset committer), started and ended in one place.
//! - `route`: the name servers and the group's members' client addresses.
//! - [`announce`]: turns the Raft node's state into name-server registrations.
//! - [`config`]: the `mqbroker -c FILE` configuration; [`node`]: a whole node
//!   ([`node::BrokerNode::start`]), which `mqbroker` runs.
//!
//! The adapters:
//! - `grpc`: the 5.x protocol (MessagingService) and the admin service (with the
//!   replica audit's digests and consumer progress it answers);
//!   `kinds`: a topic's message type and permission in each protocol.
//! - `remoting`: the 4.x remoting protocol (sends, pulls, consumer offsets,
//!   heartbeats and queue locks) on `remoting_addr`.

#![deny(missing_docs)]
pub mod acl_bootstrap;
pub mod announce;
pub mod auth;
pub mod broker;
pub mod config;
mod consume;
pub mod consumer_clients;
mod consumers;
pub mod error;
mod filter;
mod grpc;
mod kinds;
mod leader_term;
mod leader_write;
mod message;
pub mod metrics;
pub mod node;
mod pop;
mod receipt;
mod remoting;
mod route;
mod send;
mod timers;
mod transactions;

pub use error::{BrokerError, ErrorKind};

/// The generated admin protocol, from [`ledgermq_proto`].
pub use ledgermq_proto::admin_pb;
/// The generated RocketMQ 5.x client protocol, from [`ledgermq_proto`].
pub use ledgermq_proto::pb;
