//! How a topic's kinds, its message type ([`TopicMessageType`]) and permission
//! ([`TopicPerm`]), map to each protocol the broker speaks: one function per pair,
//! used by every path that converts (routes, registrations, admin).
//!
//! Sources: `apache.rocketmq.v2` `MessageType` and `Permission`
//! (`proto/apache/rocketmq/v2/definition.proto`), and the name server's
//! registration (`proto/proto/ledgermq/namesrv.proto`).

use ledgermq_meta::{TopicMessageType, TopicPerm};
use ledgermq_namesrv::pb as ns;

use crate::pb;

/// The 5.x protocol's message type of one message (never `Mixed`, which no
/// message is: it maps to UNSPECIFIED).
pub fn message_type_to_pb(t: TopicMessageType) -> pb::MessageType {
    match t {
        TopicMessageType::Normal => pb::MessageType::Normal,
        TopicMessageType::Fifo => pb::MessageType::Fifo,
        TopicMessageType::Delay => pb::MessageType::Delay,
        TopicMessageType::Transaction => pb::MessageType::Transaction,
        TopicMessageType::Mixed => pb::MessageType::Unspecified,
    }
}

/// The message types a queue of a topic of type `t` accepts, as a route reports
/// them (`MessageQueue.accept_message_types`): a MIXED topic's queues take
/// NORMAL, FIFO, DELAY and TRANSACTION, as the reference proxy reports them.
pub fn accept_message_types_pb(t: TopicMessageType) -> Vec<i32> {
    t.accepted()
        .into_iter()
        .map(|m| message_type_to_pb(m) as i32)
        .collect()
}

/// A topic's message type as registered at the name servers.
pub fn message_type_to_ns(t: TopicMessageType) -> ns::MessageType {
    match t {
        TopicMessageType::Normal => ns::MessageType::Normal,
        TopicMessageType::Fifo => ns::MessageType::Fifo,
        TopicMessageType::Delay => ns::MessageType::Delay,
        TopicMessageType::Transaction => ns::MessageType::Transaction,
        TopicMessageType::Mixed => ns::MessageType::Mixed,
    }
}

/// A registered message type (`ns::MessageType` as sent); Unspecified, or a value
/// this release does not know (a newer broker's), reads as Normal.
pub fn message_type_from_ns(t: i32) -> TopicMessageType {
    match ns::MessageType::try_from(t) {
        Ok(ns::MessageType::Fifo) => TopicMessageType::Fifo,
        Ok(ns::MessageType::Delay) => TopicMessageType::Delay,
        Ok(ns::MessageType::Transaction) => TopicMessageType::Transaction,
        Ok(ns::MessageType::Mixed) => TopicMessageType::Mixed,
        _ => TopicMessageType::Normal,
    }
}

/// The 5.x protocol's permission of a topic.
pub fn permission_to_pb(p: TopicPerm) -> pb::Permission {
    match (p.readable(), p.writable()) {
        (true, true) => pb::Permission::ReadWrite,
        (true, false) => pb::Permission::Read,
        (false, true) => pb::Permission::Write,
        (false, false) => pb::Permission::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_type_goes_to_the_name_servers_and_back_and_to_clients() {
        for t in TopicMessageType::ALL {
            assert_eq!(message_type_from_ns(message_type_to_ns(t) as i32), t);
            if t != TopicMessageType::Mixed {
                assert_eq!(
                    format!("{:?}", message_type_to_pb(t)),
                    format!("{:?}", message_type_to_ns(t))
                );
            }
        }
        assert_eq!(message_type_from_ns(99), TopicMessageType::Normal);
    }

    #[test]
    fn a_mixed_topics_queues_accept_every_message_type() {
        let all: Vec<i32> = [
            pb::MessageType::Normal,
            pb::MessageType::Fifo,
            pb::MessageType::Delay,
            pb::MessageType::Transaction,
        ]
        .into_iter()
        .map(|t| t as i32)
        .collect();
        assert_eq!(accept_message_types_pb(TopicMessageType::Mixed), all);
        assert_eq!(
            accept_message_types_pb(TopicMessageType::Delay),
            vec![pb::MessageType::Delay as i32]
        );
    }

    #[test]
    fn permission_bits_map_to_the_protocols_permission() {
        let p = |bits| permission_to_pb(TopicPerm::from_bits(bits));
        assert_eq!(p(6), pb::Permission::ReadWrite);
        assert_eq!(p(4), pb::Permission::Read);
        assert_eq!(p(2), pb::Permission::Write);
        assert_eq!(p(0), pb::Permission::None);
        // RocketMQ's PERM_INHERIT (1) beside read and write changes nothing here.
        assert_eq!(p(7), pb::Permission::ReadWrite);
        assert_eq!(TopicPerm::operator_choice(6), Some(TopicPerm::READ_WRITE));
        assert_eq!(TopicPerm::operator_choice(7), None);
        assert_eq!(TopicPerm::default(), TopicPerm::READ_WRITE);
    }
}
