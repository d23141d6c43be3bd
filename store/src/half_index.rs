//! The half index: transactional (half) messages that wait for their producer's
//! commit or rollback, and how each one ended. Two trees of the timer index's sled
//! database (`<root>/timers`), so it is flushed, cleared, closed and rebuilt with
//! it ([`crate::timer_index::TimerIndex`]).
//!
//! A transactional message is stored in the CommitLog under the internal topic
//! [`HALF_TOPIC`] (RocketMQ's `RMQ_SYS_TRANS_HALF_TOPIC`), queue 0, with its real
//! topic and queue in `REAL_TOPIC` / `REAL_QID` and the time of its first check in
//! [`PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS`] (the properties RocketMQ stores,
//! `MessageConst`). Dispatch places it in the half topic's ConsumeQueue, where it
//! reaches no consumer, and adds it here by its half queue offset, the same on
//! every replica. The leader ends it with one record: a commit is a copy in the
//! real queue, a rollback (or a discard after the last check) an op record in
//! [`OP_HALF_TOPIC`]; both carry [`PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET`],
//! and dispatching the first of them that reaches a pending half moves it from
//! pending to ended here, with the CommitLog offset of that winning record.
//! Later ends of the same half change nothing here, and dispatch places a later
//! commit copy in no queue (it is a losing end: `MessageStore::is_losing_end`),
//! so the first end in log order decides both the index and what is delivered,
//! on every replica. The index is a function of the committed log, rebuilt by
//! dispatching it again.

use crate::error::{Result, StoreError};
use crate::timer_index::TimerIndex;

/// The internal topic half messages are stored under until they are ended
/// (RocketMQ's `TransactionalMessageUtil.buildHalfTopic()`).
pub const HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// The internal topic of rollback and discard records (RocketMQ's
/// `buildOpTopic()`).
pub const OP_HALF_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
/// `"true"` on a transactional message, half or committed (RocketMQ's
/// `PROPERTY_TRANSACTION_PREPARED`).
pub const PROPERTY_TRANSACTION_PREPARED: &str = "TRAN_MSG";
/// The producer group of a transactional message: the topic, as the reference
/// proxy names 5.x producers (RocketMQ's `PROPERTY_PRODUCER_GROUP`).
pub const PROPERTY_PRODUCER_GROUP: &str = "PGROUP";
/// Seconds after it was stored before a half message is first checked back,
/// decimal (RocketMQ's `PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS`). The broker
/// always writes it: the client's recovery duration, or its transaction timeout.
pub const PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";
/// On a commit copy or an op record: the half message's queue offset in
/// [`HALF_TOPIC`]'s queue 0 (RocketMQ's `PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET`).
pub const PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: &str = "TRAN_PREPARED_QUEUE_OFFSET";
/// On an op record: `ROLLBACK` or `DISCARD` (LedgerMQ's own property; RocketMQ
/// marks op records with the tag `d` only).
pub const PROPERTY_TRANSACTION_END: &str = "TRAN_END";

const PENDING_TREE: &str = "transaction_halves_pending";
const ENDED_TREE: &str = "transaction_halves_ended";

/// A half message still waiting for its end, as the index holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingHalf {
    /// Its queue offset in [`HALF_TOPIC`]'s queue 0 (the same on every replica):
    /// the transaction id's content.
    pub half_queue_offset: u64,
    /// When it is first checked back, ms since the Unix epoch (store time plus
    /// its immunity).
    pub first_check_ms: i64,
    /// Where its record is in this node's CommitLog.
    pub physical_offset: u64,
    /// Its record's size, bytes.
    pub size_bytes: u32,
}

/// How a half message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfEnd {
    /// Committed: a copy is in its real queue.
    Committed,
    /// Rolled back by its producer.
    RolledBack,
    /// Dropped by the broker after its last check went unanswered.
    Discarded,
}

impl HalfEnd {
    /// The byte stored for it in the ended tree.
    fn code(self) -> u8 {
        match self {
            HalfEnd::Committed => 1,
            HalfEnd::RolledBack => 2,
            HalfEnd::Discarded => 3,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(HalfEnd::Committed),
            2 => Some(HalfEnd::RolledBack),
            3 => Some(HalfEnd::Discarded),
            _ => None,
        }
    }

