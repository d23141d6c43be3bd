//! The block device under a store's file system, read with `O_DIRECT` to find
//! what a power loss leaves of a dirty page (see the parent module's docs).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::page_bytes;

/// `FS_IOC_FIEMAP`: `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// Extent flags whose bytes a restart reads as zeros, or cannot be read from the
/// device as they are (`UNKNOWN`, `DELALLOC`, `ENCODED`, `DATA_ENCRYPTED`,
/// `NOT_ALIGNED`, `DATA_INLINE`, `DATA_TAIL`, `UNWRITTEN`).
const FIEMAP_NOT_ON_DEVICE: u32 = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800;
/// `FIEMAP_EXTENT_LAST`.
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// Extents asked for per FIEMAP call.
const FIEMAP_BATCH: usize = 32;

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// `struct fiemap` with room for [`FIEMAP_BATCH`] extents.
#[repr(C)]
#[derive(Debug, Default)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_BATCH],
}

/// The extents of `file` overlapping bytes `[from, to)`, as the file system maps
/// them now (no sync first): `(logical, physical, length, flags)`.
fn extents(file: &File, from: u64, to: u64) -> std::io::Result<Vec<(u64, u64, u64, u32)>> {
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let mut m = Fiemap {
            start: at,
            length: to - at,
            extent_count: FIEMAP_BATCH as u32,
            ..Fiemap::default()
        };
        // SAFETY: `m` is a `struct fiemap` with room for `extent_count` extents.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut m as *mut Fiemap) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let got = &m.extents[..(m.mapped_extents as usize).min(FIEMAP_BATCH)];
        let Some(last) = got.last() else { break };
        out.extend(
            got.iter()
                .map(|e| (e.logical, e.physical, e.length, e.flags)),
        );
        if last.flags & FIEMAP_EXTENT_LAST != 0 || last.logical + last.length <= at {
            break;
        }
        at = last.logical + last.length;
    }
    Ok(out)
}

/// A block device holding a store's file system, opened for `O_DIRECT` reads:
/// what is on it, not what the page cache holds.
pub struct Device {
    pub(super) path: PathBuf,
    file: File,
}

impl Device {
    /// The block device the file system holding `path` is mounted from (the
    /// longest mount point above it in `/proc/self/mountinfo`), if it opens for
    /// `O_DIRECT` reads.
    pub fn of(path: &Path) -> Option<Device> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.canonicalize().ok()?;
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mut best: Option<(usize, String)> = None;
        for line in info.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(mount), Some(source)) = (fields.get(4), fields.get(dash + 2)) else {
                continue;
            };
            let mount = unescape_mountinfo(mount);
            if path.starts_with(&mount) && best.as_ref().is_none_or(|b| mount.len() >= b.0) {
                best = Some((mount.len(), unescape_mountinfo(source)));
            }
        }
        let source = PathBuf::from(best?.1);
        if !source.starts_with("/dev/") {
            return None;
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&source)
            .ok()?;
        Some(Device { path: source, file })
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what this device holds for bytes `[at, at + out.len())` of `file`
    /// (a file on it) into `out`: the device's bytes for written extents, zeros
    /// elsewhere. `at` and `out.len()` are multiples of the file system's block.
    pub(super) fn read_file_range(
        &self,
        file: &File,
        at: u64,
        out: &mut [u8],
    ) -> std::io::Result<()> {
        out.fill(0);
        let end = at + out.len() as u64;
        for (logical, physical, length, flags) in extents(file, at, end)? {
            let (a, b) = (logical.max(at), (logical + length).min(end));
            if a >= b || flags & FIEMAP_NOT_ON_DEVICE != 0 {
                continue;
            }
            let dst = &mut out[(a - at) as usize..(b - at) as usize];
            self.read_direct(physical + (a - logical), dst)?;
        }
        Ok(())
    }

    /// `O_DIRECT` read of `out.len()` bytes at device offset `at`, through a
    /// page-aligned buffer.
    fn read_direct(&self, at: u64, out: &mut [u8]) -> std::io::Result<()> {
        let align = page_bytes() as usize;
        let mut buf = vec![0u8; out.len() + align];
        let skip = buf.as_ptr().align_offset(align);
        let aligned = &mut buf[skip..skip + out.len()];
        self.file.read_exact_at(aligned, at).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("reading {} at {at}: {e}", self.path.display()),
            )
        })?;
        out.copy_from_slice(aligned);
        Ok(())
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c));
        if b[i] == b'\\' && octal {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
