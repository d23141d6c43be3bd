//! A reserve of disk space (`<store root>/reserve`, an allocated file of
//! `retention.disk_reserve_bytes`), given up as soon as less than half of it is
//! free ([`crate::room`]: the metadata database must keep room) or when a
//! committed entry cannot be applied for want of space: new messages are refused
//! long before (see `MessageStore::check_room_for_writes`), but entries already
//! committed must still be applied on every replica, and a replica that cannot
//! apply them stalls. The reserve is made again once the disk has room (each
//! retention run asks).

use crate::error::{IoContext, Result};
use crate::store::MessageStore;

impl MessageStore {
    fn reserve_path(&self) -> std::path::PathBuf {
        self.config().root.join("reserve")
    }

    /// Makes the reserve file if it is missing (or short), the disk is below
    /// `disk_space_warning_ratio` and the metadata floor stays free after it
    /// ([`crate::room::may_make_file`]: on a small disk a reserve made here would
    /// otherwise be given up again at the next measurement); no error if there is
    /// no room for it (it is made on a later call). Errors: `Io` other than a full disk (e.g. a file system
    /// without fallocate); callers log them and go on, the reserve being optional.
    pub fn ensure_disk_reserve(&self) -> Result<()> {
        let bytes = self.config().retention.disk_reserve_bytes;
        let path = self.reserve_path();
        // A file shorter than asked (a crash between its creation and its
        // allocation) is made again.
        let whole = std::fs::metadata(&path).is_ok_and(|m| m.len() >= bytes);
        if bytes == 0 || whole {
            return Ok(());
        }
        if self.disk_used_ratio()? > self.config().retention.disk_space_warning_ratio {
            return Ok(());
        }
        let available = crate::room::available_bytes(&self.config().root)?;
        if !crate::room::may_make_file(available, bytes, self.metadata_floor_bytes()) {
            return Ok(());
        }
        let file = std::fs::File::create(&path).at(&path)?;
        let made = fs4::fs_std::FileExt::allocate(&file, bytes)
            .and_then(|_| file.sync_all())
            .at(&path);
        if let Err(e) = made {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return if e.is_no_space() { Ok(()) } else { Err(e) };
        }
        crate::mapped_file::fsync_dir(&self.config().root)
    }

    /// Deletes the reserve file, if there is one, to free its space; returns
    /// whether it did. Errors: `Io`.
    pub fn release_disk_reserve(&self) -> Result<bool> {
        let path = self.reserve_path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::error!(path = %path.display(), "the disk is full: released the reserve (room for metadata and committed entries); free space");
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).at(&path),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{MessageStore, StoreConfig};

    #[test]
    fn the_reserve_is_made_released_and_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::small(dir.path(), 64 * 1024);
        cfg.retention.disk_reserve_bytes = 128 * 1024;
        let store = MessageStore::open(cfg).unwrap();
        let path = dir.path().join("reserve");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 128 * 1024);
        assert!(store.release_disk_reserve().unwrap());
        assert!(!path.exists());
        assert!(!store.release_disk_reserve().unwrap());
        store.ensure_disk_reserve().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 128 * 1024);
        // A crash between creating the file and allocating it left it empty.
        std::fs::File::create(&path).unwrap();
        store.ensure_disk_reserve().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 128 * 1024);
        store.shutdown().unwrap();
    }
}
