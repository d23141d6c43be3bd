//! The acknowledged mark as the CommitLog keeps it ([`crate::ack_mark`],
//! [`crate::ack_bound`]): how far this node acknowledged its log, and whether
//! recovery cut entries it had acknowledged.

use super::CommitLog;
use crate::ack_mark::AckedId;
use crate::error::Result;

impl CommitLog {
    /// The log id of the last entry, or, when the log holds none since a reset for
    /// a snapshot, of the entry the snapshot ends at (`None`: nothing ever).
    /// Errors: `Io`, `Corrupted`.
    pub fn last_log_id(&self) -> Result<Option<AckedId>> {
        if let Some(l) = self.last_entry()? {
            return Ok(Some(AckedId {
                term: l.term,
                index: l.log_index,
            }));
        }
        let (_, next, term) = self.tail();
        Ok(next.checked_sub(1).map(|index| AckedId { term, index }))
    }

    /// The acknowledged mark: the log id of the last entry acknowledged as durable
    /// (see [`crate::ack_mark`]).
    pub fn acked_log_id(&self) -> Option<AckedId> {
        self.ack_mark.get()
    }

    /// After an unclean stop on a machine that restarted since (ASYNC_FLUSH's page
    /// cache is gone): takes the durable bound as the acknowledged mark
    /// ([`crate::ack_mark::AckMark::adopt_bound_after_reboot`]). Errors: `Io`.
    pub fn adopt_ack_bound_after_reboot(&self) -> Result<Option<AckedId>> {
        self.ack_mark.adopt_bound_after_reboot()
    }

    /// Sets the acknowledged mark and the bound to the log's last entry,
    /// whatever they said (see `StoreConfig::forget_lost_acknowledged`). Returns
    /// the mark it replaced. Errors: `Io`, `Corrupted`.
    pub fn forget_lost_acknowledged(&self) -> Result<Option<AckedId>> {
        let before = self.acked_log_id();
        self.ack_mark.reset_to(self.last_log_id()?)?;
        Ok(before)
    }

    /// Raises the acknowledged mark and its bound, durably, to the log's last log
    /// id if that is higher, and returns the mark. Called before a log is set
    /// aside (`crate::set_aside`): the emptied node then refuses votes and stays
    /// out of elections as its log would have had it, even if its mark was
    /// missing or damaged. Errors: `Io`, `Corrupted`.
    pub fn raise_ack_mark_to_last(&self) -> Result<Option<AckedId>> {
        let last = self.last_log_id()?;
        let cur = self.acked_log_id();
        if last > cur {
            self.ack_mark.reset_to(last)?;
            return Ok(last);
        }
        Ok(cur)
    }

    /// Records that the entries through `id` are acknowledged though only written
    /// (ASYNC_FLUSH), before the acknowledgement is sent: the mark is written, not
    /// fsynced ([`crate::ack_mark::AckMark::raise_written`]). Errors: `Io`.
    pub fn acknowledge_written(&self, id: AckedId) -> Result<()> {
        self.ack_mark.raise_written(id)
    }

    /// True while the log's last log id ([`CommitLog::last_log_id`]) is below the
    /// acknowledged mark (by term, then index): crash recovery cut entries this node
    /// had acknowledged (damaged data, or a power loss under ASYNC_FLUSH), and the
    /// log has not moved past them since. A log that cannot be read counts as
    /// having lost them.
    pub fn lost_acknowledged(&self) -> bool {
        match self.last_log_id() {
            Ok(last) => self.acked_log_id() > last,
            Err(_) => true,
        }
    }
}
