//! The Raft vote, kept apart from the metadata store.
//!
//! A node that forgets its vote may vote twice in one term, and two leaders of
//! one term break Raft's log matching. The vote used to live in sled with the
//! rest of the metadata; the jepsen `corrupt-metadata` fault showed that sled,
//! given a damaged page, silently rolls back to the state before it (the test
//! `raft/tests/damaged_metadata.rs` saw `last_applied` fall from 303 to 68 with
//! no error). So the vote lives in its own small file, written in place and
//! fdatasync'd before `save_vote` returns, in two slots written in turn: a torn
//! or damaged write of one slot leaves the other. The file is created holding a
//! valid slot (the migrated vote, or "no vote" for a new node), so a file with no
//! valid slot, all zeros included, is refused ([`RaftNodeError::VoteLost`]) rather
//! than read as "never voted"; so is a missing file where the store holds a log
//! (`crate::node` opening the storage).
//!
//! File format (`<store root>/raft_vote`, [`VOTE_FILE_BYTES`] = two slots of
//! [`SLOT_BYTES`]), each slot big-endian:
//! `magic "LVOT" (4) | format version 1 (1) | committed 0/1 (1) | has voted_for 0/1 (1) | 0 (1)
//! | sequence (8) | term (8) | voted_for (8) | CRC32 of the 32 bytes before (4) | 0 (4)`.
//! The slot with the higher sequence among the valid ones holds the vote; the
//! next write goes to the other slot.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use openraft::{LeaderId, Vote};

use crate::error::RaftNodeError;
use crate::types::NodeId;
use ledgermq_store::error::IoContext;

/// Bytes of one slot.
pub const SLOT_BYTES: usize = 40;
/// Bytes of the file: two slots.
pub const VOTE_FILE_BYTES: usize = 2 * SLOT_BYTES;
/// The file's name under the store root.
pub const VOTE_FILE_NAME: &str = "raft_vote";
const MAGIC: &[u8; 4] = b"LVOT";
const VERSION: u8 = 1;

/// Encodes `vote` as the slot of write number `seq`.
pub fn encode_slot(seq: u64, vote: &Vote<NodeId>) -> [u8; SLOT_BYTES] {
    let mut b = [0u8; SLOT_BYTES];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = vote.committed as u8;
    let voted_for = vote.leader_id.voted_for();
    b[6] = voted_for.is_some() as u8;
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[16..24].copy_from_slice(&vote.leader_id.term.to_be_bytes());
    b[24..32].copy_from_slice(&voted_for.unwrap_or(0).to_be_bytes());
    let crc = crc32fast::hash(&b[..32]);
    b[32..36].copy_from_slice(&crc.to_be_bytes());
    b
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap_or_default())
}

/// Decodes a slot: `(sequence, vote)`, or `None` if it fails its magic, version,
/// flags or CRC.
pub fn decode_slot(b: &[u8]) -> Option<(u64, Vote<NodeId>)> {
    if b.len() != SLOT_BYTES || &b[..4] != MAGIC || b[4] != VERSION || b[5] > 1 || b[6] > 1 {
        return None;
    }
    let crc = u32::from_be_bytes(b[32..36].try_into().ok()?);
    if crc32fast::hash(&b[..32]) != crc {
        return None;
    }
    let leader_id = LeaderId {
        term: be_u64(&b[16..24]),
        voted_for: (b[6] == 1).then(|| be_u64(&b[24..32])),
    };
    Some((
        be_u64(&b[8..16]),
        Vote {
            leader_id,
            committed: b[5] == 1,
        },
    ))
}

/// What a vote file's bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The vote of the newest valid slot, written as number `seq`.
    Vote {
        /// The write's sequence number.
        seq: u64,
        /// The vote.
        vote: Vote<NodeId>,
    },
    /// No slot is valid (all-zero bytes included: a file is created holding a
    /// valid slot): the vote is lost.
    Damaged,
}

/// Reads a vote file's bytes (any length).
pub fn read_slots(bytes: &[u8]) -> Stored {
    let newest = bytes
        .chunks(SLOT_BYTES)
        .take(2)
        .filter_map(decode_slot)
        .max_by_key(|(seq, _)| *seq);
    match newest {
        Some((seq, vote)) => Stored::Vote { seq, vote },
        None => Stored::Damaged,
    }
}

/// The vote file of one node: open, and the sequence number of its last write.
pub struct VoteFile {
    path: PathBuf,
    file: File,
    seq: u64,
    current: Option<Vote<NodeId>>,
}

