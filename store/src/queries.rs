//! Reads of committed messages: by queue offset, by key or message id, by time.

use std::sync::Arc;

use crate::consume_queue::ConsumeQueue;
use crate::error::{Result, StoreError};
use crate::half_index::{PendingHalf, HALF_TOPIC};
use crate::record::{MessageRecord, RecordView, PROPERTY_KEYS, PROPERTY_UNIQ_KEY};
use crate::store::MessageStore;
use crate::timer_index::{PendingTimer, TIMER_TOPIC};

/// A committed message read back from the CommitLog (its CRC verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its queue offset, when known (always for reads through a ConsumeQueue).
    pub queue_offset: Option<u64>,
    /// Its CommitLog offset.
    pub physical_offset: u64,
    /// The record bytes (see [`crate::record`]).
    pub bytes: Vec<u8>,
}

impl StoredMessage {
    /// A view of the record's fields.
    pub fn view(&self) -> RecordView<'_> {
        RecordView::parse_checked_before(&self.bytes).expect("verified when read")
    }
}

impl MessageStore {
    /// `[min, max)` queue offsets of a message queue; `(0, 0)` for one never written.
    pub fn queue_offsets(&self, topic: &str, queue_id: i32) -> (u64, u64) {
        self.consume_queues()
            .get(topic, queue_id)
            .map(|cq| (cq.min_offset(), cq.max_offset()))
            .unwrap_or((0, 0))
    }

    fn cq(&self, topic: &str, queue_id: i32, queue_offset: u64) -> Result<Arc<ConsumeQueue>> {
        self.consume_queues()
            .get(topic, queue_id)
            .ok_or(StoreError::OutOfRange {
                what: "queue offset",
                requested: queue_offset,
                min: 0,
                max: 0,
            })
    }

    /// The message at `queue_offset` of (topic, queue id). Errors: `OutOfRange` when
    /// the offset is not (or no longer) held, `Corrupted`.
    pub fn get_message(
        &self,
        topic: &str,
        queue_id: i32,
        queue_offset: u64,
    ) -> Result<StoredMessage> {
        let cq = self.cq(topic, queue_id, queue_offset)?;
        let (e, bytes) = self.queue_message(&cq, queue_offset)?;
        Ok(StoredMessage {
            queue_offset: Some(queue_offset),
            physical_offset: e.commit_log_offset,
            bytes,
        })
    }

    /// Up to `max_count` messages from `from_offset` on whose ConsumeQueue tag hash
    /// passes `accept_tag_hash` (the caller re-checks the tag itself, hashes collide).
    /// Stops early at the end of the queue. Returns the messages and the queue offset
    /// to continue from.
    pub fn get_messages(
        &self,
        topic: &str,
        queue_id: i32,
        from_offset: u64,
        max_count: usize,
        accept_tag_hash: impl FnMut(i64) -> bool,
    ) -> Result<(Vec<StoredMessage>, u64)> {
        self.get_messages_scanning(
            topic,
            queue_id,
            from_offset,
            max_count,
            usize::MAX,
            accept_tag_hash,
        )
    }

    /// [`Self::get_messages`], looking at no more than `max_scan` ConsumeQueue
    /// entries (a filter that takes few messages then costs a bounded read;
    /// the caller continues from the offset returned).
    pub fn get_messages_scanning(
        &self,
        topic: &str,
        queue_id: i32,
        from_offset: u64,
        max_count: usize,
        max_scan: usize,
        mut accept_tag_hash: impl FnMut(i64) -> bool,
    ) -> Result<(Vec<StoredMessage>, u64)> {
        let Some(cq) = self.consume_queues().get(topic, queue_id) else {
            return Ok((Vec::new(), from_offset));
        };
        let mut at = from_offset.max(cq.min_offset());
        let end = cq.max_offset().min(at.saturating_add(max_scan as u64));
        let mut out = Vec::new();
        while at < end && out.len() < max_count {
            let e = self.queue_entry(&cq, at)?;
            if accept_tag_hash(e.tag_hash) {
                let (e, bytes) = self.queue_message(&cq, at)?;
                out.push(StoredMessage {
                    queue_offset: Some(at),
                    physical_offset: e.commit_log_offset,
                    bytes,
                });
            }
            at += 1;
        }
        Ok((out, at))
    }

