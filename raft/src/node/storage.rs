//! Opening a node's storage at start: the store, the vote file and the metadata
//! store, and what the node does when the metadata store is damaged.
//!
//! A damaged metadata store (sled reports corruption, or it contradicts the log:
//! [`crate::meta_check`]) cannot say what this node applied, nor which entries it
//! purged. The node then sets the damaged store and its messages aside (moved
//! into `<store root>/damaged-<unix ms>/`, not deleted), starts empty with its
//! vote (kept in the vote file) and its acknowledged mark, and takes everything
//! back from the group: entries or a snapshot from the leader. The mark keeps it
//! out of elections until its log is back past what it had acknowledged
//! (`PeerService::vote`, `Hold::LostEntries`), so it never helps elect a node
//! that lacks an entry it had counted for. Once it is back there, the moved
//! messages are removed ([`remove_set_aside_when_caught_up`]); the damaged
//! metadata store stays for inspection.

use std::path::PathBuf;
use std::sync::Arc;

use ledgermq_store::{MessageStore, StoreConfig};
use openraft::Vote;

use crate::error::RaftNodeError;
use crate::meta::MetaDb;
use crate::meta_check::{check, MetaFacts};
use crate::types::{LogId, NodeId};
use crate::vote_file::VoteFile;

/// A node's opened storage.
pub(crate) struct Storage {
    pub store: Arc<MessageStore>,
    pub meta: MetaDb,
    /// The vote file, holding the vote (moved there from sled if this store was
    /// written before it existed).
    pub vote_file: VoteFile,
    /// Where the damaged metadata store and the old messages went, if they did.
    pub set_aside: Option<PathBuf>,
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

/// Opens the store, the vote file and the metadata store of `cfg.root`; sets a
/// damaged metadata store aside with the messages (see the module docs). Errors:
/// the store's and sled's; `VoteDamaged`; `MetadataDamaged` when the metadata
/// store is damaged and the vote was kept there (a store written before the vote
/// file), for the node cannot know whom it voted for.
pub(crate) fn open(cfg: &StoreConfig) -> Result<Storage, RaftNodeError> {
    let store = MessageStore::open(cfg.clone())?;
    let (mut vote_file, file_vote) = VoteFile::open(&cfg.root)?;
    let why = match open_meta(cfg, &store) {
        Ok(meta) => {
            if file_vote.is_none() {
                // A store written before the vote file: move the vote over.
                if let Some(v) = MetaDb::get::<Vote<NodeId>>(&meta.raft, "vote")? {
                    vote_file.save(&v)?;
                }
            }
            return Ok(Storage {
                store,
                meta,
                vote_file,
                set_aside: None,
            });
        }
        Err(RaftNodeError::MetadataDamaged(why)) => why,
        Err(e) => return Err(e),
    };
    let had_log = store.commit_log().last_log_id()?.is_some();
    if file_vote.is_none() && had_log {
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
    tracing::error!(
        %why,
        set_aside = %into.display(),
        acked = ?store.commit_log().acked_log_id(),
        "the metadata store is damaged: setting it and this node's messages aside; starting empty and taking them back from the group"
    );
    store.shutdown()?;
    drop(store);
    ledgermq_store::set_aside::set_aside_messages(&cfg.root, &into)?;
    let meta_dir = cfg.root.join("meta");
    std::fs::rename(&meta_dir, into.join("meta")).map_err(|e| {
        RaftNodeError::Store(ledgermq_store::StoreError::Io {
            path: meta_dir.clone(),
            source: e,
        })
    })?;
    ledgermq_store::mapped_file::fsync_dir(&cfg.root)?;
    let store = MessageStore::open(cfg.clone())?;
    let meta = MetaDb::open(&meta_dir)?;
    Ok(Storage {
        store,
        meta,
        vote_file,
        set_aside: Some(into),
    })
}

/// Removes the messages set aside in `into` once `store` holds again everything
/// it had acknowledged ([`super::upkeep::caught_up`]): the group has given them
/// back, so the old copies are redundant. Gives up when the store closes.
pub(crate) async fn remove_set_aside_when_caught_up(store: Arc<MessageStore>, into: PathBuf) {
    if !super::upkeep::caught_up(&store).await {
        return;
    }
    let path = into.clone();
    let res =
        tokio::task::spawn_blocking(move || ledgermq_store::set_aside::remove_set_aside(&path))
            .await;
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
