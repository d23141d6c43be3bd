//! The admin calls on users and their permissions (`mqadmin createUser`,
//! `updateUser`, `deleteUser`, `createAcl`/`updateAcl`, `deleteAcl`,
//! `listUser`/`listAcl`): each change is one command committed through Raft
//! from any member ([`ledgermq_meta::Command::PutAclUser`], `SetAclPerm`,
//! `DeleteAclUser`), so every member enforces the same rules.

use ledgermq_meta::{AclResource, AclUser, Command};

use crate::admin_pb::{
    AclEntry, AdminResponse, DeleteUserRequest, ListUsersRequest, ListUsersResponse,
    PutUserRequest, SetAclRequest, UserInfo,
};
use crate::broker::Broker;
use crate::config::auth::parse_perm;

fn failed(error: String) -> AdminResponse {
    AdminResponse {
        error,
        ..Default::default()
    }
}

async fn commit(b: &Broker, cmd: Command) -> AdminResponse {
    match b.node.write_command(cmd).await {
        Ok(_) => AdminResponse::default(),
        Err(e) => failed(e.to_string()),
    }
}

/// The user's admin flag in this node's copy, None when there is no such user.
fn user_type(b: &Broker, username: &str) -> Option<bool> {
    b.meta().acl_users.get(username).map(|u| u.admin)
}

/// createUser / updateUser. Whether the user exists is read from this node's
/// copy (a change racing another admin's is the operators' to order).
pub(crate) async fn put_user(b: &Broker, r: &PutUserRequest) -> AdminResponse {
    if let Err(e) = crate::auth::check_access_key("username", &r.username)
        .and_then(|()| crate::auth::check_secret_key("secret key", &r.secret_key))
    {
        return failed(e);
    }
    if b.settings
        .auth
        .inner
        .as_ref()
        .is_some_and(|i| i.access_key == r.username)
    {
        return failed(format!("{} is the members' own access key", r.username));
    }
    let current_admin = user_type(b, &r.username);
    let exists = current_admin.is_some();
    if r.must_be_new && exists {
        return failed(format!(
            "user {} exists (updateUser changes it)",
            r.username
        ));
    }
    if r.must_exist && !exists {
        return failed(format!("user {} is not found", r.username));
    }
    // updateUser without a type keeps the user's (as read here).
    let admin = match (r.keep_type, current_admin) {
        (true, Some(a)) => a,
        _ => r.admin,
    };
    tracing::info!(user = %r.username, admin, "user created or changed");
    commit(
        b,
        Command::PutAclUser {
            username: r.username.clone(),
            secret_key: r.secret_key.as_str().into(),
            admin,
        },
    )
    .await
}

/// deleteUser.
pub(crate) async fn delete_user(b: &Broker, r: &DeleteUserRequest) -> AdminResponse {
    if user_type(b, &r.username).is_none() {
        return failed(format!("user {} is not found", r.username));
    }
    tracing::info!(user = %r.username, "user deleted");
    commit(b, Command::DeleteAclUser(r.username.clone())).await
}

/// createAcl / updateAcl / deleteAcl (an empty `perm`).
pub(crate) async fn set_acl(b: &Broker, r: &SetAclRequest) -> AdminResponse {
    let Some(resource) = AclResource::parse(&r.resource) else {
        return failed(format!(
            "resource {:?} is not Topic:NAME, Group:NAME, Topic:* or Group:*",
            r.resource
        ));
    };
    let perm = match r.perm.as_str() {
        "" => None,
        p => match parse_perm(p) {
            Some(p) => Some(p),
            None => return failed(format!("permission {p:?} is not DENY, PUB, SUB or PUB|SUB")),
        },
    };
    if user_type(b, &r.username).is_none() {
        return failed(format!("user {} is not found", r.username));
    }
    tracing::info!(user = %r.username, resource = %r.resource, perm = %r.perm, "permission set");
    commit(
        b,
        Command::SetAclPerm {
            username: r.username.clone(),
            resource,
            perm,
        },
    )
    .await
}

/// A user as listUser / listAcl show it: no secret key.
pub fn user_info(u: &AclUser) -> UserInfo {
    let entry = |r: AclResource, p: ledgermq_meta::Perm| AclEntry {
        resource: r.name(),
        perm: p.name().to_owned(),
    };
    let mut acl = vec![
        entry(AclResource::AnyTopic, u.default_topic_perm),
        entry(AclResource::AnyGroup, u.default_group_perm),
    ];
    acl.extend(
        u.topic_perms
            .iter()
            .map(|(t, p)| entry(AclResource::Topic(t.clone()), *p)),
    );
    acl.extend(
        u.group_perms
            .iter()
            .map(|(g, p)| entry(AclResource::Group(g.clone()), *p)),
    );
    UserInfo {
        username: u.username.clone(),
        admin: u.admin,
        acl,
    }
}

/// listUser / listAcl, from this node's copy.
pub(crate) fn list_users(b: &Broker, r: &ListUsersRequest) -> ListUsersResponse {
    let meta = b.meta();
    let users: Vec<UserInfo> = meta
        .acl_users
        .values()
        .filter(|u| r.username.is_empty() || u.username == r.username)
        .map(user_info)
        .collect();
    if !r.username.is_empty() && users.is_empty() {
        return ListUsersResponse {
            error: format!("user {} is not found", r.username),
            users,
        };
    }
    ListUsersResponse {
        error: String::new(),
        users,
    }
}
