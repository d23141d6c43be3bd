//! What the harness controls on a broker node besides its process: its disk, its
//! wall clock and its fsync latency.
//!
//! - Disk: each node's store root is an ext4 file system of its own (an image file
//!   in the run folder, loop-mounted), so filling it ([`fill_disk`]) fills that
//!   node's disk only. At the end of the run the store is copied back into a plain
//!   directory at the same path and the image removed ([`NodeDisk::release`]).
//! - Clock: nodes run under libfaketime (`LD_PRELOAD`, Debian package
//!   `libfaketime`), their wall clock offset by the seconds in a file
//!   ([`set_clock_offset`]; re-read at most every second). Monotonic clocks
//!   (`CLOCK_MONOTONIC`, so tokio's and openraft's timers) are left alone.
//! - fsync: the store sleeps before each fsync for the delay in a file
//!   (`ledgermq_store::fault_hooks`, [`set_fsync_delay`]).
//! - Boot: the store reads the machine's boot id from a file ([`reboot`] writes a
//!   new one when the node loses power), so that a simulated power loss is a
//!   reboot to it, as a real one is.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::JepsenError;

/// Where Debian and Fedora install libfaketime.
pub const LIBFAKETIME_PATHS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
];

/// The size of each node's file system, bytes (a sparse image: only what is
/// written takes room in the run folder).
pub const NODE_DISK_BYTES: u64 = 8 << 30;

/// The environment variable naming a node's fsync delay file
/// (`ledgermq_store::fault_hooks::FSYNC_DELAY_FILE_ENV`).
pub const FSYNC_DELAY_FILE_ENV: &str = "LEDGERMQ_FSYNC_DELAY_FILE";

/// The environment variable naming a node's boot id file
/// (`ledgermq_store::fault_hooks::BOOT_ID_FILE_ENV`).
pub const BOOT_ID_FILE_ENV: &str = "LEDGERMQ_BOOT_ID_FILE";

/// The name of the file that fills a node's disk, in its store root.
pub const BALLAST: &str = "jepsen-ballast";

/// The installed libfaketime, if any.
pub fn libfaketime() -> Option<PathBuf> {
    LIBFAKETIME_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The file holding node `i`'s clock offset (libfaketime's timestamp file).
pub fn clock_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("n{i}.clock-offset"))
}

/// The file holding node `i`'s fsync delay (`MIN MAX`, ms).
pub fn fsync_delay_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("n{i}.fsync-delay"))
}

/// The file holding node `i`'s boot id.
pub fn boot_id_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("n{i}.boot-id"))
}

/// Node `i` boots anew: a new boot id (its first boot too). Errors: `Io`.
pub fn reboot(dir: &Path, i: usize) -> Result<(), JepsenError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    replace_file(&boot_id_file(dir, i), &format!("jepsen-n{i}-{nanos}\n"))?;
    Ok(())
}

