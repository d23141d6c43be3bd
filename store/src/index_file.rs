//! RocketMQ's IndexFile (`IndexFile.java` / `IndexHeader.java` / `IndexService.java`):
//! a hash index from `"{topic}#{key}"` (message keys and the message id) to CommitLog
//! physical offsets, and [`IndexService`], the ordered set of index files.
//!
//! # Layout of one file (big-endian, byte compatible with RocketMQ)
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0  | 8 | begin_timestamp i64 | store timestamp (ms) of the first indexed record, 0 while empty |
//! | 8  | 8 | end_timestamp i64 | largest store timestamp (ms) indexed |
//! | 16 | 8 | begin_phy_offset i64 | CommitLog offset the file starts at (= its file name) |
//! | 24 | 8 | end_phy_offset i64 | CommitLog offset of the last indexed record |
//! | 32 | 4 | hash_slot_count i32 | number of slots that are not empty |
//! | 36 | 4 | index_count i32 | as RocketMQ: number of the *next* entry, i.e. entries written + 1 (1 when empty) |
//! | 40 | 4 × `hash_slot_num` | slots i32 | number of the newest entry of the slot, 0 = empty |
//! | 40 + 4 × `hash_slot_num` | 20 × `index_num` | entries | entry `n` at `40 + 4 × hash_slot_num + 20 × n` |
//!
//! An entry is `key_hash i32` (+0), `phy_offset i64` (+4), `time_diff i32` (+12, whole
//! seconds since begin_timestamp, clamped to `[0, i32::MAX]`), `prev_index i32` (+16,
//! the previous entry of the same slot, 0 = none). Entry numbers start at 1 because 0
//! means "none", so, as in RocketMQ, entry 0's 20 bytes are unused and one file holds
//! `index_num - 1` entries. `key_hash = |java_string_hash("{topic}#{key}")|` (`i32::MIN`
//! maps to 0) and `slot = key_hash % hash_slot_num`. An entry older than begin_timestamp
//! (clock stepped back) gets time_diff 0.
//!
//! # Differences from RocketMQ
//!
//! - Files are named by the 20-digit zero-padded begin_phy_offset of the first record
//!   they index ([`segment_name`]) instead of a wall-clock timestamp, so their order and
//!   crash recovery need no clock.
//! - The header (with begin_phy_offset) is written and flushed when the file is created;
//!   the file and directory are fsynced then too.
//! - A full file is flushed (`MS_SYNC`) before the next one is created.
//! - end_timestamp is the largest timestamp seen, not the last one, and a query keeps
//!   walking a chain past entries older than its range (RocketMQ stops there): a leader
//!   whose clock is behind cannot hide older entries.
//! - time_diff has one-second resolution, so an entry matches a query if any instant of
//!   its second lies in `[begin_ms, end_ms]`: results may include records up to 999 ms
//!   before `begin_ms`, never miss one. Callers re-check topic, key (hash collisions)
//!   and, if they need it exactly, the timestamp on the record itself.
//! - As RocketMQ's `buildIndex`, a put below the newest file's end_phy_offset is
//!   ignored (already indexed). A single record with more keys than one file holds
//!   (only with tiny `index_num`) keeps the first ones and drops the rest with a warning.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{IoContext, Result, StoreError};
use crate::mapped_file::{fsync_dir, list_segment_starts, segment_name, MappedFile};
use crate::record::{java_string_hash, RecordView, PROPERTY_KEYS, PROPERTY_UNIQ_KEY};

/// RocketMQ's default number of hash slots per index file (`maxHashSlotNum`).
pub const DEFAULT_HASH_SLOT_NUM: u32 = 5_000_000;
/// RocketMQ's default number of 20-byte entry positions per index file (`maxIndexNum`).
pub const DEFAULT_INDEX_NUM: u32 = 20_000_000;
/// Size of the header in bytes.
pub const HEADER_BYTES: u64 = 40;
/// Size of one hash slot in bytes.
pub const SLOT_BYTES: u64 = 4;
/// Size of one entry in bytes.
pub const ENTRY_BYTES: u64 = 20;
/// Separator of the keys in the `KEYS` property (RocketMQ's `KEY_SEPARATOR`).
pub const KEY_SEPARATOR: char = ' ';

/// Size in bytes of an index file with the given geometry.
pub fn index_file_size_bytes(hash_slot_num: u32, index_num: u32) -> u64 {
    HEADER_BYTES + SLOT_BYTES * u64::from(hash_slot_num) + ENTRY_BYTES * u64::from(index_num)
}