    /// The [`PROPERTY_TRANSACTION_END`] value of its op record (a commit has none).
    pub fn op_value(self) -> Option<&'static str> {
        match self {
            HalfEnd::Committed => None,
            HalfEnd::RolledBack => Some("ROLLBACK"),
            HalfEnd::Discarded => Some("DISCARD"),
        }
    }

    /// The end an op record's [`PROPERTY_TRANSACTION_END`] value names.
    pub fn from_op_value(v: &str) -> Option<Self> {
        match v {
            "ROLLBACK" => Some(HalfEnd::RolledBack),
            "DISCARD" => Some(HalfEnd::Discarded),
            _ => None,
        }
    }
}

/// What the index knows of one half queue offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfState {
    /// Waiting for its end.
    Pending(PendingHalf),
    /// Ended so.
    Ended(HalfEnd),
}

/// The half index: a view of the timer index's database.
pub struct HalfIndex<'a> {
    pub(crate) db: &'a TimerIndex,
}

fn pending_value(h: &PendingHalf) -> [u8; 20] {
    let mut v = [0u8; 20];
    v[..8].copy_from_slice(&h.first_check_ms.to_be_bytes());
    v[8..16].copy_from_slice(&h.physical_offset.to_be_bytes());
    v[16..].copy_from_slice(&h.size_bytes.to_be_bytes());
    v
}

fn decode_pending(k: &[u8], v: &[u8]) -> Option<PendingHalf> {
    let (k, v): (&[u8; 8], &[u8; 20]) = (k.try_into().ok()?, v.try_into().ok()?);
    Some(PendingHalf {
        half_queue_offset: u64::from_be_bytes(*k),
        first_check_ms: i64::from_be_bytes(v[..8].try_into().ok()?),
        physical_offset: u64::from_be_bytes(v[8..16].try_into().ok()?),
        size_bytes: u32::from_be_bytes(v[16..].try_into().ok()?),
    })
}

