//! Golden bytes: what commit 44a2fd3 (the last release without the envelope)
//! wrote for every stored type and every log payload, decoded by this release.
//! A change to any of these types' layout fails here: give the type a new format
//! version (rows, snapshots) or a new variant (log) instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use openraft::{BasicNode, Membership, StoredMembership};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::*;
use crate::boundary::{BoundarySnapshot, SnapMeta};
use crate::codec::{log_id, SystemPayload};
use crate::state_machine::{GroupMeta, SnapshotData};
use crate::types::{
    Command, FifoLease, GroupConfig, LogId, NodeId, OffsetCommit, Request, TopicConfig,
    TopicMessageType, TopicPerm,
};
use ledgermq_meta::{DeliveryAttempts, RetryPolicy};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `value` as a stored row: the bytes 44a2fd3 wrote (`legacy_hex`) decode to it,
/// and this release writes the envelope around the same layout.
fn stored<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: T, legacy_hex: &str) {
    let legacy = unhex(legacy_hex);
    assert_eq!(
        hex(&postcard::to_stdvec(&value).unwrap()),
        hex(&legacy),
        "layout of {value:?}"
    );
    assert!(!legacy.starts_with(&MAGIC), "{value:?}");
    assert_eq!(decode::<T>("v", &legacy).unwrap(), value);
    let now = encode(&value).unwrap();
    assert_eq!(now[..MAGIC.len()], MAGIC);
    assert_eq!(now[MAGIC.len()], V1);
    assert_eq!(now[MAGIC.len() + 1..], legacy[..]);
    assert_eq!(decode::<T>("v", &now).unwrap(), value);
    // An earlier release (plain postcard) refuses the envelope, never misreads it.
    assert!(postcard::from_bytes::<T>(&now).is_err(), "{value:?}");
}

fn topic() -> TopicConfig {
    TopicConfig {
        name: "TopicF".into(),
        queue_count: 8,
        perm: TopicPerm::READ_WRITE,
        message_type: TopicMessageType::Fifo,
    }
}

fn group() -> GroupConfig {
    GroupConfig {
        name: "GF".into(),
        fifo: true,
        broadcast: false,
        max_delivery_attempts: 16,
    }
}

fn lease() -> FifoLease {
    FifoLease {
        group: "GF".into(),
        topic: "TopicF".into(),
        queue_id: 3,
        queue_offset: 300,
        delivery_id: (5 << FifoLease::DELIVERY_TERM_SHIFT) | 9,
        attempt: 2,
        visible_at_ms: 1_764_000_000_000,
    }
}

fn commit() -> OffsetCommit {
    OffsetCommit {
        group: "GN".into(),
        topic: "TopicM".into(),
        queue_id: 1,
        offset: 1_000,
    }
}

fn membership() -> Membership<NodeId, BasicNode> {
    let ids: BTreeSet<NodeId> = [0, 1, 2].into();
    let nodes: BTreeMap<NodeId, BasicNode> = ids
        .iter()
        .map(|&i| (i, BasicNode::new(format!("127.0.0.1:{}", 9000 + i))))
        .collect();
    Membership::new(vec![ids], nodes)
}

fn group_meta() -> GroupMeta {
    let key = |g: &str| (g.to_string(), "TopicF".to_string(), 3);
    GroupMeta {
        offsets: [(key("GF"), 300), (key("GN"), 12)].into(),
        topics: [("TopicF".to_string(), topic())].into(),
        groups: [("GF".to_string(), group())].into(),
        fifo_leases: [(key("GF"), lease())].into(),
        lease_deadlines: Default::default(),
        applied_index: None,
        purge_point: None,
        retry_policies: BTreeMap::new(),
        delivery_attempts: BTreeMap::new(),
        fifo_batches: BTreeMap::new(),
        acl_users: BTreeMap::new(),
        batch_deadlines: Default::default(),
    }
}

