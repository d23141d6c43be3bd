//! Damage beyond the tail, on a stopped node's files: a byte range in the middle
//! of the CommitLog (before the checkpoint, which crash recovery does not scan),
//! in the Raft index, in one ConsumeQueue file, in the checkpoint and in the sled
//! metadata store. Each damaged byte is XORed with a random non-zero value (so it
//! surely changes) and the file is fsynced.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rand::Rng;

use super::{checkpoint_offset, files_under, segments, DiskFault};

/// Which stored file a [`corrupt`] damages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The CommitLog, in the middle of what precedes the checkpoint.
    MidLog,
    /// The Raft index (`raftindex/`), in the middle of its written part.
    RaftIndex,
    /// One ConsumeQueue file, in the middle of its written part.
    ConsumeQueue,
    /// The `checkpoint` file.
    Checkpoint,
    /// The sled metadata store (`meta/db`), in the middle of its written part.
    Metadata,
}

/// Most bytes one damage changes.
pub const MAX_DAMAGE_BYTES: u64 = 64;

/// The written part of a file: `[first non-zero byte, last non-zero byte + 1)`,
/// None when it holds only zeros.
pub fn written_span(path: &Path) -> std::io::Result<Option<(u64, u64)>> {
    let bytes = std::fs::read(path)?;
    let first = bytes.iter().position(|&b| b != 0);
    let last = bytes.iter().rposition(|&b| b != 0);
    Ok(first.zip(last).map(|(f, l)| (f as u64, l as u64 + 1)))
}

/// The middle half of `[lo, hi)` (all of it when shorter than 4 bytes).
fn middle(lo: u64, hi: u64) -> (u64, u64) {
    let quarter = (hi - lo) / 4;
    (lo + quarter, hi - quarter)
}

/// XORs `1..=MAX_DAMAGE_BYTES` bytes (fewer if the range is shorter) starting at a
/// random point of `[lo, hi)` of `path` with random non-zero values and fsyncs
/// it. Returns (offset, bytes changed).
fn damage_range(path: &Path, lo: u64, hi: u64, rng: &mut impl Rng) -> std::io::Result<(u64, u64)> {
    let at = rng.gen_range(lo..hi);
    let n = rng.gen_range(1..=MAX_DAMAGE_BYTES).min(hi - at);
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut buf = vec![0u8; n as usize];
    f.read_exact_at(&mut buf, at)?;
    for b in &mut buf {
        *b ^= rng.gen_range(1..=255u8);
    }
    f.write_all_at(&buf, at)?;
    f.sync_all()?;
    Ok((at, n))
}

/// Damages the middle of the written part of the file among `paths` with the
/// most written bytes (`pick_any`: a random one of those with any instead).
fn damage_written(
    paths: &[PathBuf],
    pick_any: bool,
    root: &Path,
    what: &str,
    rng: &mut impl Rng,
) -> std::io::Result<Option<DiskFault>> {
    let mut written = Vec::new();
    for p in paths {
        if let Some(span) = written_span(p)? {
            written.push((p, span));
        }
    }
    let chosen = if pick_any && !written.is_empty() {
        let i = rng.gen_range(0..written.len());
        Some(written[i])
    } else {
        written.into_iter().max_by_key(|(_, (lo, hi))| hi - lo)
    };
    let Some((path, (lo, hi))) = chosen else {
        return Ok(None);
    };
    let (lo, hi) = middle(lo, hi);
    let (at, n) = damage_range(path, lo, hi, rng)?;
    let name = path.strip_prefix(root).unwrap_or(path).display();
    Ok(Some(DiskFault {
        offset: at,
        bytes: n,
        what: format!("{what}: {n} bytes of {name} damaged at file offset {at}"),
    }))
}

