//! Room on a full disk (issue 14): what the store keeps free for its metadata.
//!
//! A node's disk can fill up under it (another process, an operator's copy). New
//! messages are refused long before (`MessageStore::check_room_for_writes`), but a
//! follower still receives the leader's entries, and the metadata database (sled:
//! commit index, purge point, consumer offsets) poisons itself for good after one failed
//! write, which stops the node. So:
//!
//! - the disk reserve ([`crate::reserve`]) is given up as soon as less than half
//!   its size is free ([`should_release_reserve`]), before sled's next write can
//!   find no room (the node's upkeep checks every 100 ms, and the log store again
//!   after an append that found no space);
//! - a new CommitLog segment is made only if that floor stays free after it
//!   ([`may_make_file`]), so the log never takes the room the reserve gave back.
//!   An append that would need one fails with ENOSPC and changes nothing: the Raft
//!   layer waits and appends it again once space is freed. ConsumeQueue and Raft
//!   index files are not held to the floor (they grow by tens of bytes per
//!   message): a follower that keeps applying on a full disk can still take the
//!   room from them.
//!
//! The decisions here are plain functions; [`MessageStore::keep_room_for_metadata`]
//! measures the disk and acts.

use std::path::Path;

use crate::error::{Result, StoreError};
use crate::store::MessageStore;

/// Bytes kept free for the metadata database and the store's small files while the
/// disk is full, given a disk reserve of `reserve_bytes`: half of it (0 without a
/// reserve, which turns both rules off).
pub fn metadata_floor_bytes(reserve_bytes: u64) -> u64 {
    reserve_bytes / 2
}

/// Whether to give up the reserve now: it is there and fewer than `floor_bytes`
/// are free (`available_bytes`, as `statvfs` counts them for this process).
pub fn should_release_reserve(
    available_bytes: u64,
    floor_bytes: u64,
    reserve_present: bool,
) -> bool {
    reserve_present && available_bytes < floor_bytes
}

/// Whether a new file of `file_bytes` may be made with `available_bytes` free:
/// only if `floor_bytes` stay free after it (always, with no floor).
pub fn may_make_file(available_bytes: u64, file_bytes: u64, floor_bytes: u64) -> bool {
    floor_bytes == 0 || available_bytes >= file_bytes.saturating_add(floor_bytes)
}

/// Bytes of the file system holding `path` this process can still take
/// (`statvfs`'s `f_bavail`). Errors: `Io`.
pub fn available_bytes(path: &Path) -> Result<u64> {
    fs4::available_space(path).map_err(|source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The operating system's "no space left on device" for `path`, as an append that
/// would break the floor reports it ([`StoreError::is_no_space`] is true).
pub fn no_space(path: &Path) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "no space left on device: the room left is kept for metadata",
        ),
    }
}

impl MessageStore {
    /// Bytes kept free for metadata on a full disk ([`metadata_floor_bytes`]).
    pub fn metadata_floor_bytes(&self) -> u64 {
        metadata_floor_bytes(self.config().retention.disk_reserve_bytes)
    }

    /// Gives up the disk reserve if fewer than [`Self::metadata_floor_bytes`] are
    /// free, so the metadata database has room for its writes (the CommitLog never
    /// takes that room; ConsumeQueue and Raft index files, 20 and a few bytes per
    /// entry, are not held to the floor and can eat into it). Returns
    /// whether it did. Cheap (one `statvfs`); call it often. Errors: `Io`.
    pub fn keep_room_for_metadata(&self) -> Result<bool> {
        let floor = self.metadata_floor_bytes();
        if floor == 0 {
            return Ok(false);
        }
        let root = &self.config().root;
        let present = root.join("reserve").exists();
        if !should_release_reserve(available_bytes(root)?, floor, present) {
            return Ok(false);
        }
        self.release_disk_reserve()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn the_reserve_goes_below_the_floor_and_segments_keep_it_free() {
        let floor = metadata_floor_bytes(64 * M);
        assert_eq!(floor, 32 * M);
        // The jepsen ballast leaves 0, 1 or 16 MiB: each releases it.
        for left in [0, M, 16 * M] {
            assert!(should_release_reserve(left, floor, true));
        }
        assert!(!should_release_reserve(0, floor, false));
        assert!(!should_release_reserve(40 * M, floor, true));
        // After the release (64 MiB more free) no 64 MiB segment may take it.
        assert!(!may_make_file(64 * M + 16 * M, 64 * M, floor));
        assert!(may_make_file(96 * M, 64 * M, floor));
        // No reserve, no floor: the file system decides.
        assert_eq!(metadata_floor_bytes(0), 0);
        assert!(may_make_file(0, 64 * M, 0));
    }

    #[test]
    fn a_segment_that_would_break_the_floor_is_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let q = crate::mapped_file::MappedFileQueue::open(dir.path(), 64 * 1024).unwrap();
        q.find_or_create(0).unwrap();
        q.keep_free(u64::MAX / 2);
        match q.find_or_create(64 * 1024) {
            Err(e) => assert!(e.is_no_space(), "{e}"),
            Ok(_) => panic!("a segment was made that breaks the floor"),
        }
        assert!(q.find(64 * 1024).is_none());
        q.keep_free(0);
        q.find_or_create(64 * 1024).unwrap();
    }
}
