//! Retention decisions (RocketMQ's `CleanCommitLogService`), free of I/O.
//!
//! CommitLog segments whose newest message is older than `file_reserved_time_hours`
//! are deleted at the `delete_when_hour` o'clock, or at any time once disk usage passes
//! `disk_max_used_space_ratio`. Past `disk_force_clean_ratio` (0.85, RocketMQ's
//! default) the oldest segments go even if they have not expired. At most
//! `delete_files_batch_max` segments go per run, and never the segment being
//! written. In a broker group these are one member's proposals: the group deletes
//! together, and forced cleaning only what every consumer group has consumed
//! (`ledgermq_raft::purge_point`); a member deciding alone would delete messages
//! the rest of its group serves (the jepsen disk-full runs found it).

/// Retention settings with RocketMQ's names and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// `fileReservedTime`: hours a segment is kept after its newest message (72).
    pub file_reserved_time_hours: u64,
    /// `deleteWhen`: local hour of day (0-23) at which expired segments are deleted (4).
    pub delete_when_hour: u32,
    /// `diskMaxUsedSpaceRatio` as a fraction: above it, expired segments are deleted at
    /// any hour (0.75).
    pub disk_max_used_space_ratio: f64,
    /// `diskSpaceCleanForciblyRatio`: above it, the oldest segments are deleted even if
    /// not expired (0.85; 1.0: never). See the module docs for how a group bounds it.
    pub disk_force_clean_ratio: f64,
    /// `deleteCommitLogFilesBatchMax`-like cap per run (10).
    pub delete_files_batch_max: usize,
    /// `diskSpaceWarningLevelRatio`: above it, new messages are refused
    /// ([`crate::StoreError::DiskFull`]) while reads go on (0.90; 1.0 or more turns
    /// the check off).
    pub disk_space_warning_ratio: f64,
    /// Bytes of the disk reserve ([`crate::reserve`]), given up once less than half
    /// of it is free, or when a committed entry cannot be applied for want of
    /// space; no CommitLog segment is made that would leave less than that half
    /// free ([`crate::room`]) (64 MiB; 0: none, and no such floor).
    pub disk_reserve_bytes: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            file_reserved_time_hours: 72,
            delete_when_hour: 4,
            disk_max_used_space_ratio: 0.75,
            disk_force_clean_ratio: 0.85,
            delete_files_batch_max: 10,
            disk_space_warning_ratio: 0.90,
            disk_reserve_bytes: 64 << 20,
        }
    }
}

/// What retention knows of one segment, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentAge {
    /// Store timestamp (ms) that no message of the segment exceeds: that of the
    /// first message after it (Raft system entries carry no time), or, when none is
    /// found close after it, the segment file's modification time. `None` for the
    /// segment being written.
    pub newest_store_timestamp_ms: Option<i64>,
}

/// The inputs of one retention run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetentionClock {
    /// Wall clock, ms since the Unix epoch.
    pub now_ms: i64,
    /// Local hour of day, 0-23.
    pub local_hour: u32,
    /// Used fraction of the disk holding the store, 0.0-1.0.
    pub disk_used_ratio: f64,
}

/// True when a retention run may delete anything at all: at the delete hour, or
/// under disk pressure (expired segments), or past the forced-clean ratio.
pub fn cleaning_due(cfg: &RetentionConfig, clock: RetentionClock) -> bool {
    clock.local_hour == cfg.delete_when_hour
        || clock.disk_used_ratio > cfg.disk_max_used_space_ratio
        || clock.disk_used_ratio > cfg.disk_force_clean_ratio
}

/// How many of the oldest `segments` are due now, and why (only the first
/// `delete_files_batch_max` are looked at; never the segment being written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentsDue {
    /// Expired ones (older than `file_reserved_time_hours`), at the delete hour or
    /// under disk pressure: every member dates them alike, since it holds the same
    /// messages.
    pub expired: usize,
    /// What forced cleaning would take (0 unless the disk is past
    /// `disk_force_clean_ratio`): the oldest segments, expired or not. The Raft
    /// layer takes only those every consumer group has consumed.
    pub forced: usize,
}

impl SegmentsDue {
    /// The larger of the two counts.
    pub fn most(&self) -> usize {
        self.expired.max(self.forced)
    }
}

