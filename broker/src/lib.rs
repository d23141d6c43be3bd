//! LedgerMQ's broker node: the RocketMQ 5 gRPC protocol (`apache.rocketmq.v2`) over a
//! Raft group, and the announcements that keep every name server's routes current.
//!
//! - [`service`]: the MessagingService; [`send`] and [`consume`] its calls.
//! - [`broker`]: a node's service state, and passing calls on to the leader.
//! - [`consumers`], [`pop`]: the leader's consumption state (in flight, acks,
//!   offsets), [`receipt`]: receipt handles, [`filter`]: tag filters.
//! - [`leader_term`]: the services that run only while this node leads a term
//!   (the consumer-offset committer), started and ended in one place.
//! - [`message`]: protocol messages <-> CommitLog records, input checks.
//! - [`route`]: routes from the name servers; [`kinds`]: a topic's message type
//!   and permission in each protocol.
//! - [`admin`]: topic and group changes from `mqadmin`; [`audit`]: log digests.
//! - [`announce`]: turns the Raft node's state into name-server registrations.
//! - [`config`]: the `mqbroker -c FILE` configuration; [`node`]: a whole node
//!   ([`node::BrokerNode::start`]), which `mqbroker` runs.

#![deny(missing_docs)]
pub mod admin;
pub mod announce;
pub mod audit;
pub mod broker;
pub mod config;
pub mod consume;
pub mod consumers;
pub mod error;
pub mod filter;
pub mod kinds;
pub mod leader_term;
pub mod message;
pub mod node;
pub mod pop;
pub mod progress;
pub mod receipt;
mod relay;
pub mod route;
pub mod send;
pub mod server;
pub mod service;

pub use error::BrokerError;

/// The generated admin protocol, from [`ledgermq_proto`].
pub use ledgermq_proto::admin_pb;
/// The generated RocketMQ 5.x client protocol, from [`ledgermq_proto`].
pub use ledgermq_proto::pb;
