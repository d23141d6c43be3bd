//! A snapshot's contents and their stored formats (the `format` module's
//! envelope): format 1 for what earlier releases read, format 2 with a tail.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ledgermq_meta::{QueueKey, RetryPolicy};
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SnapshotData {
    pub(crate) meta: GroupMeta,
    pub(crate) queues: Vec<QueuePosition>,
}

/// Format 2's tail of a snapshot: fields are never removed or reordered (a new
/// one needs a format 3). Borrowed when written, owned when read.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotTail<'a> {
    retry_policies: Cow<'a, BTreeMap<String, RetryPolicy>>,
    delivery_attempts: Cow<'a, BTreeMap<QueueKey, BTreeMap<u64, u32>>>,
}

impl SnapshotData {
    /// The stored snapshot: format 1, or 2 when it holds retry policies or
    /// delivery attempts. Errors: `Codec`.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, RaftNodeError> {
        let m = &self.meta;
        if m.retry_policies.is_empty() && m.delivery_attempts.is_empty() {
            return format::encode(self);
        }
        format::encode_with_tail(
            self,
            &SnapshotTail {
                retry_policies: Cow::Borrowed(&m.retry_policies),
                delivery_attempts: Cow::Borrowed(&m.delivery_attempts),
            },
        )
    }

    /// Reads what [`SnapshotData::encode`] (or an earlier release) wrote.
    /// Errors: `FormatTooNew`, `MetadataDamaged`, `Codec` (`format::decode`).
    pub(crate) fn decode(bytes: &[u8]) -> Result<SnapshotData, RaftNodeError> {
        let (mut data, tail): (SnapshotData, Option<SnapshotTail<'static>>) =
            format::decode_with_tail("snapshot", bytes)?;
        let tail = tail.unwrap_or_default();
        data.meta.retry_policies = tail.retry_policies.into_owned();
        data.meta.delivery_attempts = tail.delivery_attempts.into_owned();
        Ok(data)
    }
}
