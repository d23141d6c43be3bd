//! A snapshot's contents and their stored formats (the `format` module's
//! envelope): format 1 for what earlier releases read, formats 2 to 4 with a
//! tail.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ledgermq_meta::{AclUser, FifoBatchLease, QueueKey, RetryPolicy};
use ledgermq_store::QueuePosition;
use serde::{Deserialize, Serialize};

use super::GroupMeta;
use crate::error::RaftNodeError;
use crate::format;

/// What a snapshot holds. Stored in format 1 (`format::encode`) while no
/// consumer group has a retry policy or a recorded delivery attempt; else in
/// format 2, with both ([`GroupMeta::retry_policies`],
/// [`GroupMeta::delivery_attempts`], skipped by `GroupMeta`'s serde) as the
/// tail (`format::encode_with_tail`). Policies exist only once every member
/// decodes log command set 6; delivery attempts (set 7, the weaker rule) may
/// be written while a member is down, and a member of an earlier release sent
/// such a snapshot refuses it (`FormatTooNew`) rather than misreading it.
/// Format 3, when it holds FIFO batch leases ([`GroupMeta::fifo_batches`],
/// log command set 8, written by the same weaker rule as delivery attempts,
/// and refused the same way by a member of an earlier release), has format 2's
/// tail with the batches after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SnapshotData {
    pub(crate) meta: GroupMeta,
    pub(crate) queues: Vec<QueuePosition>,
}

/// Format 2's tail of a snapshot: fields are never removed or reordered (a new
/// one needs a new format, as [`SnapshotTail3`]). Borrowed when written, owned
/// when read.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotTail<'a> {
    retry_policies: Cow<'a, BTreeMap<String, RetryPolicy>>,
    delivery_attempts: Cow<'a, BTreeMap<QueueKey, BTreeMap<u64, u32>>>,
}

/// Format 3's tail: format 2's, then the FIFO batch leases.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotTail3<'a> {
    v2: SnapshotTail<'a>,
    fifo_batches: Cow<'a, BTreeMap<QueueKey, FifoBatchLease>>,
}

/// Format 4's tail: format 3's, then the users and their permissions.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotTail4<'a> {
    v3: SnapshotTail3<'a>,
    acl_users: Cow<'a, BTreeMap<String, AclUser>>,
}

impl SnapshotData {
    /// The stored snapshot: format 1; 2 when it holds retry policies or
    /// delivery attempts; 3 when it holds FIFO batch leases; 4 when it holds
    /// users (ACLs). Errors: `Codec`.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, RaftNodeError> {
        let m = &self.meta;
        let v2 = SnapshotTail {
            retry_policies: Cow::Borrowed(&m.retry_policies),
            delivery_attempts: Cow::Borrowed(&m.delivery_attempts),
        };
        if !m.acl_users.is_empty() {
            let tail = SnapshotTail4 {
                v3: SnapshotTail3 {
                    v2,
                    fifo_batches: Cow::Borrowed(&m.fifo_batches),
                },
                acl_users: Cow::Borrowed(&m.acl_users),
            };
            return format::encode_with_tail_version(format::V4_TAIL, self, &tail);
        }
        if !m.fifo_batches.is_empty() {
            let tail = SnapshotTail3 {
                v2,
                fifo_batches: Cow::Borrowed(&m.fifo_batches),
            };
            return format::encode_with_tail_version(format::V3_TAIL, self, &tail);
        }
        if m.retry_policies.is_empty() && m.delivery_attempts.is_empty() {
            return format::encode(self);
        }
        format::encode_with_tail(self, &v2)
    }

    /// Reads what [`SnapshotData::encode`] (or an earlier release) wrote.
    /// Errors: `FormatTooNew`, `MetadataDamaged`, `Codec` (`format::decode`).
    pub(crate) fn decode(bytes: &[u8]) -> Result<SnapshotData, RaftNodeError> {
        let (mut data, version, rest): (SnapshotData, u8, &[u8]) =
            format::decode_versioned_tail("snapshot", bytes)?;
        let tail = match version {
            format::V4_TAIL => postcard::from_bytes::<SnapshotTail4<'static>>(rest)?,
            format::V3_TAIL => SnapshotTail4 {
                v3: postcard::from_bytes(rest)?,
                acl_users: Cow::Owned(BTreeMap::new()),
            },
            format::V2_TAIL => SnapshotTail4 {
                v3: SnapshotTail3 {
                    v2: postcard::from_bytes(rest)?,
                    fifo_batches: Cow::Owned(BTreeMap::new()),
                },
                acl_users: Cow::Owned(BTreeMap::new()),
            },
            _ => SnapshotTail4::default(),
        };
        data.meta.retry_policies = tail.v3.v2.retry_policies.into_owned();
        data.meta.delivery_attempts = tail.v3.v2.delivery_attempts.into_owned();
        data.meta.fifo_batches = tail.v3.fifo_batches.into_owned();
        data.meta.acl_users = tail.acl_users.into_owned();
        Ok(data)
    }
}
