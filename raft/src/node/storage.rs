//! Opening a node's storage at start: the store, the metadata store and the vote
//! file, and what the node does when the metadata store is damaged.
//!
//! A damaged metadata store (sled reports corruption, or it contradicts the log:
//! [`crate::meta_check`]) is moved into `<store root>/damaged-<unix ms>/meta`
//! and a fresh one opened. If the log can replay everything from the start (it
//! was never purged) the node applies it again and goes on. If not, the node
//! cannot know what it applied nor which entries it purged: it raises its
//! acknowledged mark to its log's last entry (durably, so that a mark that was
//! missing or damaged still holds), moves its messages beside the damaged store,
//! starts empty with its vote (kept in the vote file) and takes everything back
//! from the group: entries or a snapshot from the leader. The mark keeps it out of
//! elections and refusing votes to candidates below it (`PeerService::vote`,
//! `Hold::LostEntries`), as its log would have, until its log is back past it;
//! then the moved messages are removed ([`remove_set_aside_when_caught_up`], at
//! this start or a later one); the damaged metadata store stays for inspection.
//! The metadata store is moved first, the messages second: a crash between the
//! two leaves a fresh metadata store beside the whole log, which the check at
//! the next start judges as above.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ledgermq_store::set_aside::{holds_messages, remove_set_aside, set_aside_messages};
use ledgermq_store::{MessageStore, StoreConfig};
use openraft::Vote;

use crate::error::RaftNodeError;
use crate::meta::MetaDb;
use crate::meta_check::{check, MetaFacts};
use crate::types::{LogId, NodeId};
use crate::vote_file::VoteFile;
use ledgermq_store::error::IoContext;

/// A node's opened storage.
pub(crate) struct Storage {
    pub store: Arc<MessageStore>,
    pub meta: MetaDb,
    /// The vote file, holding the vote (moved there from sled if this store was
    /// written before it existed).
    pub vote_file: VoteFile,
    /// Directories holding messages set aside (at this start or an earlier one),
    /// to remove once the node is caught up.
    pub set_aside: Vec<PathBuf>,
}

/// Opens the metadata store in `<root>/meta` and checks it against `store`'s
/// log. Errors: `MetadataDamaged` when sled reports corruption or the check
/// fails; others as they come.
fn open_meta(cfg: &StoreConfig, store: &MessageStore) -> Result<MetaDb, RaftNodeError> {
    let meta = MetaDb::open(&cfg.root.join("meta"))?;
    meta.scan()?;
    let last_purged = MetaDb::get::<Option<LogId>>(&meta.raft, "last_purged")?.flatten();
    let last_applied = MetaDb::get::<Option<LogId>>(&meta.sm, "last_applied")?.flatten();
    let snapshot = MetaDb::get::<crate::boundary::SnapMeta>(&meta.sm, "snapshot_meta")?;
    let facts = MetaFacts {
        last_purged: last_purged.map(|l| l.index),
        last_applied: last_applied.map(|l| l.index),
        snapshot_index: snapshot.and_then(|s| s.last_log_id).map(|l| l.index),
        log_first_index: store.commit_log().first_log_index(),
    };
    check(&facts).map_err(|d| RaftNodeError::MetadataDamaged(d.to_string()))?;
    Ok(meta)
}