#[test]
fn stored_rows_of_the_previous_release_decode() {
    stored(topic(), "06546f70696346080601");
    stored(group(), "024746010010");
    stored(
        lease(),
        "02474606546f7069634606ac028980808080a0010280a0bfe9d666",
    );
    stored(Some(log_id(5, 1234)), "0105d209");
    stored(None::<LogId>, "00");
    stored(4096u64, "8020");
    stored(StoredMembership::new(Some(log_id(1, 2)), membership()), "010102010300010203000e3132372e302e302e313a39303030010e3132372e302e302e313a39303031020e3132372e302e302e313a39303032");
    let meta = SnapMeta {
        last_log_id: Some(log_id(5, 2048)),
        last_membership: StoredMembership::new(Some(log_id(1, 2)), membership()),
        snapshot_id: "5-2048".into(),
    };
    stored(meta.clone(), "01058010010102010300010203000e3132372e302e302e313a39303030010e3132372e302e302e313a39303031020e3132372e302e302e313a3930303206352d32303438");
    let data = SnapshotData {
        meta: group_meta(),
        queues: vec![ledgermq_store::QueuePosition {
            topic: "TopicF".into(),
            queue_id: 3,
            next_offset: 301,
        }],
    };
    stored(data.clone(), "0202474606546f7069634606ac0202474e06546f70696346060c0106546f7069634606546f70696346080601010247460247460100100102474606546f706963460602474606546f7069634606ac028980808080a0010280a0bfe9d6660106546f7069634606ad02");
    // A boundary snapshot holds the snapshot data as it was encoded then.
    stored(
        BoundarySnapshot {
            meta,
            data: postcard::to_stdvec(&data).unwrap(),
        },
        "01058010010102010300010203000e3132372e302e302e313a39303030010e3132372e302e302e313a39303031020e3132372e302e302e313a3930303206352d32303438680202474606546f7069634606ac0202474e06546f70696346060c0106546f7069634606546f70696346080601010247460247460100100102474606546f706963460602474606546f7069634606ac028980808080a0010280a0bfe9d6660106546f7069634606ad02",
    );
}

#[test]
fn a_topic_permission_keeps_the_bare_bits_earlier_releases_stored() {
    for bits in [0u32, 2, 4, 6, 7] {
        let as_u32 = postcard::to_allocvec(&bits).unwrap();
        assert_eq!(
            postcard::to_allocvec(&TopicPerm::from_bits(bits)).unwrap(),
            as_u32
        );
        let back: TopicPerm = postcard::from_bytes(&as_u32).unwrap();
        assert_eq!(back.bits(), bits);
    }
}

#[test]
fn consumer_offsets_of_the_previous_release_decode() {
    let legacy = 4096u64.to_be_bytes();
    assert_eq!(decode_offset(&legacy).unwrap(), 4096);
    let now = encode_offset(4096);
    assert_eq!(now.len(), 19);
    assert_eq!(decode_offset(&now).unwrap(), 4096);
    assert!(matches!(
        decode_offset(&[1, 2, 3]),
        Err(RaftNodeError::MetadataDamaged(_))
    ));
}

#[test]
fn a_later_version_is_refused_not_misread() {
    // A topic config has only version 1; a snapshot reads 2 as well.
    let mut later = encode(&topic()).unwrap();
    later[MAGIC.len()] = V1 + 1;
    match decode::<TopicConfig>("topic config", &later) {
        Err(RaftNodeError::FormatTooNew {
            version, supported, ..
        }) => assert_eq!((version, supported), (V1 + 1, V1)),
        other => panic!("{other:?}"),
    }
    let mut snapshot = encode_with_tail(&topic(), &1u8).unwrap();
    snapshot[MAGIC.len()] = CURRENT + 1;
    match decode_versioned_tail::<TopicConfig>("snapshot", &snapshot) {
        Err(RaftNodeError::FormatTooNew {
            version, supported, ..
        }) => assert_eq!((version, supported), (CURRENT + 1, CURRENT)),
        other => panic!("{other:?}"),
    }
    let mut offset = encode_offset(7);
    offset[MAGIC.len()] = V1 + 1;
    assert!(matches!(
        decode_offset(&offset),
        Err(RaftNodeError::FormatTooNew { .. })
    ));
    let mut zero = encode(&topic()).unwrap();
    zero[MAGIC.len()] = 0;
    assert!(matches!(
        decode::<TopicConfig>("topic config", &zero),
        Err(RaftNodeError::MetadataDamaged(_))
    ));
}