    /// Messages of `topic` whose message id (UNIQ_KEY) or one of whose keys equals
    /// `key`, stored within `[begin_ms, end_ms]`, newest first, at most `max_results`.
    /// Hash collisions are filtered out by checking every candidate record.
    pub fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.query_index(topic, key, begin_ms, end_ms, max_results, false)
    }

    /// [`Self::query_by_key`] for messages whose message id (UNIQ_KEY) is `id`
    /// only: messages that merely carry it among their keys are not counted.
    pub fn query_by_message_id(
        &self,
        topic: &str,
        id: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.query_index(topic, id, begin_ms, end_ms, max_results, true)
    }

    fn query_index(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
        id_only: bool,
    ) -> Result<Vec<StoredMessage>> {
        let mut out = Vec::new();
        // Ask for more candidates than results: some may be collisions.
        let candidates = self.index().query(
            topic,
            key,
            begin_ms,
            end_ms,
            max_results.saturating_mul(4).max(64),
        )?;
        for phys in candidates {
            if out.len() >= max_results {
                break;
            }
            let bytes = match self.read_record_at(phys) {
                Ok(b) => b,
                Err(StoreError::OutOfRange { .. }) => continue, // purged by retention
                Err(e) => return Err(e),
            };
            let v = RecordView::parse_checked_before(&bytes).expect("verified");
            let ts = v.store_timestamp_ms();
            let matches = v.topic() == topic
                && (begin_ms..=end_ms).contains(&ts)
                && (v.property(PROPERTY_UNIQ_KEY) == Some(key)
                    || !id_only
                        && v.property(PROPERTY_KEYS)
                            .is_some_and(|ks| ks.split(' ').any(|k| k == key)));
            if matches {
                let queue_offset = self
                    .consume_queues()
                    .get(topic, v.queue_id())
                    .map(|cq| cq.find_by_commit_log_offset(phys))
                    .transpose()?
                    .flatten();
                out.push(StoredMessage {
                    queue_offset,
                    physical_offset: phys,
                    bytes,
                });
            }
        }
        Ok(out)
    }

    /// Reads the record starting at physical `offset` (length from its header).
    pub fn read_record_at(&self, offset: u64) -> Result<Vec<u8>> {
        let head = self.commit_log().read_bytes(offset, 4)?;
        let len = i32::from_be_bytes(head[..4].try_into().unwrap());
        if len <= 0 {
            return Err(self
                .commit_log()
                .corrupted(offset, format!("record length {len}")));
        }
        self.commit_log().read_record(offset, len as usize)
    }

    /// The message record that begins at CommitLog `offset` (an offset a
    /// client names: a 4.x offset message id, CONSUMER_SEND_MSG_BACK), its
    /// length bounded by the largest entry and its CRC and position checked.
    /// The caller checks that its log index is applied. Errors: `OutOfRange`,
    /// `Corrupted` (no record begins there), `InvalidInput` (a system record,
    /// or a length no record has).
    pub fn message_at(&self, offset: u64) -> Result<StoredMessage> {
        let head = self.commit_log().read_bytes(offset, 4)?;
        let len = i32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
        if len <= 0 || len as u64 > self.max_entry_bytes() {
            return Err(StoreError::InvalidInput(format!(
                "no record of a plausible length at physical offset {offset}"
            )));
        }
        let bytes = self.commit_log().read_record(offset, len as usize)?;
        if RecordView::parse_checked_before(&bytes)
            .map(|v| v.kind())
            .ok()
            != Some(crate::record::RecordKind::Message)
        {
            return Err(StoreError::InvalidInput(format!(
                "the record at physical offset {offset} is not a message"
            )));
        }
        Ok(StoredMessage {
            queue_offset: None,
            physical_offset: offset,
            bytes,
        })
    }

    /// The record of the pending timer `t`, a message of [`TIMER_TOPIC`]. Errors:
    /// the CommitLog's (purged, damaged), `Corrupted` when the record there is
    /// not a timer's of that size.
    pub fn read_timer(&self, t: &PendingTimer) -> Result<MessageRecord> {
        let bytes = self.read_record_at(t.physical_offset)?;
        let view = RecordView::parse_checked_before(&bytes)
            .map_err(|e| self.commit_log().corrupted(t.physical_offset, e))?;
        if view.topic() != TIMER_TOPIC || view.len() != t.size_bytes as usize {
            return Err(self.commit_log().corrupted(
                t.physical_offset,
                format!(
                    "a pending timer points at a record of topic {} and {} bytes",
                    view.topic(),
                    view.len()
                ),
            ));
        }
        Ok(view.to_record())
    }

    /// The record of the pending half message `h` (as the half index holds it).
    /// Errors: `Corrupted` when the place holds no record of [`HALF_TOPIC`] of
    /// its size; the log's read errors.
    pub fn read_half(&self, h: &PendingHalf) -> Result<MessageRecord> {
        let bytes = self.read_record_at(h.physical_offset)?;
        let view = RecordView::parse_checked_before(&bytes)
            .map_err(|e| self.commit_log().corrupted(h.physical_offset, e))?;
        if view.topic() != HALF_TOPIC || view.len() != h.size_bytes as usize {
            return Err(self.commit_log().corrupted(
                h.physical_offset,
                format!(
                    "a pending half message points at a record of topic {} and {} bytes",
                    view.topic(),
                    view.len()
                ),
            ));
        }
        Ok(view.to_record())
    }

    /// The first queue offset of (topic, queue id) whose message was stored at or
    /// after `timestamp_ms` (the queue's max offset if none): what "rewind a consumer
    /// group to a time" resets to. Binary search over the ConsumeQueue.
    pub fn offset_by_time(&self, topic: &str, queue_id: i32, timestamp_ms: i64) -> Result<u64> {
        let Some(cq) = self.consume_queues().get(topic, queue_id) else {
            return Ok(0);
        };
        let (lo, hi) = (cq.min_offset(), cq.max_offset());
        cq.partition_point(lo, hi, |_, e| {
            let bytes = self
                .commit_log()
                .read_record(e.commit_log_offset, e.size_bytes as usize)?;
            Ok(RecordView::parse_checked_before(&bytes)
                .expect("verified")
                .store_timestamp_ms()
                < timestamp_ms)
        })
    }
}
