//! The users of `[[auth.users]]` (the configuration's bootstrap users): the
//! leader of each term creates those the group does not have, through Raft
//! (`Command::CreateAclUser`: the user with its permissions in one entry, a
//! no-op where the user exists), so a fresh group has them without an
//! `mqadmin` step. A user that exists is left
//! as it is: what `mqadmin` changed is never undone by a restart.

use std::sync::Arc;
use std::time::Duration;

use ledgermq_meta::{AclUser, Command};
use tokio::task::JoinHandle;

use crate::broker::Broker;
use crate::leader_term::{TermEnd, TermService};

/// The leader-term service that creates the bootstrap users.
pub struct AclBootstrap {
    /// The broker whose group gets the users.
    pub broker: Arc<Broker>,
    /// Time between attempts while some are missing.
    pub interval: Duration,
}

impl AclBootstrap {
    /// The bootstrap users the group does not have yet.
    fn missing(&self) -> Vec<AclUser> {
        let meta = self.broker.meta();
        self.broker
            .settings
            .auth
            .bootstrap_users
            .iter()
            .filter(|u| !meta.acl_users.contains_key(&u.username))
            .cloned()
            .collect()
    }
}

impl TermService for AclBootstrap {
    fn name(&self) -> &'static str {
        "bootstrap users"
    }

    fn start(self: Arc<Self>, term: u64, end: TermEnd) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = end.ticks(self.interval);
            while ticks.next().await {
                if self.broker.consumers.ready_term() != Some(term) {
                    continue;
                }
                let missing = self.missing();
                if missing.is_empty() {
                    break;
                }
                for u in missing {
                    let name = u.username.clone();
                    match self
                        .broker
                        .node
                        .write_command(Command::CreateAclUser(u))
                        .await
                    {
                        Ok(_) => tracing::info!(user = %name, term, "bootstrap user created"),
                        Err(e) => {
                            tracing::warn!(user = %name, error = %e,
                                "creating a bootstrap user failed; will retry");
                            break;
                        }
                    }
                }
            }
        })
    }
}
