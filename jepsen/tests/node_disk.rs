//! A node's own file system ([`ledgermq_jepsen::node_env`]): filled and freed,
//! and released (store copied back into a plain directory) by a later run when the
//! run that mounted it was killed. Needs root, loop devices and mkfs.ext4.

use ledgermq_jepsen::node_env::{fill_disk, free_bytes, free_disk, remove_orphan_disks, NodeDisk};

#[test]
fn a_node_disk_fills_frees_and_is_released_after_its_run_dies() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("n0");
    let disk = NodeDisk::create(&root).unwrap();
    std::fs::write(root.join("checkpoint"), b"kept").unwrap();
    let before = free_bytes(&root).unwrap();
    assert!(before > 1 << 30, "{before}");
    let took = fill_disk(&root, 0).unwrap();
    assert!(took + (1 << 20) >= before, "took {took} of {before}");
    assert_eq!(free_bytes(&root).unwrap(), 0);
    let e = std::fs::write(root.join("more"), vec![1u8; 1 << 20]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    free_disk(&root).unwrap();
    assert!(free_bytes(&root).unwrap() + (1 << 20) >= before);
    let _ = std::fs::remove_file(root.join("more"));
    fill_disk(&root, 16 << 20).unwrap();
    let left = free_bytes(&root).unwrap();
    assert!(
        (16 << 20..(16 << 20) + (64 << 20)).contains(&left),
        "{left}"
    );

    // The run that made it dies (no process has this pid: above pid_max).
    std::mem::forget(disk);
    std::fs::write(root.with_extension("owner"), "999999999").unwrap();
    let released = remove_orphan_disks();
    assert!(released.contains(&root), "{released:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&root.display().to_string()),
        "still mounted"
    );
    assert_eq!(std::fs::read(root.join("checkpoint")).unwrap(), b"kept");
    assert!(!root.join("jepsen-ballast").exists());
    assert!(!root.with_extension("img").exists());
}
