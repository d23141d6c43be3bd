//! Deleting old data: retention by age and disk usage, and Raft log purges.

use crate::error::IoContext;
use crate::error::Result;
use crate::retention::{cleaning_due, segments_due, RetentionClock, SegmentAge, SegmentsDue};
use crate::store::MessageStore;

/// Entries read after a segment to find the first message, which dates it (Raft
/// system entries carry no time); past them the segment file's modification time
/// dates it (RocketMQ dates every segment that way).
const AGE_SCAN_ENTRIES: u64 = 1024;

/// A file's modification time, ms since the Unix epoch. Errors: `Io`.
fn modified_ms(path: &std::path::Path) -> Result<i64> {
    let t = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .at(path)?;
    Ok(match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(_) => 0,
    })
}

/// What one retention run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    /// CommitLog segments deleted.
    pub segments_deleted: usize,
    /// Oldest CommitLog offset kept.
    pub min_offset: u64,
    /// First log index kept.
    pub first_log_index: u64,
}

/// Where retention would cut the CommitLog now ([`MessageStore::retention_offsets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionOffsets {
    /// Segments ending at or before this offset have expired.
    pub expired_below: u64,
    /// Segments ending at or before this offset are what forced cleaning takes
    /// (the oldest offset when the disk is not past `disk_force_clean_ratio`).
    pub forced_below: u64,
}

impl MessageStore {
    /// One retention run of a lone store (call it periodically, e.g. every 10 s as
    /// RocketMQ does): deletes expired or, past `disk_force_clean_ratio`, the
    /// oldest CommitLog segments, consumed or not (a broker group decides through
    /// the Raft layer instead, which spares unconsumed messages), but
    /// never a segment holding entries that are not yet dispatched, nor one past
    /// `limit_offset` (what the Raft layer allows to be purged). ConsumeQueue minimum
    /// offsets and IndexFiles follow.
    pub fn run_retention(&self, clock: RetentionClock, limit_offset: u64) -> Result<PurgeReport> {
        let due = self.retention_offsets(clock)?;
        self.remove_segments_below(due.expired_below.max(due.forced_below).min(limit_offset))
    }

    /// The CommitLog offsets below which retention would delete segments now, by
    /// age and by forced cleaning ([`SegmentsDue`]; the oldest offset where nothing
    /// is due). The Raft layer turns them into the group's retention point. A
    /// segment's age is that of the first message after it: Raft system entries
    /// are stored with store timestamp 0 and never make a segment look expired.
    pub fn retention_offsets(&self, clock: RetentionClock) -> Result<RetentionOffsets> {
        let log = self.commit_log();
        let cfg = &self.config().retention;
        let nothing = RetentionOffsets {
            expired_below: log.min_offset(),
            forced_below: log.min_offset(),
        };
        if !cleaning_due(cfg, clock) {
            return Ok(nothing);
        }
        let segments = log.segments().segments();
        let looked_at = segments.len().min(cfg.delete_files_batch_max);
        let mut ages = Vec::with_capacity(looked_at);
        for (i, segment) in segments.iter().take(looked_at).enumerate() {
            let newest = match segments.get(i + 1) {
                // The next segment holds nothing yet (made ahead by the warm-up):
                // this one is being written.
                Some(next) if next.start_offset() >= log.wrote_offset() => None,
                Some(next) => {
                    match log.first_message_timestamp_ms(next.start_offset(), AGE_SCAN_ENTRIES) {
                        Ok(Some(ts)) => Some(ts),
                        Ok(None) => Some(modified_ms(segment.path())?),
                        // A damaged record does not stop retention for good.
                        Err(e) => {
                            tracing::warn!(error = %e, "dating a CommitLog segment by its file time");
                            Some(modified_ms(segment.path())?)
                        }
                    }
                }
                None => None,
            };
            ages.push(SegmentAge {
                newest_store_timestamp_ms: newest,
            });
        }
        let SegmentsDue { expired, forced } = segments_due(cfg, &ages, clock);
        let below = |n: usize| {
            segments
                .get(n)
                .map_or(nothing.expired_below, |s| s.start_offset())
        };
        Ok(RetentionOffsets {
            expired_below: below(expired),
            forced_below: below(forced),
        })
    }