/// Every log payload as 44a2fd3 encoded it in a system record's body.
#[test]
fn log_payloads_of_the_previous_release_decode() {
    let cases: Vec<(SystemPayload, &str)> = vec![
        (SystemPayload::Blank, "00"),
        (SystemPayload::Membership(membership()), "01010300010203000e3132372e302e302e313a39303030010e3132372e302e302e313a39303031020e3132372e302e302e313a39303032"),
        (
            SystemPayload::Normal(Request::Messages(vec![])),
            "020000",
        ),
        (cmd(Command::CommitOffsets(vec![commit()])), "0201000102474e06546f7069634d02e807"),
        (cmd(Command::UpdateTopic(topic())), "02010106546f70696346080601"),
        (cmd(Command::DeleteTopic("TopicF".into())), "02010206546f70696346"),
        (cmd(Command::UpdateGroup(group())), "020103024746010010"),
        (cmd(Command::DeleteGroup("GF".into())), "020104024746"),
        (cmd(Command::EnsureTopic(topic())), "02010506546f70696346080601"),
        (cmd(Command::EnsureGroup(group())), "020106024746010010"),
        (cmd(Command::FifoLeases(vec![lease()])), "0201070102474606546f7069634606ac028980808080a0010280a0bfe9d666"),
        (
            cmd(Command::FifoLeasesOfTerm {
                term: 5,
                leases: vec![lease()],
            }),
            "020108050102474606546f7069634606ac028980808080a0010280a0bfe9d666",
        ),
        (cmd(Command::PurgeThrough { index: 4096 }), "0201098020"),
    ];
    for (payload, golden) in cases {
        let bytes = unhex(golden);
        assert_eq!(
            hex(&postcard::to_stdvec(&payload).unwrap()),
            hex(&bytes),
            "layout of {payload:?}"
        );
        assert_eq!(
            postcard::from_bytes::<SystemPayload>(&bytes).unwrap(),
            payload
        );
    }
}

/// The log command set 2 variant (`FifoLeasesTimed`), as this release writes it.
#[test]
fn log_payloads_of_command_set_2_keep_their_layout() {
    let payload = cmd(Command::FifoLeasesTimed {
        term: 5,
        leases: vec![crate::types::TimedFifoLease {
            lease: lease(),
            invisible_ms: 10_000,
        }],
    });
    let golden = "02010a050102474606546f7069634606ac028980808080a0010280a0bfe9d666904e";
    assert_eq!(hex(&postcard::to_stdvec(&payload).unwrap()), golden);
    assert_eq!(
        postcard::from_bytes::<SystemPayload>(&unhex(golden)).unwrap(),
        payload
    );
    assert_eq!(payload_set(&payload), crate::format::SET_TIMED_FIFO_LEASES);
}

/// Log command set 3: a topic config of type MIXED (variant index 4 of its
/// message type), in `UpdateTopic` and `EnsureTopic`, as this release writes it.
#[test]
fn log_payloads_of_command_set_3_keep_their_layout() {
    let mixed = TopicConfig {
        message_type: TopicMessageType::Mixed,
        ..topic()
    };
    for (payload, golden) in [
        (
            cmd(Command::UpdateTopic(mixed.clone())),
            "02010106546f70696346080604",
        ),
        (
            cmd(Command::EnsureTopic(mixed)),
            "02010506546f70696346080604",
        ),
    ] {
        assert_eq!(hex(&postcard::to_stdvec(&payload).unwrap()), golden);
        assert_eq!(
            postcard::from_bytes::<SystemPayload>(&unhex(golden)).unwrap(),
            payload
        );
        assert_eq!(payload_set(&payload), crate::format::SET_MIXED_TOPICS);
    }
    // Every other topic config stays in set 1, readable by earlier releases.
    for t in &TopicMessageType::ALL[..4] {
        let c = Command::UpdateTopic(TopicConfig {
            message_type: *t,
            ..topic()
        });
        assert_eq!(c.log_command_set(), 1);
    }
}

