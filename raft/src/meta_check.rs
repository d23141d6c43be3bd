//! Whether the metadata store can still speak for the log beside it.
//!
//! sled does not report every damage: given a damaged page it recovers the state
//! before it and says nothing (`raft/tests/damaged_metadata.rs`). An older state
//! is harmless as long as the log still holds every entry after it, which are
//! applied again; it is fatal when the log was purged past it, for the entries
//! between are gone from this node. This module decides that, from facts read at
//! start, with no I/O: [`check`] compares the metadata's purge point, last
//! applied entry and snapshot with where the CommitLog begins.

/// What the metadata store and the CommitLog say at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFacts {
    /// Log index the metadata says the log was purged through (`None`: never).
    pub last_purged: Option<u64>,
    /// Log index of the last entry the metadata says was applied.
    pub last_applied: Option<u64>,
    /// Log index the stored snapshot ends at (`None`: no snapshot).
    pub snapshot_index: Option<u64>,
    /// First log index the CommitLog holds (or would hold next, when empty).
    pub log_first_index: u64,
}

/// Why the metadata cannot speak for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaDamage {
    /// The log begins after the entry following the metadata's purge point.
    PurgedPastRecord {
        /// Where the metadata says the log was purged through.
        last_purged: Option<u64>,
        /// Where the log begins.
        log_first_index: u64,
    },
    /// Entries after the metadata's last applied one are gone from the log.
    AppliedBeforeLog {
        /// The metadata's last applied entry.
        last_applied: Option<u64>,
        /// Where the log begins.
        log_first_index: u64,
    },
    /// The log was purged, but the snapshot that stands for the purged entries
    /// (sent to a lagging follower) is missing or ends before the purge point.
    SnapshotBehindPurge {
        /// Where the snapshot ends.
        snapshot_index: Option<u64>,
        /// Where the log was purged through.
        last_purged: u64,
    },
}

impl std::fmt::Display for MetaDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaDamage::PurgedPastRecord {
                last_purged,
                log_first_index,
            } => write!(
                f,
                "the CommitLog begins at log index {log_first_index} but the metadata says it was purged only through {last_purged:?}"
            ),
            MetaDamage::AppliedBeforeLog {
                last_applied,
                log_first_index,
            } => write!(
                f,
                "the metadata was applied only through log index {last_applied:?} but the CommitLog begins at {log_first_index}: the entries between are gone"
            ),
            MetaDamage::SnapshotBehindPurge {
                snapshot_index,
                last_purged,
            } => write!(
                f,
                "the log was purged through log index {last_purged} but the stored snapshot ends at {snapshot_index:?}"
            ),
        }
    }
}

/// The index after `i` (`None`: 0).
fn next(i: Option<u64>) -> u64 {
    i.map_or(0, |i| i + 1)
}

/// Ok if the log holds every entry after the metadata's state, else why not.
pub fn check(f: &MetaFacts) -> Result<(), MetaDamage> {
    if f.log_first_index > next(f.last_purged) {
        return Err(MetaDamage::PurgedPastRecord {
            last_purged: f.last_purged,
            log_first_index: f.log_first_index,
        });
    }
    if f.log_first_index > next(f.last_applied) {
        return Err(MetaDamage::AppliedBeforeLog {
            last_applied: f.last_applied,
            log_first_index: f.log_first_index,
        });
    }
    if let Some(p) = f.last_purged {
        if f.snapshot_index.is_none_or(|s| s < p) {
            return Err(MetaDamage::SnapshotBehindPurge {
                snapshot_index: f.snapshot_index,
                last_purged: p,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(
        purged: Option<u64>,
        applied: Option<u64>,
        snap: Option<u64>,
        first: u64,
    ) -> MetaFacts {
        MetaFacts {
            last_purged: purged,
            last_applied: applied,
            snapshot_index: snap,
            log_first_index: first,
        }
    }

    #[test]
    fn a_consistent_store_passes() {
        // Fresh node; never purged; purged through 99 with the snapshot there and
        // the log from 100 (or from an earlier segment start, as purges go by
        // segment); reset for a snapshot at 99.
        for f in [
            facts(None, None, None, 0),
            facts(None, Some(68), None, 0),
            facts(Some(99), Some(150), Some(99), 100),
            facts(Some(99), Some(150), Some(120), 90),
            facts(Some(99), Some(99), Some(99), 100),
        ] {
            assert_eq!(check(&f), Ok(()), "{f:?}");
        }
    }

    #[test]
    fn a_rolled_back_store_is_caught_where_the_log_cannot_replay_it() {
        // sled forgot the purge (the log begins at 100).
        assert!(matches!(
            check(&facts(None, Some(150), None, 100)),
            Err(MetaDamage::PurgedPastRecord { .. })
        ));
        assert!(matches!(
            check(&facts(Some(40), Some(150), Some(40), 100)),
            Err(MetaDamage::PurgedPastRecord { .. })
        ));
        // sled forgot what it applied past the purge.
        assert!(matches!(
            check(&facts(Some(99), Some(68), Some(99), 100)),
            Err(MetaDamage::AppliedBeforeLog { .. })
        ));
        // sled forgot the snapshot that stands for the purged entries.
        assert!(matches!(
            check(&facts(Some(99), Some(150), Some(50), 100)),
            Err(MetaDamage::SnapshotBehindPurge { .. })
        ));
        assert!(matches!(
            check(&facts(Some(99), Some(150), None, 100)),
            Err(MetaDamage::SnapshotBehindPurge { .. })
        ));
    }
}