    /// The CommitLog offset of the oldest message some consumer has not consumed:
    /// for each `(consumer, topic)` of `consumers`, every queue of `topic` this
    /// store holds counts, from the consumer's offset in `offsets` (the next queue
    /// offset it consumes, keyed by (consumer, topic, queue id)) or, where it has
    /// none, from the queue's start. `u64::MAX` when everything is consumed. Forced
    /// cleaning stops there (and before any pending delay message's record:
    /// [`crate::timer_index::TimerIndex::oldest_physical_offset`]). Errors: `Io`,
    /// `Corrupted` (a ConsumeQueue entry that cannot be read or rebuilt).
    pub fn unconsumed_from<'a>(
        &self,
        consumers: impl IntoIterator<Item = (&'a str, &'a str)>,
        offsets: impl Fn(&str, &str, i32) -> Option<u64>,
    ) -> Result<u64> {
        let queues = self.consume_queues().all();
        let mut from = u64::MAX;
        for (consumer, topic) in consumers {
            for ((t, queue_id), cq) in &queues {
                if t != topic {
                    continue;
                }
                let next = offsets(consumer, topic, *queue_id)
                    .unwrap_or(0)
                    .max(cq.min_offset());
                if next < cq.max_offset() {
                    from = from.min(self.queue_entry(cq, next)?.commit_log_offset);
                }
            }
        }
        Ok(from)
    }

    /// The last log index held wholly below CommitLog `offset` (what a Raft purge
    /// through it deletes), if any.
    pub fn last_log_index_below(&self, offset: u64) -> Result<Option<u64>> {
        Ok(self
            .commit_log()
            .last_entry_ending_by(offset)?
            .map(|l| l.log_index))
    }

    /// Deletes whole CommitLog segments all of whose entries have log index <=
    /// `log_index` and are dispatched (Raft `purge` after a snapshot).
    pub fn purge_through(&self, log_index: u64) -> Result<PurgeReport> {
        let log = self.commit_log();
        let next = log.next_log_index();
        if log_index < log.first_log_index() {
            return self.remove_segments_below(log.min_offset());
        }
        if log_index.saturating_add(1) >= next {
            // Keep at least the entry the next one must follow.
            return self.remove_segments_below(
                log.entry_location(next.saturating_sub(1))?.physical_offset,
            );
        }
        self.remove_segments_below(log.entry_location(log_index + 1)?.physical_offset)
    }

    /// Deletes every segment that ends at or before `offset` (and is dispatched).
    fn remove_segments_below(&self, offset: u64) -> Result<PurgeReport> {
        if self.is_closed() {
            return Err(crate::error::StoreError::NotWritable(
                "the store is shut down".into(),
            ));
        }
        let log = self.commit_log();
        let limit = offset.min(self.dispatched_offset());
        // What dispatching the entries below `limit` did to the timer index is
        // made durable first: after a crash they can no longer be dispatched
        // again (recovery starts at the log's first entry).
        self.timers().flush()?;
        // The CommitLog counts what it deleted (comparing file counts before and
        // after once missed a deletion when the warm-up thread created the next
        // segment meanwhile, so the ConsumeQueues kept entries the CommitLog no
        // longer held).
        let (min, deleted) = log.remove_segments(limit, |_, _| true)?;
        if deleted > 0 {
            for (_, cq) in self.consume_queues().all() {
                cq.set_min_commit_log_offset(min)?;
            }
            self.index().remove_files_below(min)?;
            // How the halves whose records went ended is forgotten (an end asked
            // for them again is refused as unknown).
            if let Some(half_queue) = self.consume_queues().get(crate::half_index::HALF_TOPIC, 0) {
                self.timers()
                    .halves()
                    .forget_below(half_queue.min_offset())?;
            }
            tracing::info!(deleted, min_offset = min, "CommitLog segments deleted");
        }
        Ok(PurgeReport {
            segments_deleted: deleted,
            min_offset: min,
            first_log_index: log.first_log_index(),
        })
    }

    /// Refuses new messages while the disk is fuller than
    /// `retention.disk_space_warning_ratio` (measured at most every 100 ms).
    /// Errors: `DiskFull`; `Io` if the disk cannot be measured.
    pub fn check_room_for_writes(&self) -> Result<()> {
        let limit = self.config().retention.disk_space_warning_ratio;
        if limit >= 1.0 {
            return Ok(());
        }
        let used = {
            let mut cached = self.disk_used_cache.lock().unwrap();
            match *cached {
                Some((at, ratio)) if at.elapsed() < std::time::Duration::from_millis(100) => ratio,
                _ => {
                    let ratio = self.disk_used_ratio()?;
                    *cached = Some((std::time::Instant::now(), ratio));
                    ratio
                }
            }
        };
        if used > limit {
            return Err(crate::error::StoreError::DiskFull {
                used_percent: (used * 100.0) as u32,
                limit_percent: (limit * 100.0) as u32,
            });
        }
        Ok(())
    }

    /// Measures the used fraction of the disk holding the store, as `df` and
    /// RocketMQ's `UtilAll.getDiskPartitionSpaceUsedPercent` do (see
    /// [`used_ratio`]). Errors: `Io` if the file system cannot be queried.
    pub fn disk_used_ratio(&self) -> Result<f64> {
        let root = &self.config().root;
        let stats = fs4::statvfs(root).map_err(|e| crate::error::StoreError::Io {
            path: root.clone(),
            source: e,
        })?;
        Ok(used_ratio(
            stats.total_space(),
            stats.free_space(),
            stats.available_space(),
        ))
    }

    /// A retention clock for now: wall clock, local hour, measured disk usage.
    pub fn retention_clock_now(&self) -> Result<RetentionClock> {
        use chrono::Timelike;
        Ok(RetentionClock {
            now_ms: crate::store::now_ms(),
            local_hour: chrono::Local::now().hour(),
            disk_used_ratio: self.disk_used_ratio()?,
        })
    }
}

