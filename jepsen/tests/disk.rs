//! The storage faults against real files and a real store: a simulated power loss
//! drops exactly the pages the kernel still holds dirty (cachestat(2)) and keeps
//! what was fsynced, to the byte on a file system whose device it can read (a loop
//! device: root only); after a damaged tail, recovery keeps the intact prefix and
//! drops the rest, and the log takes appends again.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::process::Command;

use ledgermq_jepsen::disk::{
    cachestat, damage_tail, drop_unflushed, page_bytes, power_loss, Dropped,
};
use ledgermq_raft::meta::MetaDb;
use ledgermq_store::{MessageRecord, MessageStore, StoreConfig};
use rand::SeedableRng;

/// A directory on the disk the workspace builds on (not a tmpfs, whose pages are
/// never written back).
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn open(path: &std::path::Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

fn read_all(f: &File) -> Vec<u8> {
    let mut b = vec![0u8; f.metadata().unwrap().len() as usize];
    f.read_exact_at(&mut b, 0).unwrap();
    b
}

#[test]
fn unflushed_pages_are_zeroed_and_fsynced_ones_kept() {
    let dir = tempdir();
    let path = dir.path().join("f");
    let page = page_bytes() as usize;
    let f = open(&path);
    f.write_all_at(&vec![0xA5; 16 * page], 0).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(&vec![0x5A; 16 * page], 16 * page as u64)
        .unwrap();
    let before = cachestat(&f, 0, 32 * page as u64).unwrap();
    assert_eq!((before.dirty + before.writeback, before.cached), (16, 32));
    let (d, _) = drop_unflushed(&path).unwrap();
    let unflushed = 16 * page as u64;
    let changed = unflushed;
    assert_eq!(d, Dropped { unflushed, changed });
    let b = read_all(&f);
    assert_eq!(b.len(), 32 * page);
    assert!(
        b[..16 * page].iter().all(|&x| x == 0xA5),
        "fsynced part lost"
    );
    assert!(
        b[16 * page..].iter().all(|&x| x == 0),
        "unflushed part kept"
    );
}

#[test]
fn a_fully_fsynced_file_loses_nothing() {
    let dir = tempdir();
    let path = dir.path().join("f");
    let page = page_bytes() as usize;
    let f = open(&path);
    let want: Vec<u8> = (0..40 * page + 100).map(|i| (i % 251) as u8 + 1).collect();
    f.write_all_at(&want, 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(drop_unflushed(&path).unwrap().0, Dropped::default());
    assert_eq!(read_all(&f), want);
}

/// An ext4 file system on a loop device, mounted in a temporary directory (as the
/// harness gives each node); `None` unless root.
struct LoopFs {
    _dir: tempfile::TempDir,
    mount: std::path::PathBuf,
}

impl LoopFs {
    fn new() -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: a loop device needs root");
            return None;
        }
        let dir = tempdir();
        let (image, mount) = (dir.path().join("fs.img"), dir.path().join("fs"));
        std::fs::create_dir(&mount).unwrap();
        File::create(&image).unwrap().set_len(256 << 20).unwrap();
        let run = |cmd: &mut Command| assert!(cmd.status().unwrap().success(), "{cmd:?}");
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(&image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        Some(Self { _dir: dir, mount })
    }
}

impl Drop for LoopFs {
    /// Unmounts; if the file system is still busy, detaches it lazily, so the
    /// mount never outlives the test. (After `a_new_metadata_db_survives_a_power_loss`
    /// the file system was still busy for over 5 s once the test had dropped what it
    /// opened, so a plain unmount failed and left one mount behind per test run.)
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

/// On a readable device a dirty page gets the device's bytes back: fsynced bytes
/// sharing a page (or a large folio) with later writes survive, those writes do
/// not.
#[test]
fn a_page_written_after_its_fsync_gets_the_disk_bytes_back() {
    let Some(fs) = LoopFs::new() else { return };
    let page = page_bytes() as usize;
    let path = fs.mount.join("f");
    let f = open(&path);
    // Preallocated, as CommitLog segments are.
    f.set_len(64 * page as u64).unwrap();
    let mut want = vec![0u8; 64 * page];
    want[..32 * page + 100].fill(0xA5);
    f.write_all_at(&want[..32 * page + 100], 0).unwrap();
    f.sync_all().unwrap();
    // The page the fsynced bytes end in, one byte inside a folio written whole,
    // and a page of its own.
    f.write_all_at(&[0x5A; 300], 32 * page as u64 + 100)
        .unwrap();
    f.write_all_at(&[0x5A], 5).unwrap();
    f.write_all_at(&[0x5A; 10], 40 * page as u64).unwrap();
    let (d, dev) = drop_unflushed(&path).unwrap();
    assert!(dev.is_some(), "the loop device is readable");
    assert_eq!(d.changed, 311, "{d:?}");
    assert_eq!(read_all(&f), want);
}

fn config(root: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::small(root, 1 << 16);
    c.flush_interval_ms = 3_600_000;
    c
}

fn msg(i: u64) -> MessageRecord {
    MessageRecord::message("T", 0, format!("m{i}").repeat(50).into_bytes(), 1)
}

/// Drops the store without a clean shutdown and waits for its threads to let go
/// (so its mappings are gone and their dirty bits reached the page cache).
fn crash(store: std::sync::Arc<MessageStore>) {
    let weak = std::sync::Arc::downgrade(&store);
    drop(store);
    while weak.strong_count() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Entries 0..120 are fsynced, 120..200 only written: after the power loss
/// recovery finds exactly the fsynced ones (on a readable device, as the harness
/// runs nodes), whatever page they share with later ones.
#[test]
fn a_power_loss_keeps_exactly_what_was_fsynced() {
    let Some(fs) = LoopFs::new() else { return };
    let root = fs.mount.join("n0");
    let store = MessageStore::open(config(&root)).unwrap();
    for i in 0..200u64 {
        let end = store.append_entry(1, i, &[msg(i)]).unwrap().end_offset();
        if i == 119 {
            store.wait_durable(end).unwrap();
        }
    }
    crash(store);
    let lost = power_loss(&root).unwrap();
    assert!(lost.device.is_some(), "{lost:?}");
    assert!(lost.by_kind["commitlog"].changed > 0, "{lost:?}");
    let store = MessageStore::open(config(&root)).unwrap();
    assert_eq!(store.commit_log().next_log_index(), 120, "{lost:?}");
    for i in 0..120 {
        store.read_entry(i).unwrap();
    }
    assert!(store.read_entry(120).is_err());
    store.append_entry(2, 120, &[msg(120)]).unwrap();
    store.shutdown().unwrap();
}

/// The metadata db (sled, `<store root>/meta`) a node creates on its first start
/// opens again after a power loss. sled writes its `conf` file when it creates a
/// database and never fsyncs it; the jepsen power-loss runs found every node of a
/// group unable to start after all lost power 5 s into their first run.
#[test]
fn a_new_metadata_db_survives_a_power_loss() {
    let Some(fs) = LoopFs::new() else { return };
    let dir = fs.mount.join("meta");
    let db = MetaDb::open(&dir).unwrap();
    db.flush().unwrap();
    drop(db);
    let lost = power_loss(&fs.mount).unwrap();
    if let Err(e) = MetaDb::open(&dir) {
        panic!("{e} after {}", lost.describe());
    }
}

#[test]
fn a_damaged_tail_is_cut_at_the_first_bad_record() {
    for seed in 0..8 {
        let dir = tempdir();
        let root = dir.path().join("n0");
        let store = MessageStore::open(config(&root)).unwrap();
        for i in 0..100u64 {
            store.append_entry(1, i, &[msg(i)]).unwrap();
            if i == 49 {
                store.dispatch_through(i).unwrap();
                store.checkpoint().unwrap();
            }
        }
        crash(store);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let f = damage_tail(&root, &mut rng)
            .unwrap()
            .expect("a tail after the checkpoint");
        let store = MessageStore::open(config(&root)).unwrap();
        let next = store.commit_log().next_log_index();
        assert!((50..100).contains(&next), "seed {seed}: {f:?} kept {next}");
        for i in 0..next {
            store.read_entry(i).unwrap();
        }
        store.append_entry(2, next, &[msg(next)]).unwrap();
        store.shutdown().unwrap();
    }
}