/// Environment of broker node `i`'s process: the fsync delay file, the boot id
/// file, and the clock offset file with libfaketime preloaded if `faketime` is
/// given.
pub fn node_env(dir: &Path, i: usize, faketime: Option<&Path>) -> Vec<(String, String)> {
    let mut env = vec![
        (
            FSYNC_DELAY_FILE_ENV.to_owned(),
            fsync_delay_file(dir, i).display().to_string(),
        ),
        (
            BOOT_ID_FILE_ENV.to_owned(),
            boot_id_file(dir, i).display().to_string(),
        ),
    ];
    if let Some(lib) = faketime {
        for (k, v) in [
            ("LD_PRELOAD", lib.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                clock_file(dir, i).display().to_string(),
            ),
            // Re-read the file every second (reading it at every call costs ~1 µs).
            ("FAKETIME_CACHE_DURATION", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ] {
            env.push((k.to_owned(), v));
        }
    }
    env
}

/// Writes `contents` to `path` at once (a reader never sees half of it).
fn replace_file(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Sets node `i`'s wall clock to run `offset_s` seconds off real time (within
/// about a second). Errors: `Io`.
pub fn set_clock_offset(dir: &Path, i: usize, offset_s: i64) -> Result<(), JepsenError> {
    Ok(replace_file(
        &clock_file(dir, i),
        &format!("{offset_s:+}\n"),
    )?)
}

/// Delays node `i`'s fsyncs by `min_ms..=max_ms` each (within 100 ms); `None`
/// removes the delay. Errors: `Io`.
pub fn set_fsync_delay(dir: &Path, i: usize, delay: Option<(u32, u32)>) -> Result<(), JepsenError> {
    let path = fsync_delay_file(dir, i);
    match delay {
        Some((min, max)) => replace_file(&path, &format!("{min} {max}\n"))?,
        None => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        },
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<(), JepsenError> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(JepsenError::Host(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A node's own file system: `image` loop-mounted at `mount` (the store root).
#[derive(Debug)]
pub struct NodeDisk {
    image: PathBuf,
    mount: PathBuf,
}

impl NodeDisk {
    /// Makes an ext4 file system of [`NODE_DISK_BYTES`] in `<mount>.img` (no blocks
    /// reserved for root: the nodes run as root) and mounts it at `mount`; this
    /// process's id goes in `<mount>.owner` (see [`remove_orphan_disks`]). Errors:
    /// `Host` if `mkfs.ext4` or `mount` fail (no loop device free, not root).
    pub fn create(mount: &Path) -> Result<Self, JepsenError> {
        let image = mount.with_extension("img");
        std::fs::create_dir_all(mount)?;
        std::fs::write(
            mount.with_extension("owner"),
            std::process::id().to_string(),
        )?;
        std::fs::File::create(&image)?.set_len(NODE_DISK_BYTES)?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(mount))?;
        // An empty store root, as the node expects on its first start.
        let _ = std::fs::remove_dir(mount.join("lost+found"));
        Ok(Self {
            image,
            mount: mount.to_path_buf(),
        })
    }

    /// Once the node has stopped: copies the store into a plain directory, unmounts
    /// the file system (its loop device goes with it), puts the copy at the mount
    /// point and removes the image. If the copy fails, the image is kept (its path
    /// is in the error).
    pub fn release(self) -> Result<(), JepsenError> {
        let copy = self.mount.with_extension("copy");
        let _ = std::fs::remove_file(self.mount.join(BALLAST));
        let copied = run(Command::new("cp")
            .args(["-a", "--sparse=always"])
            .arg(&self.mount)
            .arg(&copy));
        run(Command::new("umount").arg(&self.mount))
            .or_else(|_| run(Command::new("umount").arg("-l").arg(&self.mount)))?;
        if let Err(e) = copied {
            return Err(JepsenError::Host(format!(
                "copying the store out of {}: {e}; the store stays in that image",
                self.image.display()
            )));
        }
        std::fs::remove_dir(&self.mount)?;
        std::fs::rename(&copy, &self.mount)?;
        std::fs::remove_file(&self.image)?;
        let _ = std::fs::remove_file(self.mount.with_extension("owner"));
        Ok(())
    }
}

/// Releases ([`NodeDisk::release`]) the node file systems of runs whose harness
/// was killed before it could: mounts with an `.owner` file beside them naming a
/// process that no longer runs. Returns the mount points released.
pub fn remove_orphan_disks() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut released = Vec::new();
    for mount in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
        let mount = PathBuf::from(mount);
        let Ok(owner) = std::fs::read_to_string(mount.with_extension("owner")) else {
            continue;
        };
        if Path::new("/proc").join(owner.trim()).exists() {
            continue;
        }
        let disk = NodeDisk {
            image: mount.with_extension("img"),
            mount: mount.clone(),
        };
        match disk.release() {
            Ok(()) => released.push(mount),
            Err(e) => eprintln!("jepsen: releasing an orphaned node disk: {e}"),
        }
    }
    released
}

/// Fills the file system of `root` with a ballast file until `leave_bytes` or
/// fewer are free (0: every block). Returns the bytes it took. Errors: `Io`.
pub fn fill_disk(root: &Path, leave_bytes: u64) -> Result<u64, JepsenError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(BALLAST))?;
    let mut len = f.metadata()?.len();
    let start = len;
    let mut chunk: u64 = 64 << 20;
    while chunk >= 4096 {
        let free = free_bytes(root)?;
        if free <= leave_bytes {
            break;
        }
        let want = chunk.min(free - leave_bytes).max(4096);
        // SAFETY: plain fallocate(2) on an open descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, len as i64, want as i64) };
        if r == 0 {
            len += want;
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSPC) {
                return Err(e.into());
            }
            // A failed fallocate may keep part of what it allocated.
            len = f.metadata()?.len().max(len);
            chunk /= 2;
        }
    }
    Ok(len - start)
}