/// The non-negative key hash stored in an entry for `key` of `topic`.
pub fn index_key_hash(topic: &str, key: &str) -> i32 {
    let h = java_string_hash(&format!("{topic}#{key}")).wrapping_abs();
    h.max(0) // wrapping_abs(i32::MIN) == i32::MIN, mapped to 0 as RocketMQ does
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn corrupted(path: &Path, file_offset: u64, reason: String) -> StoreError {
    let path = path.to_path_buf();
    StoreError::Corrupted {
        path,
        file_offset,
        reason,
    }
}

/// The header, kept in memory and rewritten after every put.
#[derive(Debug, Clone, Copy)]
struct Header {
    begin_timestamp_ms: i64,
    end_timestamp_ms: i64,
    begin_phy_offset: u64,
    end_phy_offset: u64,
    hash_slot_count: u32,
    index_count: u32,
}

impl Header {
    fn empty(begin_phy_offset: u64) -> Self {
        Self {
            begin_timestamp_ms: 0,
            end_timestamp_ms: 0,
            begin_phy_offset,
            end_phy_offset: begin_phy_offset,
            hash_slot_count: 0,
            index_count: 1,
        }
    }

    fn encode(&self) -> [u8; HEADER_BYTES as usize] {
        let mut b = [0u8; HEADER_BYTES as usize];
        b[0..8].copy_from_slice(&self.begin_timestamp_ms.to_be_bytes());
        b[8..16].copy_from_slice(&self.end_timestamp_ms.to_be_bytes());
        b[16..24].copy_from_slice(&(self.begin_phy_offset as i64).to_be_bytes());
        b[24..32].copy_from_slice(&(self.end_phy_offset as i64).to_be_bytes());
        b[32..36].copy_from_slice(&(self.hash_slot_count as i32).to_be_bytes());
        b[36..40].copy_from_slice(&(self.index_count as i32).to_be_bytes());
        b
    }

    /// Decodes and checks the header of `map` (whose name is its start offset).
    fn decode(map: &MappedFile, slots: u32, index_num: u32) -> Result<Self> {
        let (b, name_offset) = (map.slice(0, HEADER_BYTES as usize), map.start_offset());
        let (begin_ts, end_ts) = (be_i64(b, 0), be_i64(b, 8));
        let (begin_phy, end_phy) = (be_i64(b, 16), be_i64(b, 24));
        let (slot_count, index_count) = (be_i32(b, 32), be_i32(b, 36));
        if index_count == 0 && b.iter().all(|&x| x == 0) {
            // Created, then a crash before the header reached the disk: empty file.
            return Ok(Self::empty(name_offset));
        }
        let bad = |at: u64, reason: String| Err(corrupted(map.path(), at, reason));
        let entries = i64::from(index_count) - 1;
        if index_count < 1 || index_count as u32 > index_num {
            return bad(
                36,
                format!("index_count {index_count} > {index_num} or < 1"),
            );
        }
        if begin_phy < 0 || begin_phy as u64 != name_offset {
            return bad(16, format!("begin_phy_offset {begin_phy} != name"));
        }
        if end_phy < begin_phy {
            return bad(24, format!("end_phy_offset {end_phy} < begin"));
        }
        if slot_count < 0 || i64::from(slot_count) > entries.min(slots.into()) {
            return bad(32, format!("hash_slot_count {slot_count} insane"));
        }
        if entries > 0 && end_ts < begin_ts {
            return bad(8, format!("end_timestamp {end_ts} < begin"));
        }
        Ok(Self {
            begin_timestamp_ms: begin_ts,
            end_timestamp_ms: end_ts,
            begin_phy_offset: begin_phy as u64,
            end_phy_offset: end_phy as u64,
            hash_slot_count: slot_count as u32,
            index_count: index_count as u32,
        })
    }
}

/// One mapped index file and its in-memory header.
struct IndexFile {
    map: MappedFile,
    header: Header,
}

impl IndexFile {
    fn is_empty(&self) -> bool {
        self.header.index_count <= 1
    }

    fn read_i32(&self, pos: u64) -> i32 {
        be_i32(self.map.slice(pos, 4), 0)
    }
}

/// All index files of a store, oldest first; one writer (dispatch), concurrent queries.
pub struct IndexService {
    dir: PathBuf,
    hash_slot_num: u32,
    index_num: u32,
    files: RwLock<Vec<IndexFile>>,
}

impl IndexService {
    /// Opens (creating `dir` if needed) the index files under `dir` (normally
    /// `<store_root>/index/`). Files whose names are not 20 digits are ignored. A file of
    /// the wrong size for `hash_slot_num`/`index_num`, with an insane header, or that
    /// overlaps the previous file gives `Corrupted`. `hash_slot_num` must be ≥ 1 and
    /// `index_num` in `[2, i32::MAX]` (`Config` otherwise).
    pub fn open(dir: &Path, hash_slot_num: u32, index_num: u32) -> Result<Self> {
        if hash_slot_num == 0 || hash_slot_num > i32::MAX as u32 {
            let msg = format!("hash_slot_num {hash_slot_num} outside [1, i32::MAX]");
            return Err(StoreError::Config(msg));
        }
        if !(2..=i32::MAX as u32).contains(&index_num) {
            let msg = format!("index_num {index_num} outside [2, i32::MAX]");
            return Err(StoreError::Config(msg));
        }
        let size_bytes = index_file_size_bytes(hash_slot_num, index_num);
        let starts = list_segment_starts(dir)?;
        let mut files: Vec<IndexFile> = Vec::with_capacity(starts.len());
        let newest = starts.last().copied();
        for start in starts {
            let path = dir.join(segment_name(start));
            let len = std::fs::metadata(&path).at(&path)?.len();
            if len == 0 && Some(start) == newest {
                // A crash between creating the newest file and sizing it: it holds
                // nothing durable (derived data; recovery re-indexes its records).
                tracing::warn!(path = %path.display(), len, "dropping a partly created index file");
                std::fs::remove_file(&path).at(&path)?;
                fsync_dir(dir)?;
                continue;
            }
            if len != size_bytes {
                let reason = format!("index file is {len} bytes, expected {size_bytes}");
                return Err(corrupted(&path, len.min(size_bytes), reason));
            }
            let map = MappedFile::open(&path, start, size_bytes)?;
            let header = Header::decode(&map, hash_slot_num, index_num)?;
            if files
                .last()
                .is_some_and(|p| start < p.header.end_phy_offset)
            {
                let reason = "begins below the previous file's end_phy_offset".into();
                return Err(corrupted(&path, 16, reason));
            }
            files.push(IndexFile { map, header });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            hash_slot_num,
            index_num,
            files: RwLock::new(files),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<IndexFile>> {
        self.files.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<IndexFile>> {
        self.files.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The directory holding the index files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The begin_phy_offset (= name) of every index file, oldest first.
    pub fn file_begin_phy_offsets(&self) -> Vec<u64> {
        self.read()
            .iter()
            .map(|f| f.header.begin_phy_offset)
            .collect()
    }

    /// Indexes `view`'s `UNIQ_KEY` property and each space-separated key of its `KEYS`
    /// property as `topic#key`, at `phy_offset` (the record's CommitLog offset) with its
    /// store timestamp. Records with neither are skipped. As RocketMQ's `buildIndex`, a
    /// record below the newest file's end_phy_offset is taken as already indexed and skipped.
    pub fn put_record(&self, view: &RecordView, phy_offset: u64) -> Result<()> {
        let all = record_keys(view);
        if all.is_empty() {
            return Ok(());
        }
        self.put_keys(view.topic(), &all, phy_offset, view.store_timestamp_ms())
    }

    /// Indexes a record the newest file skipped (it was damaged when the file was
    /// rebuilt after a crash, and has been written back since), though it lies
    /// below that file's end. Only within the newest file's range (at or after its
    /// first record) and while it has room; otherwise the record is left out (a
    /// warning). Queries still find it; its entry heads its hash chain, so among
    /// its key's results it comes first, not in time order. Errors: `Io`.
    pub fn put_skipped_record(&self, view: &RecordView, phy_offset: u64) -> Result<()> {
        let all = record_keys(view);
        let mut files = self.write();
        let fits = files.last().is_some_and(|f| {
            f.header.begin_phy_offset <= phy_offset
                && f.header.index_count as usize + all.len() <= self.index_num as usize
        });
        if !fits {
            tracing::warn!(
                phy_offset,
                "index: a record written back after damage is not indexed (its file is full or gone)"
            );
            return Ok(());
        }
        let f = files.last_mut().expect("checked above");
        for key in all {
            self.put_entry(
                f,
                index_key_hash(view.topic(), key),
                phy_offset,
                view.store_timestamp_ms(),
            );
        }
        Ok(())
    }

    /// Indexes one `key` of `topic` at `phy_offset` with `store_timestamp_ms` (same rules
    /// as [`IndexService::put_record`]; an empty key is ignored).
    pub fn put_key(
        &self,
        topic: &str,
        key: &str,
        phy_offset: u64,
        store_timestamp_ms: i64,
    ) -> Result<()> {
        if key.is_empty() {
            return Ok(());
        }
        self.put_keys(topic, &[key], phy_offset, store_timestamp_ms)
    }

    fn put_keys(&self, topic: &str, keys: &[&str], phy_offset: u64, ts_ms: i64) -> Result<()> {
        if phy_offset > i64::MAX as u64 {
            let msg = format!("phy offset {phy_offset} exceeds i64::MAX");
            return Err(StoreError::InvalidInput(msg));
        }
        let mut files = self.write();
        if phy_offset < files.last().map_or(0, |f| f.header.end_phy_offset) {
            tracing::debug!(phy_offset, "index: record already indexed, skipped");
            return Ok(());
        }
        for key in keys {
            if !self.ensure_room(&mut files, phy_offset)? {
                tracing::warn!(
                    phy_offset,
                    topic,
                    "index: record has more keys than a file holds"
                );
                return Ok(());
            }
            let f = files.last_mut().expect("ensure_room leaves a file");
            self.put_entry(f, index_key_hash(topic, key), phy_offset, ts_ms);
        }
        Ok(())
    }

    /// Makes the newest file writable: creates the first one, or flushes a full one and
    /// creates the next at `phy_offset`. `false` if that name is already taken.
    fn ensure_room(&self, files: &mut Vec<IndexFile>, phy_offset: u64) -> Result<bool> {
        if let Some(last) = files.last() {
            if last.header.index_count < self.index_num {
                return Ok(true);
            }
            if last.header.begin_phy_offset == phy_offset {
                return Ok(false);
            }
            last.map.flush_range(0, last.map.size_bytes())?;
        }
        let size = index_file_size_bytes(self.hash_slot_num, self.index_num);
        let map = MappedFile::create(&self.dir, phy_offset, size)?;
        let header = Header::empty(phy_offset);
        map.write_at(0, &header.encode());
        map.flush_range(0, HEADER_BYTES)?;
        tracing::info!(path = %map.path().display(), "index: new index file");
        files.push(IndexFile { map, header });
        Ok(true)
    }

    /// Writes the entry, then the slot, then the header (room is checked by the caller).
    fn put_entry(&self, f: &mut IndexFile, hash: i32, phy_offset: u64, ts_ms: i64) {
        let slot_pos = HEADER_BYTES + SLOT_BYTES * u64::from(hash as u32 % self.hash_slot_num);
        let n = f.header.index_count;
        let old = f.read_i32(slot_pos);
        let prev = if old >= 1 && (old as u32) < n { old } else { 0 };
        if n == 1 {
            f.header.begin_timestamp_ms = ts_ms;
            f.header.end_timestamp_ms = ts_ms;
        }
        let diff_s = (i128::from(ts_ms) - i128::from(f.header.begin_timestamp_ms)) / 1000;
        let time_diff = diff_s.clamp(0, i128::from(i32::MAX)) as i32;
        let mut e = [0u8; ENTRY_BYTES as usize];
        e[0..4].copy_from_slice(&hash.to_be_bytes());
        e[4..12].copy_from_slice(&(phy_offset as i64).to_be_bytes());
        e[12..16].copy_from_slice(&time_diff.to_be_bytes());
        e[16..20].copy_from_slice(&prev.to_be_bytes());
        f.map.write_at(self.entry_pos(n), &e);
        f.map.write_at(slot_pos, &(n as i32).to_be_bytes());
        if prev == 0 {
            f.header.hash_slot_count = (f.header.hash_slot_count + 1).min(self.hash_slot_num);
        }
        f.header.index_count = n + 1;
        // A skipped record indexed late lies below the end.
        f.header.end_phy_offset = f.header.end_phy_offset.max(phy_offset);
        f.header.end_timestamp_ms = f.header.end_timestamp_ms.max(ts_ms);
        f.map.write_at(0, &f.header.encode());
    }

    fn entry_pos(&self, n: u32) -> u64 {
        HEADER_BYTES + SLOT_BYTES * u64::from(self.hash_slot_num) + ENTRY_BYTES * u64::from(n)
    }

    /// Physical offsets of candidate records for `key` of `topic` stored in
    /// `[begin_ms, end_ms]` (at one-second resolution, see the module docs), newest
    /// first, without duplicates, at most `max_results`. Candidates share the key's hash
    /// only: the caller must re-check topic and key on each record. A damaged chain is
    /// cut short (with a warning), never followed outside the file or in a loop.
    pub fn query(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if max_results == 0 || begin_ms > end_ms {
            return Ok(out);
        }
        let hash = index_key_hash(topic, key);
        let slot_pos = HEADER_BYTES + SLOT_BYTES * u64::from(hash as u32 % self.hash_slot_num);
        let mut seen = HashSet::new();
        let files = self.read();
        for f in files.iter().rev() {
            let h = &f.header;
            if f.is_empty() || h.begin_timestamp_ms > end_ms || h.end_timestamp_ms < begin_ms {
                continue;
            }
            let mut n = f.read_i32(slot_pos);
            if n < 0 || n as u32 >= h.index_count {
                tracing::warn!(path = %f.map.path().display(), slot_pos, n, "index: slot out of range, ignored");
                continue;
            }
            while n > 0 {
                let pos = self.entry_pos(n as u32);
                let e = f.map.slice(pos, ENTRY_BYTES as usize);
                let (e_hash, phy, diff, prev) =
                    (be_i32(e, 0), be_i64(e, 4), be_i32(e, 12), be_i32(e, 16));
                if phy < 0 || diff < 0 {
                    tracing::warn!(path = %f.map.path().display(), pos, "index: bad entry, chain cut");
                    break;
                }
                let t = h.begin_timestamp_ms.saturating_add(i64::from(diff) * 1000);
                if e_hash == hash
                    && t <= end_ms
                    && t.saturating_add(999) >= begin_ms
                    && seen.insert(phy)
                {
                    out.push(phy as u64);
                    if out.len() >= max_results {
                        return Ok(out);
                    }
                }
                if prev < 0 || prev >= n {
                    tracing::warn!(path = %f.map.path().display(), pos, prev, "index: prev_index not below its entry, chain cut");
                    break;
                }
                n = prev;
            }
        }
        Ok(out)
    }

    /// Durably writes the newest (active) file: `MS_SYNC` of its header, slots and the
    /// entries written so far.
    pub fn flush(&self) -> Result<()> {
        let files = self.read();
        match files.last() {
            Some(f) => f.map.flush_range(0, self.entry_pos(f.header.index_count)),
            None => Ok(()),
        }
    }

    /// begin_phy_offset of the newest file, `None` without files.
    pub fn last_file_begin_phy_offset(&self) -> Option<u64> {
        self.read().last().map(|f| f.header.begin_phy_offset)
    }

    /// end_phy_offset of the newest file: the CommitLog offset of the last indexed
    /// record (its begin offset if it is still empty), `None` without files.
    pub fn end_phy_offset(&self) -> Option<u64> {
        self.read().last().map(|f| f.header.end_phy_offset)
    }

    /// Deletes the newest file (crash recovery drops the only file written after the
    /// last checkpoint and re-indexes from its begin offset) and fsyncs the directory.
    /// Returns that begin_phy_offset, `None` without files.
    pub fn remove_last_file(&self) -> Result<Option<u64>> {
        let mut files = self.write();
        let Some(f) = files.pop() else {
            return Ok(None);
        };
        let (path, begin) = (f.map.path().to_path_buf(), f.header.begin_phy_offset);
        drop(f);
        std::fs::remove_file(&path).at(&path)?;
        fsync_dir(&self.dir)?;
        Ok(Some(begin))
    }

    /// Retention: deletes, oldest first, files whose end_phy_offset < `min_phy_offset`,
    /// never the newest (active) one; fsyncs the directory. Returns how many were deleted.
    pub fn remove_files_below(&self, min_phy_offset: u64) -> Result<usize> {
        let mut files = self.write();
        let mut n = 0;
        while files.len() > 1 && files[0].header.end_phy_offset < min_phy_offset {
            let f = files.remove(0);
            std::fs::remove_file(f.map.path()).at(f.map.path())?;
            n += 1;
        }
        if n > 0 {
            fsync_dir(&self.dir)?;
        }
        Ok(n)
    }
}

/// The keys a record is indexed under: its message id (UNIQ_KEY) and each of its
/// KEYS, empty ones left out.
fn record_keys<'a>(view: &RecordView<'a>) -> Vec<&'a str> {
    let uniq = view.property(PROPERTY_UNIQ_KEY).into_iter();
    let keys = view
        .property(PROPERTY_KEYS)
        .into_iter()
        .flat_map(|k| k.split(KEY_SEPARATOR));
    uniq.chain(keys).filter(|k| !k.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encode_into, encode_properties, encoded_len, MessageRecord, Placement};
    use proptest::prelude::*;

    const ALL: (i64, i64) = (i64::MIN, i64::MAX);

    fn svc(dir: &Path, slots: u32, entries: u32) -> IndexService {
        IndexService::open(dir, slots, entries).unwrap()
    }

    fn q(s: &IndexService, topic: &str, key: &str, range: (i64, i64), max: usize) -> Vec<u64> {
        s.query(topic, key, range.0, range.1, max).unwrap()
    }

    /// What a full-range query must return: every put whose key hash equals the
    /// queried key's, newest first, without duplicates.
    fn expected(puts: &[(&str, &str, u64)], topic: &str, key: &str) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for &(t, k, off) in puts.iter().rev() {
            if index_key_hash(t, k) == index_key_hash(topic, key) && !out.contains(&off) {
                out.push(off);
            }
        }
        out
    }

    #[test]
    fn put_then_query_newest_first_filtered_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let s = svc(dir.path(), 8, 64);
        let puts = [("T", "k1", 100), ("T", "k2", 150), ("U", "k1", 175)];
        let puts = [&puts[..], &[("T", "k1", 200), ("T", "k1", 300)]].concat();
        for (i, &(t, k, off)) in puts.iter().enumerate() {
            s.put_key(t, k, off, 1_000 * (i as i64 + 1)).unwrap(); // 1 s apart
        }
        assert_ne!(index_key_hash("T", "k1"), index_key_hash("U", "k1"));
        let got = q(&s, "T", "k1", ALL, 10);
        assert_eq!(got, expected(&puts, "T", "k1"));
        assert!(got.starts_with(&[300, 200]) && got.contains(&100) && !got.contains(&175));
        assert_eq!(q(&s, "T", "k1", ALL, 2), vec![300, 200]);
        assert!(q(&s, "T", "k1", ALL, 0).is_empty());
        assert_eq!(q(&s, "T", "k1", (4_000, 4_999), 10), vec![200]);
        assert_eq!(q(&s, "T", "k1", (3_000, 4_000), 10), vec![200]);
        assert!(q(&s, "T", "k1", (6_000, 9_000), 10).is_empty());
        // One-second resolution: a range inside the record's second finds it.
        assert_eq!(q(&s, "T", "k1", (4_500, 4_600), 10), vec![200]);
        s.put_key("T", "k1", 300, 5_000).unwrap(); // re-indexed record: no duplicate
        assert_eq!(q(&s, "T", "nope", ALL, 10), expected(&puts, "T", "nope"));
        assert_eq!(
            (s.last_file_begin_phy_offset(), s.end_phy_offset()),
            (Some(100), Some(300))
        );
        s.put_key("T", "k1", 250, 9_000).unwrap(); // below end_phy_offset: already indexed
        assert_eq!(q(&s, "T", "k1", ALL, 10), got);
        let min_key = "\u{1082}:&*+"; // java hash of "T#" + min_key is i32::MIN
        assert_eq!(java_string_hash(&format!("T#{min_key}")), i32::MIN);
        assert_eq!(index_key_hash("T", min_key), 0);
        s.put_key("T", min_key, 400, 5_000).unwrap();
        assert_eq!(q(&s, "T", min_key, ALL, 1), vec![400]);
        s.flush().unwrap();
    }

    fn record(props: &[(&str, &str)], ts: i64) -> Vec<u8> {
        let mut m = MessageRecord::message("Topic", 0, b"body".to_vec(), ts);
        for (k, v) in props {
            m = m.with_property(k, v);
        }
        let (p, mut out) = (encode_properties(&m.properties), Vec::new());
        let at = Placement {
            term: 1,
            log_index: 1,
            entry_remaining: 0,
            physical_offset: 0,
        };
        encode_into(&mut out, &m, &p, encoded_len(&m, &p).unwrap(), at);
        out
    }

    #[test]
    fn put_record_indexes_message_id_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = svc(dir.path(), 16, 4); // 3 entries per file
        let put = |props: &[(&str, &str)], off| {
            let bytes = record(props, 5_000);
            let view = RecordView::parse(&bytes).unwrap();
            s.put_record(&view, off).unwrap()
        };
        put(&[("TAGS", "a")], 0);
        assert_eq!(s.end_phy_offset(), None, "no keys, no file");
        put(&[(PROPERTY_UNIQ_KEY, "ID"), (PROPERTY_KEYS, "a  b")], 64);
        for k in ["ID", "a", "b"] {
            assert_eq!(q(&s, "Topic", k, (5_000, 5_000), 5), vec![64], "key {k}");
        }
        assert!(q(&s, "Other", "a", ALL, 5).is_empty());
        // More keys than a file holds, in one record: the surplus is dropped, no error.
        put(&[(PROPERTY_KEYS, "c d e f g h i")], 100);
        assert_eq!(s.file_begin_phy_offsets(), vec![64, 100]);
        assert_eq!(q(&s, "Topic", "e", ALL, 5), vec![100]);
        assert!(q(&s, "Topic", "f", ALL, 5).is_empty());
    }

    #[test]
    fn rollover_reopen_and_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let s = svc(dir.path(), 8, 4); // 3 entries per file
        let mut puts = Vec::new();
        for i in 0..10u64 {
            let key = ["even", "odd"][i as usize % 2];
            s.put_key("T", key, i * 10, 1_000 * i as i64).unwrap();
            puts.push(("T", key, i * 10));
        }
        assert_eq!(s.file_begin_phy_offsets(), vec![0, 30, 60, 90]);
        let (even, odd) = (expected(&puts, "T", "even"), expected(&puts, "T", "odd"));
        assert_eq!(even.iter().filter(|&&o| o % 20 == 0).count(), 5);
        assert_eq!(q(&s, "T", "even", ALL, 100), even);
        assert_eq!(q(&s, "T", "odd", ALL, 100), odd);
        assert_eq!(q(&s, "T", "even", (2_000, 4_000), 100), vec![40, 20]);
        drop(s);
        let slot = |k| index_key_hash("T", k) as u32 % 8;
        let used_slots = if slot("even") == slot("odd") { 1 } else { 2 };
        let b = std::fs::read(dir.path().join(segment_name(0))).unwrap();
        assert_eq!((be_i32(&b, 32), be_i32(&b, 36)), (used_slots, 4));
        let s = svc(dir.path(), 8, 4);
        assert_eq!(q(&s, "T", "even", ALL, 100), even);
        assert_eq!(s.remove_last_file().unwrap(), Some(90));
        assert!(!q(&s, "T", "odd", ALL, 100).contains(&90));
        assert_eq!(s.end_phy_offset(), Some(80));
        s.put_key("T", "odd", 90, 9_000).unwrap();
        assert_eq!(q(&s, "T", "odd", ALL, 100), odd);
        assert_eq!(s.file_begin_phy_offsets(), vec![0, 30, 60, 90]);
        assert_eq!(s.remove_files_below(21).unwrap(), 1); // file 0 ends at 20
        assert_eq!(s.remove_files_below(u64::MAX).unwrap(), 2); // not the active one
        assert_eq!(q(&s, "T", "odd", ALL, 100), vec![90]);
        drop(s);
        let s = svc(dir.path(), 8, 4);
        assert_eq!(s.file_begin_phy_offsets(), vec![90]);
        assert_eq!(s.remove_last_file().unwrap(), Some(90));
        assert_eq!(s.remove_last_file().unwrap(), None);
    }

    fn patch(path: &Path, at: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(bytes, at).unwrap();
    }

    #[test]
    fn corrupted_headers_and_sizes_are_rejected() {
        let bad: [(u64, i64); 7] = [
            (36, 17),
            (36, -1),
            (32, 9),
            (16, 5),
            (24, 0),
            (8, 0),
            (0, 9e9 as i64),
        ];
        for (at, v) in bad {
            let dir = tempfile::tempdir().unwrap();
            let s = svc(dir.path(), 8, 16);
            s.put_key("T", "a", 100, 1_000).unwrap();
            s.put_key("T", "b", 200, 2_000).unwrap();
            drop(s);
            let (v8, v4) = (v.to_be_bytes(), (v as i32).to_be_bytes());
            let bytes = if at >= 32 { &v4[..] } else { &v8[..] };
            patch(&dir.path().join(segment_name(100)), at, bytes);
            let err = IndexService::open(dir.path(), 8, 16).err();
            let got_at = match err {
                Some(StoreError::Corrupted { file_offset, .. }) => Some(file_offset),
                _ => None,
            };
            assert_eq!(got_at, Some(at.max(8)), "patch at {at}");
        }
        let dir = tempfile::tempdir().unwrap();
        svc(dir.path(), 8, 16).put_key("T", "a", 0, 1).unwrap();
        let open = |slots, entries| IndexService::open(dir.path(), slots, entries);
        assert!(matches!(open(8, 17), Err(StoreError::Corrupted { .. }))); // size
        assert!(matches!(open(0, 16), Err(StoreError::Config(_))));
        // A file created but whose header never reached the disk is an empty file.
        let dir = tempfile::tempdir().unwrap();
        MappedFile::create(dir.path(), 5, index_file_size_bytes(8, 16)).unwrap();
        let s = svc(dir.path(), 8, 16);
        s.put_key("T", "a", 9, 1).unwrap();
        assert_eq!(q(&s, "T", "a", ALL, 10), vec![9]);
    }

    #[test]
    fn corrupted_chains_are_cut_not_looped() {
        let dir = tempfile::tempdir().unwrap();
        let s = svc(dir.path(), 1, 16); // one slot: every key in one chain
        for off in [10u64, 20, 30] {
            s.put_key("T", "k", off, 1_000).unwrap();
        }
        drop(s);
        let path = dir.path().join(segment_name(10));
        let entry = |n: u64| HEADER_BYTES + SLOT_BYTES + ENTRY_BYTES * n;
        let run = || {
            let (tx, rx) = std::sync::mpsc::channel();
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || tx.send(q(&svc(&dir, 1, 16), "T", "k", ALL, 100)));
            let limit = std::time::Duration::from_secs(10);
            rx.recv_timeout(limit).expect("query looped")
        };
        patch(&path, entry(2) + 16, &2i32.to_be_bytes()); // entry 2 points to itself
        assert_eq!(run(), vec![30, 20]);
        patch(&path, entry(2) + 16, &3i32.to_be_bytes()); // entry 2 points forward
        assert_eq!(run(), vec![30, 20]);
        patch(&path, entry(3) + 16, &i32::MAX.to_be_bytes()); // out of the file
        assert_eq!(run(), vec![30]);
        patch(&path, HEADER_BYTES, &99i32.to_be_bytes()); // slot beyond index_count
        assert!(run().is_empty());
        patch(&path, HEADER_BYTES, &3i32.to_be_bytes());
        patch(&path, entry(3) + 4, &(-1i64).to_be_bytes()); // negative phy offset
        assert!(run().is_empty());
    }

    #[test]
    fn queries_run_while_a_writer_puts() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(svc(dir.path(), 4, 8));
        let s2 = s.clone();
        let w = std::thread::spawn(move || {
            (0..500u64).for_each(|i| s2.put_key("T", "k", i, 0).unwrap())
        });
        for _ in 0..200 {
            let got = q(&s, "T", "k", ALL, 1_000);
            assert!(got.windows(2).all(|w| w[0] == w[1] + 1)); // newest first, no gap
        }
        w.join().unwrap();
        let all: Vec<u64> = (0..500).rev().collect();
        assert_eq!(q(&s, "T", "k", ALL, 1_000), all);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn queries_match_a_model(ops in proptest::collection::vec((0usize..2, 0usize..6, 1u64..3), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let s = svc(dir.path(), 3, 5);
            let (topics, keys) = (["A", "B"], ["a", "b", "c", "d", "e", "ff"]);
            let (mut off, mut puts) = (0u64, Vec::new());
            for (t, k, step) in ops {
                off += step;
                s.put_key(topics[t], keys[k], off, off as i64 * 1_000).unwrap();
                puts.push((topics[t], keys[k], off));
            }
            let reopened = svc(dir.path(), 3, 5);
            for (t, k) in topics.iter().flat_map(|t| keys.iter().map(move |k| (*t, *k))) {
                prop_assert_eq!(q(&s, t, k, ALL, 1_000), expected(&puts, t, k));
                prop_assert_eq!(q(&reopened, t, k, ALL, 1_000), expected(&puts, t, k));
            }
        }
    }
}