impl VoteFile {
    /// Opens `<root>/raft_vote` if it exists (`None` if not) and reads its vote.
    /// Errors: `Store` for I/O, `VoteLost` when no slot is valid.
    pub fn open_existing(root: &Path) -> Result<Option<Self>, RaftNodeError> {
        let path = root.join(VOTE_FILE_NAME);
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            r => r.at(&path)?,
        };
        let mut bytes = Vec::new();
        (&file).read_to_end(&mut bytes).at(&path)?;
        match read_slots(&bytes) {
            Stored::Vote { seq, vote } => Ok(Some(Self {
                path,
                file,
                seq,
                current: Some(vote),
            })),
            Stored::Damaged => Err(RaftNodeError::VoteLost {
                path: path.display().to_string(),
                why: "no slot of the file is valid".into(),
            }),
        }
    }

    /// Creates `<root>/raft_vote` holding `vote` (`Vote::default()`, term 0 and
    /// no candidate, for a node that never voted) at its full size: written to
    /// a temporary file, fsynced, renamed into place, the directory fsynced. So
    /// the file never exists without a valid slot, and its blocks are allocated
    /// (an overwrite in place needs none on file systems that overwrite in
    /// place). Errors: `Store` for I/O.
    pub fn create(root: &Path, vote: &Vote<NodeId>) -> Result<Self, RaftNodeError> {
        let path = root.join(VOTE_FILE_NAME);
        let tmp = root.join(format!("{VOTE_FILE_NAME}.tmp"));
        let mut bytes = [0u8; VOTE_FILE_BYTES];
        bytes[SLOT_BYTES..].copy_from_slice(&encode_slot(1, vote));
        std::fs::write(&tmp, bytes).at(&tmp)?;
        File::open(&tmp).and_then(|f| f.sync_all()).at(&tmp)?;
        std::fs::rename(&tmp, &path).at(&path)?;
        ledgermq_store::mapped_file::fsync_dir(root)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .at(&path)?;
        Ok(Self {
            path,
            file,
            seq: 1,
            current: Some(*vote),
        })
    }

    /// Writes `vote` to the slot not holding the current one and fdatasyncs it:
    /// durable when this returns. Errors: `Store` (I/O).
    pub fn save(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftNodeError> {
        let seq = self.seq + 1;
        let at = (seq % 2) * SLOT_BYTES as u64;
        self.file
            .write_all_at(&encode_slot(seq, vote), at)
            .and_then(|_| self.file.sync_data())
            .at(&self.path)?;
        self.seq = seq;
        self.current = Some(*vote);
        Ok(())
    }

    /// The vote last read or written.
    pub fn current(&self) -> Option<Vote<NodeId>> {
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, node: Option<u64>, committed: bool) -> Vote<NodeId> {
        Vote {
            leader_id: LeaderId {
                term,
                voted_for: node,
            },
            committed,
        }
    }

    #[test]
    fn slots_round_trip_every_field() {
        for v in [
            vote(0, None, false),
            vote(7, Some(2), false),
            vote(u64::MAX, Some(0), true),
        ] {
            assert_eq!(decode_slot(&encode_slot(9, &v)), Some((9, v)));
        }
    }

    #[test]
    fn the_golden_bytes_of_format_1_decode() {
        // Written by this release: term 5, voted for node 1, committed, write 3.
        let golden: [u8; SLOT_BYTES] = [
            b'L', b'V', b'O', b'T', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0,
            0, 0, 0, 0, 0, 0, 1, 0xed, 0x6b, 0xf9, 0xa6, 0, 0, 0, 0,
        ];
        assert_eq!(encode_slot(3, &vote(5, Some(1), true)), golden);
        assert_eq!(decode_slot(&golden), Some((3, vote(5, Some(1), true))));
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_damaged_one_falls_back() {
        let mut f = [0u8; VOTE_FILE_BYTES];
        assert_eq!(read_slots(&f), Stored::Damaged, "all zeros: lost");
        f[SLOT_BYTES..].copy_from_slice(&encode_slot(1, &vote(3, Some(1), false)));
        f[..SLOT_BYTES].copy_from_slice(&encode_slot(2, &vote(4, Some(2), false)));
        assert_eq!(
            read_slots(&f),
            Stored::Vote {
                seq: 2,
                vote: vote(4, Some(2), false)
            }
        );
        // A torn write of the newer slot: the older vote stands.
        f[20] ^= 0xff;
        assert_eq!(
            read_slots(&f),
            Stored::Vote {
                seq: 1,
                vote: vote(3, Some(1), false)
            }
        );
        // Both damaged: lost.
        f[SLOT_BYTES + 20] ^= 0xff;
        assert_eq!(read_slots(&f), Stored::Damaged);
        assert_eq!(read_slots(&[1, 2, 3]), Stored::Damaged);
    }

    #[test]
    fn writes_alternate_slots_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        assert!(VoteFile::open_existing(dir.path()).unwrap().is_none());
        let mut f = VoteFile::create(dir.path(), &Vote::default()).unwrap();
        let path = dir.path().join(VOTE_FILE_NAME);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            VOTE_FILE_BYTES as u64
        );
        assert!(!dir.path().join(format!("{VOTE_FILE_NAME}.tmp")).exists());
        let f2 = VoteFile::open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(f2.current(), Some(Vote::default()), "created with no vote");
        f.save(&vote(1, Some(0), false)).unwrap();
        f.save(&vote(2, Some(1), true)).unwrap();
        drop(f);
        let mut f = VoteFile::open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(f.current(), Some(vote(2, Some(1), true)));
        f.save(&vote(3, Some(2), false)).unwrap();
        // Damage the slot just written (write 4 goes to the first slot): the
        // one before it is read.
        let mut b = std::fs::read(&path).unwrap();
        b[17] ^= 0x40;
        std::fs::write(&path, &b).unwrap();
        let f = VoteFile::open_existing(dir.path()).unwrap().unwrap();
        assert_eq!(f.current(), Some(vote(2, Some(1), true)));
        // Both slots damaged, or zeroed: lost.
        b[SLOT_BYTES + 17] ^= 0x40;
        std::fs::write(&path, &b).unwrap();
        assert!(matches!(
            VoteFile::open_existing(dir.path()),
            Err(RaftNodeError::VoteLost { .. })
        ));
        std::fs::write(&path, [0u8; VOTE_FILE_BYTES]).unwrap();
        assert!(matches!(
            VoteFile::open_existing(dir.path()),
            Err(RaftNodeError::VoteLost { .. })
        ));
    }
}
