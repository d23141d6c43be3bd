//! Configuration changes every selected broker group commits through Raft
//! (updateTopic, updateSubGroup, deleteTopic, deleteSubGroup, and the users
//! and permissions of `crate::acl`): each is sent to
//! the group's first member that answers, which commits it.

use anyhow::{bail, Result};
use ledgermq_broker::admin_pb::{
    DeleteGroupRequest, DeleteTopicRequest, UpdateGroupRequest, UpdateTopicRequest,
};

use crate::cluster;
use crate::select::{groups, Scope};

/// Sends one admin change to every selected group (to its first member that
/// answers); fails if any group refused it.
pub async fn apply(namesrv: &str, scope: &Scope, what: &str, req: AdminReq) -> Result<()> {
    let mut failed = 0;
    for (group, addrs) in groups(namesrv, scope).await? {
        let mut result = Err(anyhow::anyhow!("no member reachable"));
        for addr in &addrs {
            let Ok(mut c) = cluster::channel(addr, None)
                .await
                .map(crate::cluster::admin_client)
            else {
                continue;
            };
            let reply = match &req {
                AdminReq::Topic(r) => c.update_topic(r.clone()).await,
                AdminReq::Group(r) => c.update_group(r.clone()).await,
                AdminReq::DeleteTopic(r) => c.delete_topic(r.clone()).await,
                AdminReq::DeleteGroup(r) => c.delete_group(r.clone()).await,
                AdminReq::PutUser(r) => c.put_user(r.clone()).await,
                AdminReq::DeleteUser(r) => c.delete_user(r.clone()).await,
                AdminReq::SetAcl(r) => c.set_acl(r.clone()).await,
            };
            let policy_given = matches!(&req, AdminReq::Group(g) if !g.retry_policy.is_empty());
            result = match reply {
                Ok(r)
                    if r.get_ref().error.is_empty()
                        && policy_given
                        && !r.get_ref().retry_policy_set =>
                {
                    Err(anyhow::anyhow!(
                        "{addr} runs a release that does not read retry policies: the group was \
                         updated without its retry policy; upgrade every member and run this again"
                    ))
                }
                Ok(r) if r.get_ref().error.is_empty() => Ok(()),
                Ok(r) => Err(anyhow::anyhow!(r.into_inner().error)),
                Err(s) => Err(anyhow::anyhow!("{addr}: {}", s.message())),
            };
            if result.is_ok() {
                break;
            }
        }
        match result {
            Ok(()) => println!("{what} on broker group {group}: OK"),
            Err(e) => {
                failed += 1;
                println!("{what} on broker group {group}: FAILED: {e}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} broker group(s) refused the change");
    }
    Ok(())
}

/// One change.
pub enum AdminReq {
    Topic(UpdateTopicRequest),
    Group(UpdateGroupRequest),
    DeleteTopic(DeleteTopicRequest),
    DeleteGroup(DeleteGroupRequest),
    PutUser(ledgermq_broker::admin_pb::PutUserRequest),
    DeleteUser(ledgermq_broker::admin_pb::DeleteUserRequest),
    SetAcl(ledgermq_broker::admin_pb::SetAclRequest),
}

/// The `message.type` a RocketMQ attribute list (`-a`) sets: `+message.type=X`
/// gives X as written (the broker checks it), `-message.type` gives NORMAL (the
/// attribute's default), no mention None. Entries are comma-separated and each
/// begins with `+` (add or change, `key=value`) or `-` (remove, `key`), as
/// RocketMQ's `AttributeParser` reads them. Errors: another form, another key
/// (this broker has no other topic attribute), the key twice.
pub fn topic_message_type(attributes: &str) -> Result<Option<String>> {
    let mut found = None;
    for entry in attributes
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (key, value) = if let Some(kv) = entry.strip_prefix('+') {
            match kv.split_once('=') {
                Some((k, v)) if !v.is_empty() => (k, v.to_owned()),
                _ => bail!("attribute {entry:?}: adding one takes +key=value"),
            }
        } else if let Some(k) = entry.strip_prefix('-') {
            if k.contains('=') {
                bail!("attribute {entry:?}: removing one takes -key, without a value");
            }
            (k, "NORMAL".to_owned())
        } else {
            bail!("attribute {entry:?} must begin with + (add) or - (remove)");
        };
        if key != "message.type" {
            bail!("attribute {key:?} is not supported (topics take message.type)");
        }
        if found.replace(value).is_some() {
            bail!("message.type is given twice in {attributes:?}");
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::topic_message_type;

    #[test]
    fn attributes_set_the_message_type_as_rocketmq_writes_them() {
        let t = |a: &str| topic_message_type(a).unwrap();
        assert_eq!(t("+message.type=DELAY"), Some("DELAY".into()));
        assert_eq!(t(" +message.type=MIXED , "), Some("MIXED".into()));
        assert_eq!(t("-message.type"), Some("NORMAL".into()));
        assert_eq!(t(""), None);
        for bad in [
            "message.type=DELAY",
            "+message.type",
            "+message.type=",
            "-message.type=FIFO",
            "+queue.type=BCQ",
            "+message.type=FIFO,+message.type=DELAY",
        ] {
            assert!(topic_message_type(bad).is_err(), "{bad}");
        }
    }
}