impl HalfIndex<'_> {
    fn corrupted(&self, what: String) -> StoreError {
        StoreError::Corrupted {
            path: self.db.dir().to_owned(),
            file_offset: 0,
            reason: format!("half index: {what}"),
        }
    }

    fn pending_tree(&self) -> Result<sled::Tree> {
        self.db.tree(PENDING_TREE)
    }

    fn ended_tree(&self) -> Result<sled::Tree> {
        self.db.tree(ENDED_TREE)
    }

    /// Adds a pending half, unless it has ended already (dispatch again after a
    /// crash, with its end persisted before the crash).
    pub fn insert(&self, h: PendingHalf) -> Result<()> {
        let key = h.half_queue_offset.to_be_bytes();
        if self
            .ended_tree()?
            .contains_key(key)
            .map_err(|e| self.db.err(e))?
        {
            return Ok(());
        }
        self.pending_tree()?
            .insert(key, &pending_value(&h)[..])
            .map(|_| ())
            .map_err(|e| self.db.err(e))
    }

    /// Ends a pending half by the record at CommitLog offset `by_physical_offset`
    /// (the winning end); true if it was pending. A half not pending (ended
    /// already, or never known) is left as it is.
    pub fn end(
        &self,
        half_queue_offset: u64,
        end: HalfEnd,
        by_physical_offset: u64,
    ) -> Result<bool> {
        let key = half_queue_offset.to_be_bytes();
        let pending = self.pending_tree()?;
        if !pending.contains_key(key).map_err(|e| self.db.err(e))? {
            return Ok(false);
        }
        // Ended first: a crash in between leaves it ended and pending, which the
        // dispatch again settles; `state` reads the end first, and `due` and
        // `oldest_physical_offset` skip rows the ended tree holds.
        let mut v = [0u8; 9];
        v[0] = end.code();
        v[1..].copy_from_slice(&by_physical_offset.to_be_bytes());
        self.ended_tree()?
            .insert(key, &v[..])
            .map_err(|e| self.db.err(e))?;
        pending.remove(key).map_err(|e| self.db.err(e))?;
        Ok(true)
    }

    /// What the index knows of `half_queue_offset`: None when it was never a
    /// half message here, or its record is gone and its end forgotten
    /// ([`Self::forget_below`]).
    pub fn state(&self, half_queue_offset: u64) -> Result<Option<HalfState>> {
        let key = half_queue_offset.to_be_bytes();
        if let Some((end, _)) = self.end_of(half_queue_offset)? {
            return Ok(Some(HalfState::Ended(end)));
        }
        match self.pending_tree()?.get(key).map_err(|e| self.db.err(e))? {
            Some(v) => decode_pending(&key, &v)
                .map(|h| Some(HalfState::Pending(h)))
                .ok_or_else(|| self.corrupted(format!("a pending row of {} bytes", v.len()))),
            None => Ok(None),
        }
    }

    /// How the half at `half_queue_offset` ended and the CommitLog offset of the
    /// record that ended it; None while pending or unknown.
    pub fn end_of(&self, half_queue_offset: u64) -> Result<Option<(HalfEnd, u64)>> {
        let key = half_queue_offset.to_be_bytes();
        match self.ended_tree()?.get(key).map_err(|e| self.db.err(e))? {
            None => Ok(None),
            Some(v) => match (
                v.first().copied().and_then(HalfEnd::from_code),
                <[u8; 8]>::try_from(v.get(1..).unwrap_or_default()),
            ) {
                (Some(end), Ok(by)) => Ok(Some((end, u64::from_be_bytes(by)))),
                _ => Err(self.corrupted(format!("an ended row {v:?}"))),
            },
        }
    }

    /// Calls `f` with every pending half first checked at or before `now_ms`, in
    /// half queue offset order (the order they were sent), until it returns
    /// false. Reads every pending row.
    pub fn for_each_due(&self, now_ms: i64, mut f: impl FnMut(PendingHalf) -> bool) -> Result<()> {
        let ended = self.ended_tree()?;
        for kv in self.pending_tree()?.iter() {
            let (k, v) = kv.map_err(|e| self.db.err(e))?;
            let h = decode_pending(&k, &v)
                .ok_or_else(|| self.corrupted(format!("a pending row of {} bytes", v.len())))?;
            if h.first_check_ms > now_ms || ended.contains_key(&k).map_err(|e| self.db.err(e))? {
                continue;
            }
            if !f(h) {
                break;
            }
        }
        Ok(())
    }

    /// Up to `limit` pending halves first checked at or before `now_ms`, in half
    /// queue offset order ([`Self::for_each_due`]).
    pub fn due(&self, now_ms: i64, limit: usize) -> Result<Vec<PendingHalf>> {
        let mut out = Vec::new();
        if limit > 0 {
            self.for_each_due(now_ms, |h| {
                out.push(h);
                out.len() < limit
            })?;
        }
        Ok(out)
    }

    /// Pending rows (O(n), for tests).
    pub fn pending(&self) -> usize {
        self.pending_tree().map_or(0, |t| t.len())
    }

    /// The lowest CommitLog offset at or above `from` that a pending half's
    /// record is at, if any: retention keeps those records (O(n)).
    pub fn oldest_physical_offset(&self, from: u64) -> Result<Option<u64>> {
        let mut oldest: Option<u64> = None;
        let ended = self.ended_tree()?;
        for kv in self.pending_tree()?.iter() {
            let (k, v) = kv.map_err(|e| self.db.err(e))?;
            if ended.contains_key(&k).map_err(|e| self.db.err(e))? {
                continue;
            }
            if let Some(h) = decode_pending(&k, &v).filter(|h| h.physical_offset >= from) {
                oldest = Some(oldest.map_or(h.physical_offset, |o| o.min(h.physical_offset)));
            }
        }
        Ok(oldest)
    }

    /// Forgets how the halves below `half_queue_offset` ended (their records are
    /// gone: the half queue's min offset after retention). Returns how many.
    pub fn forget_below(&self, half_queue_offset: u64) -> Result<usize> {
        let tree = self.ended_tree()?;
        let mut n = 0;
        for kv in tree.range(..half_queue_offset.to_be_bytes()) {
            let (k, _) = kv.map_err(|e| self.db.err(e))?;
            tree.remove(k).map_err(|e| self.db.err(e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Both trees emptied (the timer index's `clear`).
    pub(crate) fn clear(&self) -> Result<()> {
        self.pending_tree()?.clear().map_err(|e| self.db.err(e))?;
        self.ended_tree()?.clear().map_err(|e| self.db.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half(q: u64, first_check_ms: i64) -> PendingHalf {
        PendingHalf {
            half_queue_offset: q,
            first_check_ms,
            physical_offset: 1_000 + q * 100,
            size_bytes: 90,
        }
    }

    #[test]
    fn a_half_is_pending_until_its_first_end_and_that_end_stays() {
        let dir = tempfile::tempdir().unwrap();
        let timers = TimerIndex::open(dir.path()).unwrap();
        let idx = timers.halves();
        for h in [half(0, 5_000), half(1, 2_000), half(2, 9_000)] {
            idx.insert(h).unwrap();
        }
        assert_eq!(idx.pending(), 3);
        assert_eq!(idx.due(4_999, 10).unwrap(), vec![half(1, 2_000)]);
        assert_eq!(
            idx.due(i64::MAX, 2).unwrap(),
            vec![half(0, 5_000), half(1, 2_000)]
        );
        assert_eq!(idx.oldest_physical_offset(0).unwrap(), Some(1_000));
        assert_eq!(idx.oldest_physical_offset(1_001).unwrap(), Some(1_100));

        assert!(idx.end(1, HalfEnd::Committed, 5_000).unwrap());
        // A later end of the same half (a rollback applied after the commit)
        // changes nothing.
        assert!(!idx.end(1, HalfEnd::RolledBack, 6_000).unwrap());
        assert_eq!(
            idx.state(1).unwrap(),
            Some(HalfState::Ended(HalfEnd::Committed))
        );
        assert_eq!(idx.end_of(1).unwrap(), Some((HalfEnd::Committed, 5_000)));
        assert_eq!(idx.end_of(0).unwrap(), None);
        // Dispatching its record again (after a crash) does not revive it.
        idx.insert(half(1, 2_000)).unwrap();
        assert_eq!(
            idx.state(1).unwrap(),
            Some(HalfState::Ended(HalfEnd::Committed))
        );
        assert_eq!(
            idx.state(0).unwrap(),
            Some(HalfState::Pending(half(0, 5_000)))
        );
        assert_eq!(idx.state(7).unwrap(), None);
        // An end for a half never seen is not recorded.
        assert!(!idx.end(7, HalfEnd::Discarded, 7_000).unwrap());
        assert_eq!(idx.state(7).unwrap(), None);

        assert!(idx.end(2, HalfEnd::Discarded, 8_000).unwrap());
        assert_eq!(idx.pending(), 1);
        assert_eq!(idx.forget_below(2).unwrap(), 1);
        assert_eq!(idx.state(1).unwrap(), None);
        assert_eq!(
            idx.state(2).unwrap(),
            Some(HalfState::Ended(HalfEnd::Discarded))
        );
    }

    #[test]
    fn halves_survive_a_reopen_once_flushed_and_clear_with_the_timers() {
        let dir = tempfile::tempdir().unwrap();
        {
            let timers = TimerIndex::open(dir.path()).unwrap();
            timers.halves().insert(half(4, 10)).unwrap();
            timers.halves().insert(half(5, 10)).unwrap();
            timers.halves().end(5, HalfEnd::RolledBack, 1).unwrap();
            timers.flush().unwrap();
            timers.close().unwrap();
        }
        let timers = TimerIndex::open(dir.path()).unwrap();
        assert_eq!(timers.halves().due(10, 10).unwrap(), vec![half(4, 10)]);
        assert_eq!(
            timers.halves().state(5).unwrap(),
            Some(HalfState::Ended(HalfEnd::RolledBack))
        );
        timers.clear().unwrap();
        assert_eq!(timers.halves().pending(), 0);
        assert_eq!(timers.halves().state(5).unwrap(), None);
    }

    #[test]
    fn op_values_name_their_ends() {
        for end in [HalfEnd::RolledBack, HalfEnd::Discarded] {
            assert_eq!(HalfEnd::from_op_value(end.op_value().unwrap()), Some(end));
        }
        assert_eq!(HalfEnd::Committed.op_value(), None);
        assert_eq!(HalfEnd::from_op_value("COMMIT"), None);
    }
}