/// The used fraction of a file system from `statvfs` figures in bytes: used
/// (`total - free`) over what this process could ever hold (`used + available`),
/// as `df`'s "Use%" and RocketMQ's `getDiskPartitionSpaceUsedPercent` compute it.
/// Blocks reserved for root, or held back by a quota, count neither as used nor as
/// room, so a disk with room left never reads as full. 0.0 for an empty or unknown
/// file system.
pub fn used_ratio(total_bytes: u64, free_bytes: u64, available_bytes: u64) -> f64 {
    let used = total_bytes.saturating_sub(free_bytes);
    let reachable = used.saturating_add(available_bytes);
    if reachable == 0 {
        0.0
    } else {
        used as f64 / reachable as f64
    }
}

#[cfg(test)]
mod tests {
    use super::used_ratio;

    #[test]
    fn the_used_ratio_is_dfs_use_percent() {
        const G: u64 = 1 << 30;
        // A 252 GiB file system of which 12 GiB are used and 80 GiB available to
        // us (the rest held back): df says 13 %, not 1 - 80/252 = 68 %.
        let r = used_ratio(252 * G, 240 * G, 80 * G);
        assert!((r - 12.0 / 92.0).abs() < 1e-9, "{r}");
        // Nothing available: full, whatever is reserved.
        assert_eq!(used_ratio(100 * G, 5 * G, 0), 1.0);
        // No reservation: plain used / total.
        assert_eq!(used_ratio(100 * G, 25 * G, 25 * G), 0.75);
        assert_eq!(used_ratio(0, 0, 0), 0.0);
    }
}
