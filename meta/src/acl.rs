//! Users and their permissions (ACLs), replicated through Raft so every member
//! of a group enforces the same rules: [`AclUser`] as the state machine holds
//! it, and the pure decision [`AclUser::permits`]. The model is RocketMQ's
//! (ACL 1.0's `plain_acl.yml` accounts: a secret key, an admin flag, a
//! permission per topic and per consumer group, and a default for the rest;
//! the names of ACL 2.0's `mqadmin createUser` / `createAcl`). No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a user may do with a topic or a consumer group (RocketMQ's `DENY`,
/// `PUB`, `SUB`, `PUB|SUB`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Perm {
    /// Nothing.
    #[default]
    Deny,
    /// Send (topics).
    Pub,
    /// Receive (topics) or consume as (consumer groups).
    Sub,
    /// Both.
    PubSub,
}

impl Perm {
    /// True when this permission allows `action`.
    pub fn allows(self, action: Action) -> bool {
        matches!(
            (self, action),
            (Perm::PubSub, _) | (Perm::Pub, Action::Pub) | (Perm::Sub, Action::Sub)
        )
    }

    /// The permission that allows exactly `actions` (`Deny` for none).
    pub fn of(publish: bool, subscribe: bool) -> Perm {
        match (publish, subscribe) {
            (true, true) => Perm::PubSub,
            (true, false) => Perm::Pub,
            (false, true) => Perm::Sub,
            (false, false) => Perm::Deny,
        }
    }

    /// RocketMQ's spelling: `DENY`, `PUB`, `SUB`, `PUB|SUB`.
    pub fn name(self) -> &'static str {
        match self {
            Perm::Deny => "DENY",
            Perm::Pub => "PUB",
            Perm::Sub => "SUB",
            Perm::PubSub => "PUB|SUB",
        }
    }
}

/// An action a request needs on a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send to a topic (SendMessage, EndTransaction).
    Pub,
    /// Receive from a topic, or consume as a consumer group.
    Sub,
}

/// What a permission is about: one topic or consumer group, or every topic or
/// group without a permission of its own (RocketMQ's `Topic:*`, `Group:*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AclResource {
    /// One topic by name.
    Topic(String),
    /// One consumer group by name.
    Group(String),
    /// Every topic without its own permission (the user's default).
    AnyTopic,
    /// Every consumer group without its own permission (the user's default).
    AnyGroup,
}

impl AclResource {
    /// RocketMQ's spelling: `Topic:NAME`, `Group:NAME`, `Topic:*`, `Group:*`.
    pub fn name(&self) -> String {
        match self {
            AclResource::Topic(t) => format!("Topic:{t}"),
            AclResource::Group(g) => format!("Group:{g}"),
            AclResource::AnyTopic => "Topic:*".to_owned(),
            AclResource::AnyGroup => "Group:*".to_owned(),
        }
    }

    /// Reads RocketMQ's spelling ([`AclResource::name`]); the kind is matched
    /// without regard to case. None for anything else.
    pub fn parse(s: &str) -> Option<AclResource> {
        let (kind, name) = s.split_once(':')?;
        if name.is_empty() {
            return None;
        }
        match (kind.to_ascii_lowercase().as_str(), name) {
            ("topic", "*") => Some(AclResource::AnyTopic),
            ("group", "*") => Some(AclResource::AnyGroup),
            ("topic", n) => Some(AclResource::Topic(n.to_owned())),
            ("group", n) => Some(AclResource::Group(n.to_owned())),
            _ => None,
        }
    }
}

/// A secret key: kept as given (it is the HMAC key of the user's
/// signatures), serialized as the plain string it wraps (`transparent`, so the
/// stored layout is a string's), shown as `<redacted>` by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretKey(pub String);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl SecretKey {
    /// The key's text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SecretKey {
    fn from(s: &str) -> Self {
        SecretKey(s.to_owned())
    }
}

/// One user: the secret key requests are signed with, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclUser {
    /// The access key (RocketMQ's username / AK).
    pub username: String,
    /// The secret key (RocketMQ's password / SK): the HMAC-SHA1 key of the
    /// user's signatures, so kept as given.
    pub secret_key: SecretKey,
    /// An admin (RocketMQ's `Super` user type, ACL 1.0's `admin: true`) may do
    /// anything, admin calls included.
    pub admin: bool,
    /// Permission on topics not in `topic_perms`.
    pub default_topic_perm: Perm,
    /// Permission on consumer groups not in `group_perms`.
    pub default_group_perm: Perm,
    /// Topic name → permission.
    pub topic_perms: BTreeMap<String, Perm>,
    /// Consumer group name → permission.
    pub group_perms: BTreeMap<String, Perm>,
}

