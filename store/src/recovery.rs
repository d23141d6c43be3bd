//! Crash recovery of the CommitLog: scan records from a known-good position, verify
//! each (length, magic, CRC, position, term and log index order, whole entries only),
//! stop at the first damaged or torn one, and erase everything after it.

use std::ops::ControlFlow;

use crate::checkpoint::Checkpoint;
use crate::commit_log::CommitLog;
use crate::config::StoreConfig;
use crate::error::{IoContext, Result};
use crate::raft_index::EntryLocation;
use crate::record::{parse_header, Header, RecordView};
use crate::store::RecoveryReport;

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutcome {
    /// End of the last whole entry: where appends resume.
    pub end_offset: u64,
    /// Log index the next entry must carry.
    pub next_log_index: u64,
    /// Term of the last whole entry (or the starting term).
    pub last_term: u64,
    /// Entries found.
    pub entries: u64,
    /// Where and why the scan stopped early, if it met damage rather than the end.
    pub damage: Option<(u64, String)>,
}

struct Open {
    index: u64,
    term: u64,
    start: u64,
    remaining: u32,
}

/// Scans the CommitLog from physical `start` (an entry boundary). `next_log_index` is
/// the index the first entry must carry (`None`: whatever it carries), `last_term` the
/// term before it. Calls `on_entry` for every whole entry, in order, until it
/// answers `Break` (the outcome then ends with that entry) or the log ends.
pub fn scan(
    log: &CommitLog,
    start: u64,
    next_log_index: Option<u64>,
    last_term: u64,
    mut on_entry: impl FnMut(EntryLocation) -> Result<ControlFlow<()>>,
) -> Result<ScanOutcome> {
    let mut out = ScanOutcome {
        end_offset: start,
        next_log_index: next_log_index.unwrap_or(0),
        last_term,
        entries: 0,
        damage: None,
    };
    let mut expect = next_log_index;
    let mut pos = start;
    let mut open: Option<Open> = None;
    let damaged = |out: &mut ScanOutcome, at: u64, why: String| {
        out.damage = Some((at, why));
    };
    while let Some(f) = log.segments().find(pos) {
        let rel = pos - f.start_offset();
        let room = f.size_bytes() - rel;
        if room < 8 {
            damaged(
                &mut out,
                pos,
                format!("{room} bytes left in the segment, below a record header"),
            );
            break;
        }
        let header = match parse_header(f.slice(rel, 8), room) {
            Ok(h) => h,
            Err(why) => {
                damaged(&mut out, pos, why);
                break;
            }
        };
        match header {
            Header::End => {
                if open.is_some() {
                    damaged(&mut out, pos, "entry ends before its last record".into());
                }
                break;
            }
            Header::Blank { len } => {
                if open.is_some() {
                    damaged(&mut out, pos, "segment padding inside an entry".into());
                    break;
                }
                pos += len;
            }
            Header::Record { len, .. } => {
                let view = match RecordView::parse(f.slice(rel, len as usize)) {
                    Ok(v) => v,
                    Err(why) => {
                        damaged(&mut out, pos, why);
                        break;
                    }
                };
                if view.physical_offset() != pos {
                    damaged(
                        &mut out,
                        pos,
                        format!("record says it is at {}", view.physical_offset()),
                    );
                    break;
                }
                let fits = match &open {
                    Some(o) => {
                        view.log_index() == o.index
                            && view.term() == o.term
                            && view.entry_remaining() + 1 == o.remaining
                    }
                    None => {
                        expect.is_none_or(|e| e == view.log_index()) && view.term() >= out.last_term
                    }
                };
                if !fits {
                    damaged(
                        &mut out,
                        pos,
                        format!(
                            "record (term {}, index {}) breaks the log order",
                            view.term(),
                            view.log_index()
                        ),
                    );
                    break;
                }
                let o = open.get_or_insert(Open {
                    index: view.log_index(),
                    term: view.term(),
                    start: pos,
                    remaining: view.entry_remaining() + 1,
                });
                o.remaining = view.entry_remaining();
                pos += len;
                if o.remaining == 0 {
                    let o = open.take().expect("open entry");
                    let flow = on_entry(EntryLocation {
                        log_index: o.index,
                        term: o.term,
                        physical_offset: o.start,
                        size_bytes: (pos - o.start) as u32,
                    })?;
                    out.end_offset = pos;
                    out.next_log_index = o.index + 1;
                    out.last_term = o.term;
                    out.entries += 1;
                    expect = Some(o.index + 1);
                    if flow.is_break() {
                        break;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Erases whatever lies after `end` (a whole-entry boundary): zeroes every non-zero
/// 4 KiB page from `end` to the end of its segment, fsyncs them, and deletes later
/// segments. Afterwards nothing past `end` can be mistaken for data.
pub fn erase_after(log: &CommitLog, end: u64) -> Result<()> {
    const PAGE: u64 = 4096;
    if let Some(f) = log.segments().find(end) {
        let mut at = end - f.start_offset();
        while at < f.size_bytes() {
            let chunk = (PAGE - at % PAGE).min(f.size_bytes() - at);
            if f.slice(at, chunk as usize).iter().any(|&b| b != 0) {
                f.zero(at, chunk as usize);
                f.flush_range(at, at + chunk)?;
            }
            at += chunk;
        }
    }
    log.segments().remove_segments_after(end)
}

/// A crash interrupted [`MessageStore::reset`]: delete every CommitLog segment below
/// the reset point and the Raft index files (recovery rebuilds the index from the
/// records that follow the reset point).
pub(crate) fn finish_interrupted_reset(cfg: &StoreConfig, cp: &Checkpoint) -> Result<()> {
    let seg = cfg.commit_log.segment_bytes;
    for (dir, keep_later) in [("commitlog", true), ("raftindex", false)] {
        let dir = cfg.root.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut removed = false;
        for e in entries {
            let path = e.at(&dir)?.path();
            let start = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(start) = start {
                if !keep_later || start.saturating_add(seg) <= cp.commit_log_offset {
                    std::fs::remove_file(&path).at(&path)?;
                    removed = true;
                }
            }
        }
        if removed {
            crate::mapped_file::fsync_dir(&dir)?;
        }
    }
    tracing::warn!(
        next_log_index = cp.next_log_index,
        "finished a reset that a crash interrupted"
    );
    Ok(())
}

/// Scans the CommitLog after a crash and rebuilds the Raft index past the checkpoint.
pub(crate) fn recover_log(
    log: &CommitLog,
    checkpoint: Option<Checkpoint>,
    report: &mut RecoveryReport,
) -> Result<()> {
    let min = log.min_offset();
    let idx = log.raft_index();
    // Trust the checkpoint only if the index it vouches for is still there.
    let from_checkpoint = checkpoint.filter(|c| {
        c.commit_log_offset >= min
            && c.next_log_index <= idx.next_index()
            && c.next_log_index >= idx.first_index()
    });
    let (start, next, last_term) = match from_checkpoint {
        Some(c) => (c.commit_log_offset, Some(c.next_log_index), c.last_term),
        None => (min, None, 0),
    };
    let mut first_seen = None;
    let outcome = scan(log, start, next, last_term, |loc| {
        if first_seen.is_none() {
            first_seen = Some(loc.log_index);
            match next {
                Some(n) => idx.truncate(n)?,
                None => idx.reset(loc.log_index)?,
            }
        }
        idx.append(&loc)?;
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    if first_seen.is_none() {
        match (next, checkpoint) {
            (Some(n), _) => idx.truncate(n)?,
            // An empty log (fresh, or reset after a snapshot): the checkpoint knows
            // which index comes next.
            (None, Some(c)) => idx.reset(c.next_log_index)?,
            (None, None) => idx.reset(0)?,
        }
    }
    if let Some((at, why)) = &outcome.damage {
        tracing::warn!(offset = at, reason = %why, "CommitLog damaged or torn; cutting the tail");
    }
    erase_after(log, outcome.end_offset)?;
    log.set_recovered_end(outcome.end_offset, outcome.last_term)?;
    // The recovered tail may have lived only in the killed process's page cache:
    // fsync it before anything treats it as durable.
    log.flush()?;
    log.forget_purged_index_entries()?;
    report.scanned_from = Some(start);
    report.entries_scanned = outcome.entries;
    report.damage = outcome.damage;
    report.end_offset = outcome.end_offset;
    report.next_log_index = log.next_log_index();
    Ok(())
}