/// Removes the ballast of [`fill_disk`]. Errors: `Io` other than its absence.
pub fn free_disk(root: &Path) -> Result<(), JepsenError> {
    match std::fs::remove_file(root.join(BALLAST)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Bytes of the file system of `path` a file can still take (`f_bavail`: ext4
/// keeps some free blocks back from every user, root included).
pub fn free_bytes(path: &Path) -> Result<u64, JepsenError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| JepsenError::Host(e.to_string()))?;
    // SAFETY: statvfs fills the zeroed struct; the path is NUL-terminated.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_their_own_files_and_faketime_only_when_installed() {
        assert_eq!(
            FSYNC_DELAY_FILE_ENV,
            ledgermq_store::fault_hooks::FSYNC_DELAY_FILE_ENV
        );
        let dir = Path::new("/tmp/run");
        assert_eq!(
            (FSYNC_DELAY_FILE_ENV, BOOT_ID_FILE_ENV),
            (
                ledgermq_store::fault_hooks::FSYNC_DELAY_FILE_ENV,
                ledgermq_store::fault_hooks::BOOT_ID_FILE_ENV
            )
        );
        let env = node_env(dir, 2, None);
        assert_eq!(
            env,
            vec![
                (
                    "LEDGERMQ_FSYNC_DELAY_FILE".to_owned(),
                    "/tmp/run/n2.fsync-delay".to_owned()
                ),
                (
                    "LEDGERMQ_BOOT_ID_FILE".to_owned(),
                    "/tmp/run/n2.boot-id".to_owned()
                )
            ]
        );
        let env = node_env(dir, 1, Some(Path::new("/lib/libfaketime.so.1")));
        assert!(env.contains(&("LD_PRELOAD".into(), "/lib/libfaketime.so.1".into())));
        assert!(env.contains(&(
            "FAKETIME_TIMESTAMP_FILE".into(),
            "/tmp/run/n1.clock-offset".into()
        )));
        assert!(env.contains(&("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into())));
    }

    #[test]
    fn offsets_and_delays_are_written_as_the_node_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        set_clock_offset(dir.path(), 0, -12).unwrap();
        assert_eq!(
            std::fs::read_to_string(clock_file(dir.path(), 0)).unwrap(),
            "-12\n"
        );
        set_clock_offset(dir.path(), 0, 30).unwrap();
        assert_eq!(
            std::fs::read_to_string(clock_file(dir.path(), 0)).unwrap(),
            "+30\n"
        );
        set_fsync_delay(dir.path(), 1, Some((50, 200))).unwrap();
        let text = std::fs::read_to_string(fsync_delay_file(dir.path(), 1)).unwrap();
        assert_eq!(
            ledgermq_store::fault_hooks::parse_delay(&text),
            Some((50, 200))
        );
        set_fsync_delay(dir.path(), 1, None).unwrap();
        assert!(!fsync_delay_file(dir.path(), 1).exists());
        set_fsync_delay(dir.path(), 1, None).unwrap();
    }
}