impl AclUser {
    /// A user with no permission but its admin flag.
    pub fn new(username: &str, secret_key: &str, admin: bool) -> AclUser {
        AclUser {
            username: username.to_owned(),
            secret_key: secret_key.into(),
            admin,
            default_topic_perm: Perm::Deny,
            default_group_perm: Perm::Deny,
            topic_perms: BTreeMap::new(),
            group_perms: BTreeMap::new(),
        }
    }

    /// The user's permission on `resource`: its own, else (for one topic or
    /// group) the default of its kind.
    pub fn perm(&self, resource: &AclResource) -> Perm {
        match resource {
            AclResource::Topic(t) => self
                .topic_perms
                .get(t)
                .copied()
                .unwrap_or(self.default_topic_perm),
            AclResource::Group(g) => self
                .group_perms
                .get(g)
                .copied()
                .unwrap_or(self.default_group_perm),
            AclResource::AnyTopic => self.default_topic_perm,
            AclResource::AnyGroup => self.default_group_perm,
        }
    }

    /// Sets the permission on `resource`; `None` removes a topic's or group's
    /// own permission (the default applies again) or resets a default to
    /// `Deny`.
    pub fn set_perm(&mut self, resource: &AclResource, perm: Option<Perm>) {
        match resource {
            AclResource::Topic(t) => match perm {
                Some(p) => {
                    self.topic_perms.insert(t.clone(), p);
                }
                None => {
                    self.topic_perms.remove(t);
                }
            },
            AclResource::Group(g) => match perm {
                Some(p) => {
                    self.group_perms.insert(g.clone(), p);
                }
                None => {
                    self.group_perms.remove(g);
                }
            },
            AclResource::AnyTopic => self.default_topic_perm = perm.unwrap_or_default(),
            AclResource::AnyGroup => self.default_group_perm = perm.unwrap_or_default(),
        }
    }

    /// True when the user may do one of `actions` on `resource` (an admin may
    /// do anything). RocketMQ's QueryRoute needs `PUB` or `SUB` on the topic,
    /// hence "one of".
    pub fn permits(&self, resource: &AclResource, actions: &[Action]) -> bool {
        if self.admin {
            return true;
        }
        let p = self.perm(resource);
        actions.iter().any(|a| p.allows(*a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_own_permission_wins_over_the_default() {
        let mut u = AclUser::new("demo", "s", false);
        u.set_perm(&AclResource::Topic("T".into()), Some(Perm::Pub));
        u.set_perm(&AclResource::AnyTopic, Some(Perm::Sub));
        assert!(u.permits(&AclResource::Topic("T".into()), &[Action::Pub]));
        assert!(!u.permits(&AclResource::Topic("T".into()), &[Action::Sub]));
        assert!(u.permits(&AclResource::Topic("U".into()), &[Action::Sub]));
        assert!(!u.permits(&AclResource::Topic("U".into()), &[Action::Pub]));
        assert!(!u.permits(&AclResource::Group("G".into()), &[Action::Sub]));
        // Removing the topic's own permission falls back to the default.
        u.set_perm(&AclResource::Topic("T".into()), None);
        assert!(!u.permits(&AclResource::Topic("T".into()), &[Action::Pub]));
        assert!(u.permits(&AclResource::Topic("T".into()), &[Action::Pub, Action::Sub]));
    }

    #[test]
    fn deny_refuses_and_an_admin_may_do_anything() {
        let mut u = AclUser::new("demo", "s", false);
        u.set_perm(&AclResource::AnyGroup, Some(Perm::PubSub));
        u.set_perm(&AclResource::Group("G".into()), Some(Perm::Deny));
        assert!(!u.permits(&AclResource::Group("G".into()), &[Action::Sub]));
        assert!(u.permits(&AclResource::Group("H".into()), &[Action::Sub]));
        let admin = AclUser::new("root", "s", true);
        assert!(admin.permits(&AclResource::Group("G".into()), &[Action::Sub]));
    }

    #[test]
    fn resources_read_as_rocketmq_writes_them() {
        assert_eq!(
            AclResource::parse("Topic:SecureTopic"),
            Some(AclResource::Topic("SecureTopic".into()))
        );
        assert_eq!(
            AclResource::parse("group:G"),
            Some(AclResource::Group("G".into()))
        );
        assert_eq!(AclResource::parse("Topic:*"), Some(AclResource::AnyTopic));
        assert_eq!(AclResource::parse("Group:*"), Some(AclResource::AnyGroup));
        assert_eq!(AclResource::parse("Cluster:x"), None);
        assert_eq!(AclResource::parse("Topic:"), None);
        assert_eq!(AclResource::parse("Topic"), None);
        for r in ["Topic:a", "Group:b", "Topic:*", "Group:*"] {
            assert_eq!(AclResource::parse(r).unwrap().name(), r);
        }
        assert!(Perm::of(true, true).allows(Action::Sub));
        assert_eq!(Perm::of(false, false), Perm::Deny);
    }
}
