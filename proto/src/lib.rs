//! The wire protocols LedgerMQ's processes speak, as generated tonic/prost code,
//! so that clients, tools and test harnesses (`jepsen`, `bench`, `mqadmin`-like
//! programs) need not link the broker, the Raft node or the store.
//!
//! - [`pb`]: the RocketMQ 5.x client protocol subset LedgerMQ serves
//!   (`proto/apache/rocketmq/v2`, package `apache.rocketmq.v2`, from Apache
//!   RocketMQ's `rocketmq-apis`).
//! - [`admin_pb`]: LedgerMQ's admin protocol (`proto/ledgermq/admin.proto`), served
//!   on every broker node's client port.
//! - [`namesrv_pb`]: LedgerMQ's name server protocol (`proto/ledgermq/namesrv.proto`),
//!   which broker nodes register with and clients ask for routes.
//! - [`log_lines`]: lines a node writes to its log that harnesses look for.
//! - [`signature`]: the 5.x clients' request signature (`MQv2-HMAC-SHA1`), which
//!   LedgerMQ's processes also sign their calls to each other with.
//!
//! The generated modules are documented in their `.proto` files.
#![deny(missing_docs)]

pub mod signature;

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

    impl Status {
        /// `Status{OK, "OK"}`, the status of a call or entry that succeeded.
        pub fn ok() -> Self {
            Status {
                code: Code::Ok as i32,
                message: "OK".into(),
            }
        }
    }

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

/// Generated code of the name server protocol (`proto/ledgermq/namesrv.proto`,
/// package `ledgermq.namesrv`).
pub mod namesrv_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("ledgermq.namesrv");
}

/// Lines a node writes to its log that other programs look for: the Jepsen
/// harness reads nodes' logs to explain what it saw. The node logs these exact
/// strings (the Raft crate uses the constants), so the two cannot drift apart.
pub mod log_lines {
    /// What a node logs when it sets its messages aside because its log cannot
    /// replay its metadata store: it starts empty and takes them back from the
    /// group. The harness uses it to lay a follower's log revert to a damaged
    /// metadata store.
    pub const SET_ASIDE_MESSAGES: &str =
        "the log cannot replay the metadata: setting this node's messages aside, starting empty and taking them back from the group";
}