/// Log command set 4: `ResetOffsets` (variant 11), as this release writes it.
#[test]
fn log_payloads_of_command_set_4_keep_their_layout() {
    let payload = cmd(Command::ResetOffsets(vec![OffsetCommit {
        group: "g".into(),
        topic: "T".into(),
        queue_id: 1,
        offset: 5,
    }]));
    keeps_its_layout(
        &payload,
        "02010b0101670154 0205",
        crate::format::SET_RESET_OFFSETS,
    );
}

/// `payload` is written as `golden` (hex, spaces ignored), `golden` reads back
/// as `payload`, and it belongs to log command set `set`.
fn keeps_its_layout(payload: &SystemPayload, golden: &str, set: u8) {
    assert_eq!(
        hex(&postcard::to_stdvec(payload).unwrap()),
        golden.replace(' ', "")
    );
    assert_eq!(
        &postcard::from_bytes::<SystemPayload>(&unhex(golden)).unwrap(),
        payload
    );
    assert_eq!(payload_set(payload), set);
}

/// Log command set 6: `UpdateGroupWithRetryPolicy` (variant 12), both policy
/// kinds, as this release writes them.
#[test]
fn log_payloads_of_command_set_6_keep_their_layout() {
    let group = GroupConfig {
        name: "g".into(),
        fifo: false,
        broadcast: false,
        max_delivery_attempts: 16,
    };
    for (retry_policy, golden) in [
        (
            RetryPolicy::Customized {
                next_ms: vec![1_000, 2_000],
            },
            "02010c 0167 00 00 10 01 02 e807 d00f",
        ),
        (
            RetryPolicy::Exponential {
                initial_ms: 1_000,
                max_ms: 8_000,
                multiplier: 2,
            },
            "02010c 0167 00 00 10 00 e807 c03e 02",
        ),
    ] {
        let payload = cmd(Command::UpdateGroupWithRetryPolicy {
            group: group.clone(),
            retry_policy,
        });
        keeps_its_layout(&payload, golden, crate::format::SET_GROUP_RETRY_POLICIES);
    }
}

/// Log command set 7: `DeliveryAttempts` (variant 13), as this release writes it.
#[test]
fn log_payloads_of_command_set_7_keep_their_layout() {
    let payload = cmd(Command::DeliveryAttempts(vec![DeliveryAttempts {
        group: "g".into(),
        topic: "T".into(),
        queue_id: 1,
        attempts: vec![(300, 2)],
    }]));
    keeps_its_layout(
        &payload,
        "02010d 01 0167 0154 02 01 ac02 02",
        crate::format::SET_DELIVERY_ATTEMPTS,
    );
}

/// Log command set 8: `FifoBatchLeases` (variant 14), as this release writes it.
#[test]
fn log_payloads_of_command_set_8_keep_their_layout() {
    let payload = cmd(Command::FifoBatchLeases {
        term: 5,
        batches: vec![batch()],
    });
    keeps_its_layout(
        &payload,
        "02010e 05 01 0167 0154 02 8a80808080a001 ac02 ad02 01 ac02 8980808080a001 02 d00f 904e",
        crate::format::SET_FIFO_BATCHES,
    );
}

fn batch() -> crate::types::FifoBatchLease {
    crate::types::FifoBatchLease {
        group: "g".into(),
        topic: "T".into(),
        queue_id: 1,
        lease_id: (5 << 40) | 10,
        next_offset: 300,
        end_offset: 301,
        deliveries: vec![crate::types::FifoDelivery {
            queue_offset: 300,
            delivery_id: (5 << 40) | 9,
            attempt: 2,
            visible_at_ms: 1_000,
            invisible_ms: 10_000,
        }],
    }
}

