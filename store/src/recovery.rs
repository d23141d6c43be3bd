//! Crash recovery of the CommitLog: scan records from a known-good position, verify
//! each (length, magic, CRC, position, term and log index order, whole entries only),
//! stop at the first damaged or torn one, and erase everything after it.

use std::ops::ControlFlow;

use crate::commit_log::CommitLog;
use crate::error::Result;
use crate::raft_index::EntryLocation;
use crate::record::{parse_header, Header, RecordView};

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
