//! Users and their permissions, RocketMQ 5's `mqadmin` ACL commands:
//! `createUser`, `updateUser`, `deleteUser`, `listUser`, `createAcl`,
//! `updateAcl`, `deleteAcl`, `listAcl`. Every broker group has its own users
//! (replicated through its Raft log, as RocketMQ keeps them per broker);
//! changes go to every selected group (`-c`, `-b`).

use anyhow::{bail, Result};
use clap::Subcommand;
use ledgermq_broker::admin_pb::{
    DeleteUserRequest, ListUsersRequest, PutUserRequest, SetAclRequest,
};

use crate::changes::{apply, AdminReq};
use crate::cluster;
use crate::select::{groups, Scope};

/// The ACL commands.
#[derive(Subcommand)]
pub enum AclCmd {
    /// Create a user.
    #[command(name = "createUser")]
    CreateUser(UserArgs),
    /// Change a user's secret key and type (its permissions stay).
    #[command(name = "updateUser")]
    UpdateUser(UserArgs),
    /// Delete a user and its permissions.
    #[command(name = "deleteUser")]
    DeleteUser {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// The user.
        #[arg(short = 'u', long = "username")]
        username: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// List users (no secret keys), with their permissions.
    #[command(name = "listUser", alias = "listAcl")]
    ListUser {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Only this user (`NAME` or `User:NAME`).
        #[arg(short = 'u', long = "username", alias = "subject", short_alias = 's')]
        username: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Grant: set a user's permission on resources.
    #[command(name = "createAcl", alias = "updateAcl")]
    CreateAcl(AclArgs),
    /// Remove a user's own permission on resources (the default applies again;
    /// `Topic:*` / `Group:*` go back to DENY).
    #[command(name = "deleteAcl")]
    DeleteAcl(Grantee),
}

/// Whose permissions on what: createAcl's and deleteAcl's common arguments.
#[derive(clap::Args)]
pub struct Grantee {
    /// Name server address(es).
    #[arg(short = 'n', long = "namesrvAddr")]
    namesrv: String,
    /// The user: `User:NAME` (or `NAME`).
    #[arg(short = 's', long = "subject")]
    subject: String,
    /// Resources, comma-separated: `Topic:NAME`, `Group:NAME`, `Topic:*`, `Group:*`.
    #[arg(short = 'r', long = "resources")]
    resources: String,
    #[command(flatten)]
    scope: Scope,
}

/// createUser / updateUser.
#[derive(clap::Args)]
pub struct UserArgs {
    /// Name server address(es).
    #[arg(short = 'n', long = "namesrvAddr")]
    namesrv: String,
    /// The user (access key).
    #[arg(short = 'u', long = "username")]
    username: String,
    /// Its secret key.
    #[arg(short = 'p', long = "password")]
    password: String,
    /// `Super` (may do anything, admin calls included) or `Normal`; createUser
    /// without it makes a Normal user, updateUser keeps the user's type.
    #[arg(short = 't', long = "userType")]
    user_type: Option<String>,
    #[command(flatten)]
    scope: Scope,
}

/// createAcl / updateAcl.
#[derive(clap::Args)]
pub struct AclArgs {
    #[command(flatten)]
    grantee: Grantee,
    /// Actions, comma-separated: `Pub`, `Sub`, `All`.
    #[arg(short = 'a', long = "actions", default_value = "All")]
    actions: String,
    /// `Allow` (the actions given) or `Deny` (nothing).
    #[arg(short = 'd', long = "decision", default_value = "Allow")]
    decision: String,
}

fn user_of(subject: &str) -> &str {
    subject.strip_prefix("User:").unwrap_or(subject)
}

fn admin_of(user_type: &str) -> Result<bool> {
    match user_type.to_ascii_lowercase().as_str() {
        "super" => Ok(true),
        "normal" => Ok(false),
        _ => bail!("userType {user_type:?} is not Super or Normal"),
    }
}

/// The permission an `-a ACTIONS -d DECISION` pair stands for, RocketMQ's
/// spelling. Errors: an unknown action or decision.
pub fn perm_of(actions: &str, decision: &str) -> Result<&'static str> {
    let (mut publish, mut subscribe) = (false, false);
    for a in actions.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match a.to_ascii_lowercase().as_str() {
            "pub" => publish = true,
            "sub" => subscribe = true,
            "all" => (publish, subscribe) = (true, true),
            _ => bail!("action {a:?} is not Pub, Sub or All"),
        }
    }
    match decision.to_ascii_lowercase().as_str() {
        "deny" => Ok("DENY"),
        "allow" => Ok(ledgermq_meta::Perm::of(publish, subscribe).name()),
        _ => bail!("decision {decision:?} is not Allow or Deny"),
    }
}