#[test]
fn this_release_decodes_log_command_sets_through_acls() {
    assert_eq!(crate::format::LOG_COMMANDS, crate::format::SET_ACL);
    assert_eq!(crate::format::LOG_COMMANDS, 9);
}

/// Log command set 9: the users and permissions (variants 15-18).
#[test]
fn acl_commands_keep_their_layout() {
    use ledgermq_meta::{AclResource, Perm};
    let put = cmd(Command::PutAclUser {
        username: "u".into(),
        secret_key: "s".into(),
        admin: true,
    });
    keeps_its_layout(&put, "02010f 0175 0173 01", crate::format::SET_ACL);
    let grant = cmd(Command::SetAclPerm {
        username: "u".into(),
        resource: AclResource::Topic("T".into()),
        perm: Some(Perm::PubSub),
    });
    keeps_its_layout(&grant, "02011001750001540103", crate::format::SET_ACL);
    let any = cmd(Command::SetAclPerm {
        username: "u".into(),
        resource: AclResource::AnyGroup,
        perm: None,
    });
    keeps_its_layout(&any, "02011001750300", crate::format::SET_ACL);
    let delete = cmd(Command::DeleteAclUser("u".into()));
    keeps_its_layout(&delete, "0201110175", crate::format::SET_ACL);
    let mut user = ledgermq_meta::AclUser::new("u", "s", false);
    user.set_perm(&AclResource::Group("G".into()), Some(Perm::Sub));
    let create = cmd(Command::CreateAclUser(user));
    keeps_its_layout(
        &create,
        "020112017501730000000001014702",
        crate::format::SET_ACL,
    );
}

/// Users make a format 4 snapshot: format 3's tail, then the users; an
/// earlier release (which reads up to format 3) refuses it.
#[test]
fn a_snapshot_carries_users_in_format_4_only() {
    let mut data = SnapshotData {
        meta: group_meta(),
        queues: vec![],
    };
    let v1 = data.encode().unwrap();
    let mut user = ledgermq_meta::AclUser::new("u", "s", false);
    user.set_perm(
        &ledgermq_meta::AclResource::Topic("T".into()),
        Some(ledgermq_meta::Perm::Pub),
    );
    data.meta.acl_users.insert("u".into(), user);
    let v4 = data.encode().unwrap();
    assert_eq!(v4[MAGIC.len()], V4_TAIL);
    assert_eq!(v4[MAGIC.len() + 1..v1.len()], v1[MAGIC.len() + 1..]);
    // Format 3's empty tail (no policies, attempts or batches), then the user.
    assert_eq!(
        hex(&v4[v1.len()..]),
        "00 00 00 01 0175 0175 0173 00 00 00 01 0154 01 00".replace(' ', "")
    );
    assert_eq!(SnapshotData::decode(&v4).unwrap(), data);
    data.meta
        .fifo_batches
        .insert(("g".into(), "T".into(), 1), batch());
    let both = data.encode().unwrap();
    assert_eq!(SnapshotData::decode(&both).unwrap(), data);
    match decode_versioned_tail::<SnapshotData>("snapshot", &both) {
        Ok((_, 4, _)) => {}
        other => panic!("{other:?}"),
    }
    // What a release that reads up to format 3 makes of it.
    let (version, _) = open_envelope(&both);
    assert_eq!(version, 4);
    assert!(check_version("snapshot", version, V3_TAIL).is_err());
    assert!(SnapshotData::decode(&v4[..v4.len() - 1]).is_err());
}

