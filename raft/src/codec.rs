//! Raft entries ↔ CommitLog records, with no I/O.
//!
//! - `Normal(Request::Messages(ms))` with at least one message: one message record
//!   per message (the same bytes a RocketMQ CommitLog holds, plus term and log index).
//! - Everything else (`Blank`, `Membership`, `Normal(Request::Command)`, an empty
//!   message batch): one system record whose body is the postcard encoding of
//!   [`SystemPayload`] and whose timestamps are 0, so it encodes to the same bytes
//!   (and CRC) on every replica.

use ledgermq_store::record::RecordView;
use ledgermq_store::{MessageRecord, RecordKind};
use openraft::{CommittedLeaderId, EntryPayload, Membership};
use serde::{Deserialize, Serialize};

use crate::types::{Entry, LogId, NodeId, Request};

/// Body of a system record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SystemPayload {
    /// openraft's blank entry (a new leader's first entry).
    Blank,
    /// A membership change.
    Membership(Membership<NodeId, openraft::BasicNode>),
    /// A normal entry that is not a non-empty message batch.
    Normal(Request),
}

/// The log id (term, log index) in this configuration.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

/// The records that store `entry` (moving message bodies out of it, no copy).
pub fn entry_to_records(entry: Entry) -> Result<Vec<MessageRecord>, postcard::Error> {
    let payload = match entry.payload {
        EntryPayload::Normal(Request::Messages(ms)) if !ms.is_empty() => {
            return Ok(ms
                .into_iter()
                .map(|mut m| {
                    m.kind = RecordKind::Message;
                    m
                })
                .collect())
        }
        EntryPayload::Normal(req) => SystemPayload::Normal(req),
        EntryPayload::Blank => SystemPayload::Blank,
        EntryPayload::Membership(m) => SystemPayload::Membership(m),
    };
    Ok(vec![MessageRecord::system(
        postcard::to_stdvec(&payload)?,
        0,
    )])
}

/// Rebuilds the entry with log id `(term, index)` from its records.
pub fn records_to_entry<'a>(
    term: u64,
    index: u64,
    records: impl IntoIterator<Item = RecordView<'a>>,
) -> Result<Entry, String> {
    let mut records = records.into_iter().peekable();
    let first = records
        .peek()
        .ok_or_else(|| format!("entry {index} has no record"))?;
    let payload = match first.kind() {
        RecordKind::Message => {
            let mut ms = Vec::new();
            for r in records {
                if r.kind() != RecordKind::Message {
                    return Err(format!("entry {index} mixes message and system records"));
                }
                ms.push(r.to_record());
            }
            EntryPayload::Normal(Request::Messages(ms))
        }
        RecordKind::System => {
            let r = records.next().expect("peeked");
            if records.next().is_some() {
                return Err(format!("system entry {index} has more than one record"));
            }
            match postcard::from_bytes::<SystemPayload>(r.body())
                .map_err(|e| format!("entry {index}: {e}"))?
            {
                SystemPayload::Blank => EntryPayload::Blank,
                SystemPayload::Membership(m) => EntryPayload::Membership(m),
                SystemPayload::Normal(req) => EntryPayload::Normal(req),
            }
        }
    };
    Ok(Entry {
        log_id: log_id(term, index),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Command, OffsetCommit};
    use ledgermq_store::record::{encode_into, encode_properties, encoded_len, Placement};
    use std::collections::{BTreeMap, BTreeSet};

    fn round_trip(entry: Entry) -> Entry {
        let (term, index) = (entry.log_id.leader_id.term, entry.log_id.index);
        let records = entry_to_records(entry).unwrap();
        let mut bufs = Vec::new();
        for (i, r) in records.iter().enumerate() {
            let props = encode_properties(&r.properties);
            let len = encoded_len(r, &props).unwrap();
            let mut out = Vec::new();
            let at = Placement {
                term,
                log_index: index,
                entry_remaining: (records.len() - 1 - i) as u32,
                physical_offset: 0,
            };
            encode_into(&mut out, r, &props, len, at);
            bufs.push(out);
        }
        let views = bufs.iter().map(|b| RecordView::parse(b).unwrap());
        records_to_entry(term, index, views).unwrap()
    }

    #[test]
    fn every_payload_round_trips() {
        let msgs = vec![
            MessageRecord::message("T", 1, b"a".to_vec(), 5),
            MessageRecord::message("T", 2, b"bb".to_vec(), 6).with_property("TAGS", "x"),
        ];
        let members: BTreeSet<NodeId> = [0, 1, 2].into();
        let nodes: BTreeMap<NodeId, openraft::BasicNode> = members
            .iter()
            .map(|&i| {
                (
                    i,
                    openraft::BasicNode::new(format!("127.0.0.1:{}", 4000 + i)),
                )
            })
            .collect();
        let payloads = vec![
            EntryPayload::Normal(Request::Messages(msgs)),
            EntryPayload::Normal(Request::Messages(vec![])),
            EntryPayload::Normal(Request::Command(Command::CommitOffsets(vec![
                OffsetCommit {
                    group: "g".into(),
                    topic: "T".into(),
                    queue_id: 1,
                    offset: 9,
                },
            ]))),
            EntryPayload::Blank,
            EntryPayload::Membership(Membership::new(vec![members], nodes)),
        ];
        for (i, payload) in payloads.into_iter().enumerate() {
            let e = Entry {
                log_id: log_id(3, 10 + i as u64),
                payload,
            };
            assert_eq!(round_trip(e.clone()), e);
        }
    }

    #[test]
    fn system_records_carry_nothing_node_local() {
        // Every replica encodes its own copy of a system entry: nothing in the record
        // may come from the local node (clock, address), or replicas' CRCs differ.
        let e = Entry {
            log_id: log_id(2, 7),
            payload: EntryPayload::Blank,
        };
        let r = &entry_to_records(e).unwrap()[0];
        assert_eq!((r.store_timestamp_ms, r.born_timestamp_ms), (0, 0));
        assert!(r.store_host.ip().is_unspecified() && r.born_host.ip().is_unspecified());
        assert_eq!(r.kind, RecordKind::System);
    }
}
