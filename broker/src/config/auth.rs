//! The `[auth]` table of a broker node's configuration: client authentication
//! and ACLs ([`crate::auth`]), and the users a leader creates at start.
//!
//! ```toml
//! [auth]
//! enabled = true
//! max_clock_skew_ms = 900000
//! inner_access_key = "ledgermq-inner"
//! inner_secret_key = "change-me"
//!
//! [[auth.users]]
//! username = "demo"
//! secret_key = "demo-secret"
//! permissions = { "Topic:SecureTopic" = "PUB|SUB", "Group:SecureGroup" = "SUB" }
//! ```

use std::collections::BTreeMap;

use ledgermq_meta::{AclResource, Perm};
use serde::{Deserialize, Serialize};

/// The `[auth]` table. `Debug` and `Serialize` (getBrokerConfig) show the
/// secret keys as `<redacted>`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Check every client call's signature and the caller's permissions
    /// (RocketMQ's `authenticationEnabled` and `authorizationEnabled`); off by
    /// default.
    #[serde(default)]
    pub enabled: bool,
    /// Largest difference accepted between a request's `x-mq-date-time` and
    /// this node's clock, ms (15 min by default; 0 does not check it).
    #[serde(default = "default_max_clock_skew_ms")]
    pub max_clock_skew_ms: u64,
    /// The members' own access key (RocketMQ's
    /// `innerClientAuthenticationCredentials`): the same on every member; an
    /// admin everywhere. Required when `enabled`.
    #[serde(default)]
    pub inner_access_key: Option<String>,
    /// The members' own secret key. Required when `enabled`; shown as
    /// `<redacted>` by getBrokerConfig.
    #[serde(default, serialize_with = "redacted")]
    pub inner_secret_key: Option<String>,
    /// The access key this node signs its registrations at the name servers
    /// with (their `[auth] broker_access_key`): the same on every node of the
    /// cluster, and distinct from every user's and the members' own, since it
    /// grants nothing on the brokers. Registrations are unsigned when unset.
    #[serde(default)]
    pub registration_access_key: Option<String>,
    /// Its secret key (the name servers' `broker_secret_key`); shown as
    /// `<redacted>` by getBrokerConfig.
    #[serde(default, serialize_with = "redacted")]
    pub registration_secret_key: Option<String>,
    /// Users the leader creates at the start of its term when the group has
    /// no user of that name (existing users, and their permissions, are left
    /// as `mqadmin` last set them).
    #[serde(default)]
    pub users: Vec<BootstrapUser>,
}

/// A user of `[[auth.users]]`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapUser {
    /// The access key.
    pub username: String,
    /// The secret key (shown as `<redacted>` by getBrokerConfig).
    #[serde(serialize_with = "redacted_str")]
    pub secret_key: String,
    /// May do anything, admin calls included.
    #[serde(default)]
    pub admin: bool,
    /// `Topic:NAME`, `Group:NAME`, `Topic:*` or `Group:*` → `DENY`, `PUB`,
    /// `SUB` or `PUB|SUB`.
    #[serde(default)]
    pub permissions: BTreeMap<String, String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("enabled", &self.enabled)
            .field("max_clock_skew_ms", &self.max_clock_skew_ms)
            .field("inner_access_key", &self.inner_access_key)
            .field(
                "inner_secret_key",
                &self.inner_secret_key.as_ref().map(|_| "<redacted>"),
            )
            .field("users", &self.users)
            .finish()
    }
}

impl std::fmt::Debug for BootstrapUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapUser")
            .field("username", &self.username)
            .field("secret_key", &"<redacted>")
            .field("admin", &self.admin)
            .field("permissions", &self.permissions)
            .finish()
    }
}

fn default_max_clock_skew_ms() -> u64 {
    900_000
}

fn redacted<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_some("<redacted>"),
        None => s.serialize_none(),
    }
}

fn redacted_str<S: serde::Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_clock_skew_ms: default_max_clock_skew_ms(),
            inner_access_key: None,
            inner_secret_key: None,
            registration_access_key: None,
            registration_secret_key: None,
            users: Vec::new(),
        }
    }
}

/// Reads a permission as RocketMQ writes it (`DENY`, `PUB`, `SUB`,
/// `PUB|SUB`, `SUB|PUB`; any case). None for anything else.
pub fn parse_perm(s: &str) -> Option<Perm> {
    let s = s.trim().to_ascii_uppercase();
    match s.as_str() {
        "DENY" => Some(Perm::Deny),
        "PUB" => Some(Perm::Pub),
        "SUB" => Some(Perm::Sub),
        "PUB|SUB" | "SUB|PUB" => Some(Perm::PubSub),
        _ => None,
    }
}

impl BootstrapUser {
    /// The user's permissions, read. Error: the entry that does not read.
    pub fn perms(&self) -> Result<Vec<(AclResource, Perm)>, String> {
        self.permissions
            .iter()
            .map(|(r, p)| {
                let resource = AclResource::parse(r).ok_or_else(|| {
                    format!(
                        "auth.users {}: {r:?} is not Topic:NAME, Group:NAME, Topic:* or Group:*",
                        self.username
                    )
                })?;
                let perm = parse_perm(p).ok_or_else(|| {
                    format!(
                        "auth.users {}: {p:?} is not DENY, PUB, SUB or PUB|SUB",
                        self.username
                    )
                })?;
                Ok((resource, perm))
            })
            .collect()
    }
}