/// The `damaged-*` directories under `root` that still hold messages.
fn leftover_set_asides(root: &Path) -> Result<Vec<PathBuf>, RaftNodeError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).at(root)? {
        let p = e.at(root)?.path();
        let named = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("damaged-"));
        if named && p.is_dir() && holds_messages(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Opens the store, the metadata store and the vote file of `cfg.root`; sets a
/// damaged metadata store aside, and the messages with it where the log cannot
/// replay it (see the module docs). Errors: the store's and sled's; `VoteLost`
/// (no valid slot; or no vote file, while the store holds a log and the metadata
/// store no earlier release's vote); `MetadataDamaged` when the metadata store is
/// damaged and the vote was kept there (a store written before the vote file).
pub(crate) fn open(cfg: &StoreConfig) -> Result<Storage, RaftNodeError> {
    let mut store = MessageStore::open(cfg.clone())?;
    let vote_file = VoteFile::open_existing(&cfg.root)?;
    let had_log = store.commit_log().last_log_id()?.is_some();
    let mut set_aside = leftover_set_asides(&cfg.root)?;
    let meta_dir = cfg.root.join("meta");
    let (meta, damaged) = match open_meta(cfg, &store) {
        Ok(meta) => (meta, false),
        Err(RaftNodeError::MetadataDamaged(why)) => {
            if vote_file.is_none() && had_log {
                return Err(RaftNodeError::MetadataDamaged(format!(
                    "{why}; this store kept its vote there too (written before the vote file), so this node cannot know whom it voted for and does not start"
                )));
            }
            let into = cfg.root.join(format!(
                "damaged-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            ));
            tracing::error!(%why, set_aside = %into.display(), "the metadata store is damaged: setting it aside");
            std::fs::create_dir_all(&into).at(&into)?;
            std::fs::rename(&meta_dir, into.join("meta")).at(&meta_dir)?;
            ledgermq_store::mapped_file::fsync_dir(&into)?;
            ledgermq_store::mapped_file::fsync_dir(&cfg.root)?;
            match open_meta(cfg, &store) {
                Ok(meta) => {
                    tracing::warn!("the log holds every entry from the first: applying it again");
                    (meta, true)
                }
                Err(RaftNodeError::MetadataDamaged(why)) => {
                    let acked = store.commit_log().raise_ack_mark_to_last()?;
                    tracing::error!(
                        %why,
                        ?acked,
                        set_aside = %into.display(),
                        "{SET_ASIDE_MESSAGES_LOG}"
                    );
                    store.shutdown()?;
                    drop(store);
                    set_aside_messages(&cfg.root, &into)?;
                    store = MessageStore::open(cfg.clone())?;
                    set_aside.push(into);
                    (MetaDb::open(&meta_dir)?, true)
                }
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let vote_file = match vote_file {
        Some(f) => f,
        None => {
            // A store written before the vote file keeps its vote in sled: move
            // it over, then drop it there (a later loss of the file must not
            // bring back this stale copy).
            let legacy = if damaged {
                None
            } else {
                MetaDb::get::<Vote<NodeId>>(&meta.raft, "vote")?
            };
            if legacy.is_none() && had_log {
                return Err(RaftNodeError::VoteLost {
                    path: cfg
                        .root
                        .join(crate::vote_file::VOTE_FILE_NAME)
                        .display()
                        .to_string(),
                    why: "the file is missing, and the store holds a log".into(),
                });
            }
            let f = VoteFile::create(&cfg.root, &legacy.unwrap_or_default())?;
            if legacy.is_some() {
                meta.raft.remove("vote")?;
                meta.flush()?;
            }
            f
        }
    };
    Ok(Storage {
        store,
        meta,
        vote_file,
        set_aside,
    })
}

/// What a node logs when it sets its messages aside (the jepsen harness looks
/// for it to lay a follower's revert to a damaged metadata store); defined in
/// [`ledgermq_proto::log_lines`], which the harness reads without linking the node.
pub const SET_ASIDE_MESSAGES_LOG: &str = ledgermq_proto::log_lines::SET_ASIDE_MESSAGES;

/// Removes the messages set aside in `into` once `store` holds again everything
/// it had acknowledged ([`super::upkeep::caught_up`]): the group has given them
/// back, so the old copies are redundant. Gives up when the store closes.
pub(crate) async fn remove_set_aside_when_caught_up(store: Arc<MessageStore>, into: PathBuf) {
    if !super::upkeep::caught_up(&store).await {
        return;
    }
    let path = into.clone();
    let res = tokio::task::spawn_blocking(move || remove_set_aside(&path)).await;
    match res {
        Ok(Ok(())) => tracing::info!(
            set_aside = %into.display(),
            "caught up past every acknowledged entry: removed the messages set aside (the damaged metadata store stays)"
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, set_aside = %into.display(), "removing the messages set aside failed")
        }
        Err(e) => tracing::warn!(error = %e, "removing the messages set aside failed"),
    }
}