/// FIFO batch leases make a format 3 snapshot: format 2's tail, then the
/// batches; an earlier release (which reads up to format 2) refuses it.
#[test]
fn a_snapshot_carries_fifo_batches_in_format_3_only() {
    let mut data = SnapshotData {
        meta: group_meta(),
        queues: vec![],
    };
    let v1 = data.encode().unwrap();
    data.meta
        .fifo_batches
        .insert(("g".into(), "T".into(), 1), batch());
    let v3 = data.encode().unwrap();
    assert_eq!(v3[MAGIC.len()], V3_TAIL);
    assert_eq!(v3[MAGIC.len() + 1..v1.len()], v1[MAGIC.len() + 1..]);
    // Format 2's empty tail (no policies, no attempts), then one batch.
    assert_eq!(
        hex(&v3[v1.len()..]),
        "00 00 01 0167 0154 02 0167 0154 02 8a80808080a001 ac02 ad02 01 ac02 8980808080a001 02 d00f 904e".replace(' ', "")
    );
    assert_eq!(SnapshotData::decode(&v3).unwrap(), data);
    match decode_with_tail::<SnapshotData, u8>("snapshot", &v3) {
        Err(RaftNodeError::FormatTooNew {
            version: 3,
            supported: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    data.meta.retry_policies.insert(
        "G".into(),
        RetryPolicy::Customized {
            next_ms: vec![3_000],
        },
    );
    let both = data.encode().unwrap();
    assert_eq!(SnapshotData::decode(&both).unwrap(), data);
    assert!(SnapshotData::decode(&v3[..v3.len() - 1]).is_err());
}

/// A snapshot without retry policies or delivery attempts keeps format 1's
/// bytes (what earlier releases read); one with either is format 2, both after
/// those bytes, which an earlier release refuses rather than misreads.
#[test]
fn a_snapshot_carries_retry_policies_in_format_2_only() {
    let mut data = SnapshotData {
        meta: group_meta(),
        queues: vec![],
    };
    let v1 = data.encode().unwrap();
    assert_eq!(v1, encode(&data).unwrap());
    assert_eq!(SnapshotData::decode(&v1).unwrap(), data);
    data.meta.retry_policies.insert(
        "G".into(),
        RetryPolicy::Customized {
            next_ms: vec![3_000],
        },
    );
    let v2 = data.encode().unwrap();
    assert_eq!(v2[MAGIC.len()], V2_TAIL);
    assert_eq!(v2[MAGIC.len() + 1..v1.len()], v1[MAGIC.len() + 1..]);
    assert_eq!(SnapshotData::decode(&v2).unwrap(), data);
    // The tail's layout: the policies, then the delivery attempts.
    assert_eq!(hex(&v2[v1.len()..]), "0101470101b81700");
    data.meta
        .delivery_attempts
        .insert(("G".into(), "T".into(), 2), [(7, 3)].into());
    let with_attempts = data.encode().unwrap();
    assert_eq!(
        hex(&with_attempts[v1.len()..]),
        "0101470101b817 01 0147 0154 04 01 07 03".replace(' ', "")
    );
    assert_eq!(SnapshotData::decode(&with_attempts).unwrap(), data);
    // Attempts alone make a format 2 snapshot too.
    data.meta.retry_policies.clear();
    let attempts_only = data.encode().unwrap();
    assert_eq!(attempts_only[MAGIC.len()], V2_TAIL);
    assert_eq!(SnapshotData::decode(&attempts_only).unwrap(), data);
    // What this release's `decode` (and so an earlier release) makes of it.
    assert!(matches!(
        decode::<SnapshotData>("snapshot", &v2),
        Err(RaftNodeError::FormatTooNew { version: 2, .. })
    ));
    // A damaged tail is an error, not an empty map.
    assert!(SnapshotData::decode(&v2[..v2.len() - 1]).is_err());
}

fn payload_set(p: &SystemPayload) -> u8 {
    match p {
        SystemPayload::Normal(Request::Command(c)) => c.log_command_set(),
        _ => 1,
    }
}

fn cmd(c: Command) -> SystemPayload {
    SystemPayload::Normal(Request::Command(c))
}

proptest! {
    /// The envelope's bytes never begin a varint as postcard writes it
    /// (lengths, variants and integers all begin so).
    #[test]
    fn no_varint_begins_with_the_envelope(n in any::<u64>(), len in 0usize..100_000) {
        prop_assert!(!postcard::to_stdvec(&n).unwrap().starts_with(&MAGIC));
        let s = "x".repeat(len);
        prop_assert!(!postcard::to_stdvec(&s).unwrap().starts_with(&MAGIC));
    }
}