/// Which of the oldest `segments` are due now ([`SegmentsDue`]).
pub fn segments_due(
    cfg: &RetentionConfig,
    segments: &[SegmentAge],
    clock: RetentionClock,
) -> SegmentsDue {
    let reserved_ms = (cfg.file_reserved_time_hours as i64).saturating_mul(3_600_000);
    let time_to_clean = clock.local_hour == cfg.delete_when_hour
        || clock.disk_used_ratio > cfg.disk_max_used_space_ratio;
    let force = clock.disk_used_ratio > cfg.disk_force_clean_ratio;
    let looked_at = || segments.iter().take(cfg.delete_files_batch_max);
    SegmentsDue {
        expired: looked_at()
            .take_while(|s| {
                s.newest_store_timestamp_ms.is_some_and(|ts| {
                    time_to_clean && clock.now_ms.saturating_sub(ts) > reserved_ms
                })
            })
            .count(),
        forced: if force {
            looked_at()
                .take_while(|s| s.newest_store_timestamp_ms.is_some())
                .count()
        } else {
            0
        },
    }
}

/// How many of the oldest `segments` to delete now on a lone store (expired or
/// forced alike).
pub fn segments_to_delete(
    cfg: &RetentionConfig,
    segments: &[SegmentAge],
    clock: RetentionClock,
) -> usize {
    segments_due(cfg, segments, clock).most()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000;

    fn ages(ts: &[Option<i64>]) -> Vec<SegmentAge> {
        ts.iter()
            .map(|&t| SegmentAge {
                newest_store_timestamp_ms: t,
            })
            .collect()
    }

    #[test]
    fn expired_segments_go_only_at_delete_hour_or_when_disk_is_full() {
        let cfg = RetentionConfig {
            disk_force_clean_ratio: 0.85,
            ..Default::default()
        };
        let now = 1000 * H;
        let segs = ages(&[
            Some(now - 100 * H),
            Some(now - 80 * H),
            Some(now - 10 * H),
            None,
        ]);
        let at = |hour, ratio| RetentionClock {
            now_ms: now,
            local_hour: hour,
            disk_used_ratio: ratio,
        };
        assert_eq!(segments_to_delete(&cfg, &segs, at(3, 0.1)), 0);
        assert_eq!(segments_to_delete(&cfg, &segs, at(4, 0.1)), 2);
        assert_eq!(segments_to_delete(&cfg, &segs, at(3, 0.8)), 2);
        // Forced: everything but the segment being written.
        assert_eq!(segments_to_delete(&cfg, &segs, at(3, 0.9)), 3);
    }

    #[test]
    fn a_full_disk_deletes_no_unexpired_segment_with_forcing_off() {
        // One node's disk fills (jepsen disk-full): its copy of messages the rest
        // of the group retains must stay, or a failover to it loses them.
        let now = 1000 * H;
        let segs = ages(&[Some(now - H), Some(now - H), None]);
        let full = RetentionClock {
            now_ms: now,
            local_hour: 3,
            disk_used_ratio: 1.0,
        };
        let cfg = RetentionConfig {
            disk_force_clean_ratio: 1.0,
            ..Default::default()
        };
        assert_eq!(segments_to_delete(&cfg, &segs, full), 0);
        let forcing = RetentionConfig {
            disk_force_clean_ratio: 0.85,
            ..cfg
        };
        assert_eq!(segments_to_delete(&forcing, &segs, full), 2);
    }

    #[test]
    fn forced_and_expired_segments_are_told_apart() {
        let cfg = RetentionConfig {
            disk_force_clean_ratio: 0.85,
            ..Default::default()
        };
        let now = 1000 * H;
        let segs = ages(&[
            Some(now - 100 * H),
            Some(now - H),
            Some(now - 100 * H),
            None,
        ]);
        let at = |ratio| RetentionClock {
            now_ms: now,
            local_hour: 3,
            disk_used_ratio: ratio,
        };
        assert_eq!(
            segments_due(&cfg, &segs, at(0.8)),
            SegmentsDue {
                expired: 1,
                forced: 0
            }
        );
        assert_eq!(
            segments_due(&cfg, &segs, at(0.9)),
            SegmentsDue {
                expired: 1,
                forced: 3
            }
        );
    }

    #[test]
    fn stops_at_the_first_young_segment_and_at_the_batch_cap() {
        let cfg = RetentionConfig {
            delete_files_batch_max: 1,
            ..Default::default()
        };
        let now = 1000 * H;
        let segs = ages(&[Some(now - 100 * H), Some(now - 100 * H), None]);
        let clock = RetentionClock {
            now_ms: now,
            local_hour: 4,
            disk_used_ratio: 0.0,
        };
        assert_eq!(segments_to_delete(&cfg, &segs, clock), 1);
        let segs = ages(&[Some(now - H), Some(now - 100 * H), None]);
        assert_eq!(
            segments_to_delete(&RetentionConfig::default(), &segs, clock),
            0
        );
    }
}