impl AuthConfig {
    /// The credentials registrations at the name servers are signed with,
    /// None when unset. Error: one key without the other, or a key the
    /// signature cannot carry.
    pub fn registration(&self) -> Result<Option<crate::auth::Credentials>, String> {
        match (&self.registration_access_key, &self.registration_secret_key) {
            (None, None) => Ok(None),
            (Some(a), Some(s)) => {
                crate::auth::check_access_key("auth.registration_access_key", a)?;
                crate::auth::check_secret_key("auth.registration_secret_key", s)?;
                if self.inner_access_key.as_deref() == Some(a.as_str())
                    || self.users.iter().any(|u| &u.username == a)
                {
                    return Err(
                        "auth.registration_access_key must not be a user's or the members' \
                         own: name servers see it"
                            .into(),
                    );
                }
                Ok(Some(crate::auth::Credentials {
                    access_key: a.clone(),
                    secret_key: s.clone(),
                }))
            }
            _ => Err(
                "auth.registration_access_key and auth.registration_secret_key go together".into(),
            ),
        }
    }

    /// The settings the client port checks with. Error: a value out of
    /// range, named by its key.
    pub fn settings(&self) -> Result<crate::auth::AuthSettings, String> {
        let inner =
            match (&self.inner_access_key, &self.inner_secret_key) {
                (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => {
                    crate::auth::check_access_key("auth.inner_access_key", a)?;
                    crate::auth::check_secret_key("auth.inner_secret_key", s)?;
                    Some(crate::auth::Credentials {
                        access_key: a.clone(),
                        secret_key: s.clone(),
                    })
                }
                (None, None) => None,
                _ => return Err(
                    "auth.inner_access_key and auth.inner_secret_key go together, neither empty"
                        .into(),
                ),
            };
        if self.enabled && inner.is_none() {
            return Err(
                "auth.enabled needs auth.inner_access_key and auth.inner_secret_key \
                        (the members sign the calls they pass on to the leader with them)"
                    .into(),
            );
        }
        for u in &self.users {
            crate::auth::check_access_key("auth.users username", &u.username)?;
            crate::auth::check_secret_key(
                &format!("auth.users {} secret_key", u.username),
                &u.secret_key,
            )?;
            if inner.as_ref().is_some_and(|i| i.access_key == u.username) {
                return Err(format!(
                    "auth.users {}: the name is auth.inner_access_key's",
                    u.username
                ));
            }
        }
        let bootstrap_users = self
            .users
            .iter()
            .map(|u| {
                let mut user = ledgermq_meta::AclUser::new(&u.username, &u.secret_key, u.admin);
                for (r, p) in u.perms()? {
                    user.set_perm(&r, Some(p));
                }
                Ok(user)
            })
            .collect::<Result<_, String>>()?;
        Ok(crate::auth::AuthSettings {
            enabled: self.enabled,
            max_clock_skew_ms: self.max_clock_skew_ms,
            inner,
            bootstrap_users,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_and_checks_its_values() {
        let c: AuthConfig = toml::from_str(
            r#"
            enabled = true
            inner_access_key = "i"
            inner_secret_key = "s"
            [[users]]
            username = "demo"
            secret_key = "demo-secret"
            permissions = { "Topic:SecureTopic" = "PUB|SUB", "Group:SecureGroup" = "sub" }
            "#,
        )
        .unwrap();
        let s = c.settings().unwrap();
        assert!(s.enabled);
        assert_eq!(s.max_clock_skew_ms, 900_000);
        assert_eq!(
            c.users[0].perms().unwrap(),
            vec![
                (AclResource::Group("SecureGroup".into()), Perm::Sub),
                (AclResource::Topic("SecureTopic".into()), Perm::PubSub),
            ]
        );
        let shown = toml::to_string(&c).unwrap();
        assert!(
            !shown.contains("demo-secret") && !shown.contains("\"s\""),
            "{shown}"
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("demo-secret") && !debug.contains("\"s\""),
            "{debug}"
        );
        let mut no_inner = c.clone();
        no_inner.inner_secret_key = None;
        assert!(no_inner.settings().unwrap_err().contains("go together"));
        no_inner.inner_access_key = None;
        assert!(no_inner
            .settings()
            .unwrap_err()
            .contains("needs auth.inner"));
        let mut bad = c.clone();
        bad.users[0]
            .permissions
            .insert("Topic:X".into(), "WRITE".into());
        assert!(bad.settings().unwrap_err().contains("WRITE"));
        let mut bad = c;
        bad.users[0]
            .permissions
            .insert("Cluster:X".into(), "PUB".into());
        assert!(bad.settings().unwrap_err().contains("Cluster:X"));
        assert!(!AuthConfig::default().settings().unwrap().enabled);
    }
}
