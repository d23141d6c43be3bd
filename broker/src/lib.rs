//! LedgerMQ's broker node: the RocketMQ 5 gRPC protocol over a Raft group (issue 5),
//! and the announcements that keep every name server's routes current.
//!
//! - [`announce`]: turns the Raft node's state into name-server registrations.
//! - [`config`]: the `mqbroker -c FILE` configuration.

pub mod announce;
pub mod config;