/// Damages `part` of a stopped node's store (root `store_root`). None when there
/// is nothing of that part to damage (no file, or only zeros; for the CommitLog,
/// fewer than 4 KiB before the checkpoint).
pub fn corrupt(
    store_root: &Path,
    part: Part,
    rng: &mut impl Rng,
) -> std::io::Result<Option<DiskFault>> {
    let under = |dir: &str| -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let d = store_root.join(dir);
        if d.is_dir() {
            files_under(&d, &mut out)?;
        }
        out.sort();
        Ok(out)
    };
    match part {
        Part::MidLog => {
            let checkpoint = checkpoint_offset(store_root)?;
            let segs = segments(&store_root.join("commitlog"))?;
            let Some(&(first, ref first_path)) = segs.first() else {
                return Ok(None);
            };
            let lo = first + written_span(first_path)?.map_or(0, |s| s.0);
            if checkpoint < lo + 4096 {
                return Ok(None);
            }
            let (mlo, mhi) = middle(lo, checkpoint);
            let at = rng.gen_range(mlo..mhi);
            let Some((start, path)) = segs.iter().rev().find(|(s, _)| *s <= at) else {
                return Ok(None);
            };
            let len = std::fs::metadata(path)?.len();
            let (off, n) = damage_range(path, at - start, len.min(checkpoint - start), rng)?;
            Ok(Some(DiskFault {
                offset: start + off,
                bytes: n,
                what: format!(
                    "CommitLog damaged mid-log: {n} bytes at offset {} (the log's written part starts at {lo}, the checkpoint is at {checkpoint})",
                    start + off
                ),
            }))
        }
        Part::RaftIndex => {
            damage_written(&under("raftindex")?, false, store_root, "Raft index", rng)
        }
        Part::ConsumeQueue => damage_written(
            &under("consumequeue")?,
            true,
            store_root,
            "ConsumeQueue",
            rng,
        ),
        Part::Checkpoint => {
            let path = store_root.join("checkpoint");
            let len = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            if len == 0 {
                return Ok(None);
            }
            let (at, n) = damage_range(&path, 0, len, rng)?;
            Ok(Some(DiskFault {
                offset: at,
                bytes: n,
                what: format!("checkpoint: {n} of its {len} bytes damaged at offset {at}"),
            }))
        }
        Part::Metadata => {
            let db = store_root.join("meta").join("db");
            let paths = if db.is_file() {
                vec![db]
            } else {
                under("meta")?
            };
            damage_written(&paths, false, store_root, "metadata store (sled)", rng)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn each_part_is_damaged_inside_its_written_middle_and_only_there() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for d in ["commitlog", "raftindex", "consumequeue/T/0", "meta"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // A 64 KiB segment written through 40 KiB, checkpoint at 32 KiB.
        let seg = root.join("commitlog/00000000000000000000");
        let mut log = vec![7u8; 40 << 10];
        log.resize(64 << 10, 0);
        std::fs::write(&seg, &log).unwrap();
        let mut cp = vec![0u8; 64];
        cp[4..12].copy_from_slice(&(32u64 << 10).to_be_bytes());
        std::fs::write(root.join("checkpoint"), &cp).unwrap();
        let mut file = vec![1u8; 1000];
        file.resize(4000, 0);
        for f in [
            "raftindex/00000000000000000000",
            "consumequeue/T/0/00000000000000000000",
            "meta/db",
        ] {
            std::fs::write(root.join(f), &file).unwrap();
        }
        assert!(corrupt(root, Part::MidLog, &mut rng).unwrap().is_some());
        let after = std::fs::read(&seg).unwrap();
        let changed: Vec<usize> = (0..after.len()).filter(|&i| after[i] != log[i]).collect();
        assert!(!changed.is_empty());
        assert!(
            changed.iter().all(|&i| (8 << 10..32 << 10).contains(&i)),
            "{changed:?}"
        );
        for (part, f) in [
            (Part::RaftIndex, "raftindex/00000000000000000000"),
            (Part::ConsumeQueue, "consumequeue/T/0/00000000000000000000"),
            (Part::Metadata, "meta/db"),
        ] {
            let d = corrupt(root, part, &mut rng).unwrap().expect("damaged");
            let after = std::fs::read(root.join(f)).unwrap();
            let changed: Vec<usize> = (0..after.len()).filter(|&i| after[i] != file[i]).collect();
            assert_eq!(changed.len() as u64, d.bytes, "{part:?}");
            assert!(
                changed.iter().all(|&i| (250..750 + 64).contains(&i)),
                "{part:?} {changed:?}"
            );
        }
        let d = corrupt(root, Part::Checkpoint, &mut rng).unwrap().unwrap();
        assert_ne!(std::fs::read(root.join("checkpoint")).unwrap(), cp, "{d:?}");
        // Nothing before the checkpoint to damage: nothing done.
        std::fs::write(root.join("checkpoint"), [0u8; 64]).unwrap();
        assert!(corrupt(root, Part::MidLog, &mut rng).unwrap().is_none());
    }
}