/// Runs one ACL command.
pub async fn run(cmd: AclCmd) -> Result<()> {
    match cmd {
        AclCmd::CreateUser(a) | AclCmd::UpdateUser(a) if a.username.is_empty() => {
            bail!("--username is empty")
        }
        AclCmd::CreateUser(a) => put_user(a, true).await,
        AclCmd::UpdateUser(a) => put_user(a, false).await,
        AclCmd::DeleteUser {
            namesrv,
            username,
            scope,
        } => {
            let req = AdminReq::DeleteUser(DeleteUserRequest {
                username: username.clone(),
            });
            apply(&namesrv, &scope, &format!("deleteUser {username}"), req).await
        }
        AclCmd::CreateAcl(a) => set(&a.grantee, perm_of(&a.actions, &a.decision)?).await,
        AclCmd::DeleteAcl(g) => set(&g, "").await,
        AclCmd::ListUser {
            namesrv,
            username,
            scope,
        } => list(&namesrv, &scope, username.as_deref().map(user_of)).await,
    }
}

async fn put_user(a: UserArgs, create: bool) -> Result<()> {
    let req = PutUserRequest {
        username: a.username.clone(),
        secret_key: a.password,
        admin: match &a.user_type {
            Some(t) => admin_of(t)?,
            None => false,
        },
        must_be_new: create,
        must_exist: !create,
        keep_type: a.user_type.is_none() && !create,
    };
    let what = if create { "createUser" } else { "updateUser" };
    apply(
        &a.namesrv,
        &a.scope,
        &format!("{what} {}", a.username),
        AdminReq::PutUser(req),
    )
    .await
}

/// Sets (`perm`) or removes (empty) `g`'s user's permission on each of its
/// resources, on every selected group.
async fn set(g: &Grantee, perm: &str) -> Result<()> {
    let (namesrv, scope, resources) = (&g.namesrv, &g.scope, &g.resources);
    let user = user_of(&g.subject);
    for r in resources
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
    {
        let req = AdminReq::SetAcl(SetAclRequest {
            username: user.to_owned(),
            resource: r.to_owned(),
            perm: perm.to_owned(),
        });
        let what = match perm {
            "" => format!("deleteAcl User:{user} {r}"),
            p => format!("acl User:{user} {r} {p}"),
        };
        apply(namesrv, scope, &what, req).await?;
    }
    Ok(())
}

async fn list(namesrv: &str, scope: &Scope, username: Option<&str>) -> Result<()> {
    let mut failed = 0;
    for (group, addrs) in groups(namesrv, scope).await? {
        let mut answer = None;
        for addr in &addrs {
            let Ok(mut c) = cluster::channel(addr, Some(std::time::Duration::from_secs(10)))
                .await
                .map(cluster::admin_client)
            else {
                continue;
            };
            let req = ListUsersRequest {
                username: username.unwrap_or_default().to_owned(),
            };
            match c.list_users(req).await {
                Ok(r) => {
                    answer = Some(Ok(r.into_inner()));
                    break;
                }
                Err(s) => answer = Some(Err(format!("{addr}: {}", s.message()))),
            }
        }
        match answer {
            Some(Ok(r)) if r.error.is_empty() => {
                println!("broker group {group}:");
                for u in r.users {
                    let kind = if u.admin { "Super" } else { "Normal" };
                    let acl: Vec<String> = u
                        .acl
                        .iter()
                        .map(|e| format!("{}={}", e.resource, e.perm))
                        .collect();
                    println!("  User:{} {kind} {}", u.username, acl.join(" "));
                }
            }
            Some(Ok(r)) => {
                failed += 1;
                println!("broker group {group}: FAILED: {}", r.error);
            }
            Some(Err(e)) => {
                failed += 1;
                println!("broker group {group}: FAILED: {e}");
            }
            None => {
                failed += 1;
                println!("broker group {group}: FAILED: no member reachable");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} broker group(s) did not answer");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_a_decision_make_rocketmqs_permission() {
        assert_eq!(perm_of("Pub,Sub", "Allow").unwrap(), "PUB|SUB");
        assert_eq!(perm_of("All", "allow").unwrap(), "PUB|SUB");
        assert_eq!(perm_of("Pub", "Allow").unwrap(), "PUB");
        assert_eq!(perm_of("sub", "Allow").unwrap(), "SUB");
        assert_eq!(perm_of("Pub,Sub", "Deny").unwrap(), "DENY");
        assert!(perm_of("Get", "Allow").is_err());
        assert!(perm_of("Pub", "Maybe").is_err());
        assert_eq!(user_of("User:demo"), "demo");
        assert_eq!(user_of("demo"), "demo");
        assert!(admin_of("Super").unwrap());
        assert!(admin_of("x").is_err());
    }
}
