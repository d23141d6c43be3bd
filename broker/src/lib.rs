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

/// Generated code of the admin protocol (`proto/ledgermq/admin.proto`).
pub mod admin_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("ledgermq.admin");
}

/// Generated code of the RocketMQ 5.x client protocol subset LedgerMQ serves
/// (`proto/apache/rocketmq/v2`, package `apache.rocketmq.v2`).
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("apache.rocketmq.v2");

    #[cfg(test)]
    mod tests {
        use super::*;
        use prost::Message as _;

        /// Field numbers the official clients depend on (a wrong number makes them
        /// read zero: e.g. a max body size of 0 blocks every send).
        #[test]
        fn wire_field_numbers_match_the_official_clients() {
            let p = Publishing {
                topics: vec![],
                max_body_size: 300,
                validate_message_type: true,
            };
            // field 2 varint (0x10) = 300 (0xac 0x02); field 3 varint (0x18) = 1
            assert_eq!(p.encode_to_vec(), vec![0x10, 0xac, 0x02, 0x18, 0x01]);
            let r = ReceiveMessageRequest {
                long_polling_timeout: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            };
            // field 7, length-delimited (0x3a)
            assert_eq!(r.encode_to_vec()[0], 0x3a);
            let s = SystemProperties {
                message_group: Some("g".into()),
                ..Default::default()
            };
            // field 17, length-delimited: key 17 << 3 | 2 = 138 = 0x8a 0x01
            assert_eq!(&s.encode_to_vec()[..2], &[0x8a, 0x01]);
            assert_eq!(Code::Ok as i32, 20000);
            assert_eq!(Code::MessageNotFound as i32, 40401);
        }
    }
}
