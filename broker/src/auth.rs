//! Client authentication and authorization (ACLs) on the client port, as the
//! RocketMQ 5.x proxy does them (`auth` module of Apache RocketMQ 5.3:
//! `DefaultAuthenticationContextBuilder`, `DefaultAuthenticationHandler`,
//! `DefaultAuthorizationContextBuilder`). Decisions only, no I/O: the gRPC
//! handlers ([`crate::grpc::guard`]) read the headers and the replicated users
//! ([`ledgermq_meta::GroupMeta::acl_users`]) and ask here.
//!
//! The signature itself (headers, HMAC, date) is [`ledgermq_proto::signature`].
//!
//! Refusals are [`ErrorKind::Unauthorized`] (`UNAUTHORIZED`, 40100: what the
//! reference proxy answers for a failed authentication and a missing
//! permission alike), each with a message saying which.

use std::collections::BTreeMap;

use ledgermq_meta::{AclResource, AclUser, Action};

use crate::error::{refuse, BrokerError, ErrorKind};

use ledgermq_proto::signature::{check_skew, verify, SignatureError};
pub use ledgermq_proto::signature::{
    date_time_now, parse_date_time, sign, signed_headers, Credentials, AUTHORIZATION_HEADER,
    DATE_TIME_HEADER, SCHEME,
};

/// How this node checks clients.
#[derive(Debug, Clone, Default)]
pub struct AuthSettings {
    /// Check every call (authentication and ACLs); off: everything is allowed,
    /// the headers unread (the quickstart's default).
    pub enabled: bool,
    /// The largest difference accepted between a request's `x-mq-date-time`
    /// and this node's clock, ms; 0 does not check it.
    pub max_clock_skew_ms: u64,
    /// The members' own credentials (RocketMQ's
    /// `innerClientAuthenticationCredentials`): the same on every member, from
    /// the configuration, never replicated; what a member signs the calls it
    /// passes on to the leader with, and an admin everywhere (so an operator
    /// can create the first users with it).
    pub inner: Option<Credentials>,
    /// Users the leader creates at the start of its term when the group has
    /// none of that name (`[[auth.users]]`, [`crate::acl_bootstrap`]).
    pub bootstrap_users: Vec<AclUser>,
}

/// Who made a request, once authenticated.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Anyone: authentication is off.
    Anyone,
    /// The members' own credentials ([`AuthSettings::inner`]).
    Inner,
    /// A user of the group.
    User(AclUser),
}

/// What a request needs: one of `actions` on `resource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The topic or consumer group.
    pub resource: AclResource,
    /// Any one of these suffices.
    pub actions: &'static [Action],
}

impl Need {
    /// Send to topic `t`.
    pub fn publish(t: &str) -> Need {
        Need {
            resource: AclResource::Topic(t.to_owned()),
            actions: &[Action::Pub],
        }
    }
    /// Receive from topic `t`.
    pub fn subscribe_topic(t: &str) -> Need {
        Need {
            resource: AclResource::Topic(t.to_owned()),
            actions: &[Action::Sub],
        }
    }
    /// Consume as consumer group `g`.
    pub fn consume_as(g: &str) -> Need {
        Need {
            resource: AclResource::Group(g.to_owned()),
            actions: &[Action::Sub],
        }
    }
    /// Send to or receive from topic `t` (QueryRoute).
    pub fn route(t: &str) -> Need {
        Need {
            resource: AclResource::Topic(t.to_owned()),
            actions: &[Action::Pub, Action::Sub],
        }
    }
}

/// The access key and the signature's bytes of an `authorization` header.
/// Errors: UNAUTHORIZED when the header is not the 5.x scheme's.
pub fn parse_authorization(header: &str) -> Result<(&str, Vec<u8>), BrokerError> {
    ledgermq_proto::signature::parse_authorization(header).map_err(refused)
}

/// A refused signature: UNAUTHORIZED, with its reason.
fn refused(e: SignatureError) -> BrokerError {
    refuse(ErrorKind::Unauthorized, e.to_string())
}

impl AuthSettings {
    /// Who sent a request with these header values at `now_ms` (this node's
    /// wall clock), checked against `users`. Errors: UNAUTHORIZED for a
    /// missing or malformed header, an unknown access key, a wrong signature,
    /// or a date further than [`AuthSettings::max_clock_skew_ms`] from now.
    pub fn authenticate(
        &self,
        users: &BTreeMap<String, AclUser>,
        authorization: Option<&str>,
        date_time: Option<&str>,
        now_ms: i64,
    ) -> Result<Principal, BrokerError> {
        if !self.enabled {
            return Ok(Principal::Anyone);
        }
        let denied = |why: String| refuse(ErrorKind::Unauthorized, why);
        let header = authorization
            .filter(|h| !h.is_empty())
            .ok_or_else(|| denied("authentication is required: no authorization header".into()))?;
        let date_time = date_time
            .filter(|d| !d.is_empty())
            .ok_or_else(|| denied(format!("no {DATE_TIME_HEADER} header")))?;
        let (access_key, signature) = parse_authorization(header)?;
        check_skew(date_time, now_ms, self.max_clock_skew_ms).map_err(refused)?;
        let (secret, principal) = self.lookup(users, access_key)?;
        // Constant-time comparison.
        verify(access_key, secret, date_time, &signature).map_err(refused)?;
        Ok(principal)
    }

    /// The secret key and principal of `access_key`: the members' own
    /// credentials, or a user of `users`. Error: UNAUTHORIZED for neither.
    fn lookup<'a>(
        &'a self,
        users: &'a BTreeMap<String, AclUser>,
        access_key: &str,
    ) -> Result<(&'a str, Principal), BrokerError> {
        match (&self.inner, users.get(access_key)) {
            (Some(inner), _) if inner.access_key == access_key => {
                Ok((inner.secret_key.as_str(), Principal::Inner))
            }
            (_, Some(u)) => Ok((u.secret_key.expose(), Principal::User(u.clone()))),
            _ => Err(refuse(
                ErrorKind::Unauthorized,
                format!("user {access_key} is not found"),
            )),
        }
    }

    /// Who sent the 4.x remoting request `cmd`, by its ACL signature
    /// (`AccessKey` and `Signature` ext fields, [`ledgermq_remoting::acl`]),
    /// checked against `users`. The 4.x signature carries no date, so there
    /// is no skew check. Errors: UNAUTHORIZED for no `AccessKey`, an unknown
    /// access key or a wrong or missing signature.
    pub fn authenticate_remoting(
        &self,
        users: &BTreeMap<String, AclUser>,
        cmd: &ledgermq_remoting::RemotingCommand,
    ) -> Result<Principal, BrokerError> {
        if !self.enabled {
            return Ok(Principal::Anyone);
        }
        let access_key = ledgermq_remoting::acl::access_key(cmd).ok_or_else(|| {
            refuse(
                ErrorKind::Unauthorized,
                "authentication is required: no AccessKey (the 4.x client's ACL hook, \
                 session credentials)",
            )
        })?;
        let (secret, principal) = self.lookup(users, access_key)?;
        if !ledgermq_remoting::acl::verify(cmd, secret) {
            return Err(refuse(
                ErrorKind::Unauthorized,
                format!("check signature failed for user {access_key}"),
            ));
        }
        Ok(principal)
    }
}

/// Checks an access key (a username, or the members' own key): 1 to 256
/// bytes of printable ASCII without a space, ',', '=' or '/', the characters
/// that delimit it in the `authorization` header. Error: why not.
pub fn check_access_key(what: &str, key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 256 {
        return Err(format!("{what} must be 1 to 256 bytes"));
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_graphic() && !",=/".contains(c))
    {
        return Err(format!(
            "{what} {key:?} must be printable ASCII without a space, ',', '=' or '/'"
        ));
    }
    Ok(())
}

/// Checks a secret key: 1 to 256 bytes. Error: why not.
pub fn check_secret_key(what: &str, key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 256 {
        return Err(format!("{what} must be 1 to 256 bytes"));
    }
    Ok(())
}

impl Principal {
    /// The principal as the group's users are now (`users`): a user deleted
    /// since, or whose secret key changed, is refused; one whose permissions
    /// changed gets the new ones. For a check made long after the
    /// authentication (each Settings command of an open Telemetry stream).
    /// Errors: UNAUTHORIZED.
    pub fn refreshed(&self, users: &BTreeMap<String, AclUser>) -> Result<Principal, BrokerError> {
        match self {
            Principal::Anyone | Principal::Inner => Ok(self.clone()),
            Principal::User(u) => match users.get(&u.username) {
                Some(now) if now.secret_key == u.secret_key => Ok(Principal::User(now.clone())),
                _ => Err(refuse(
                    ErrorKind::Unauthorized,
                    format!(
                        "user {} was deleted or given a new secret key since this stream opened",
                        u.username
                    ),
                )),
            },
        }
    }

    /// Checks that the principal may do every one of `needs`. Errors:
    /// UNAUTHORIZED naming the first permission missing.
    pub fn authorize(&self, needs: &[Need]) -> Result<(), BrokerError> {
        let user = match self {
            Principal::Anyone | Principal::Inner => return Ok(()),
            Principal::User(u) => u,
        };
        for n in needs {
            if !user.permits(&n.resource, n.actions) {
                let what: Vec<&str> = n
                    .actions
                    .iter()
                    .map(|a| match a {
                        Action::Pub => "Pub",
                        Action::Sub => "Sub",
                    })
                    .collect();
                return Err(refuse(
                    ErrorKind::Unauthorized,
                    format!(
                        "user {} has no permission to {} on {}",
                        user.username,
                        what.join(" or "),
                        n.resource.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that the principal may make admin calls (an admin user, or the
    /// members' own credentials). Errors: UNAUTHORIZED.
    pub fn authorize_admin(&self) -> Result<(), BrokerError> {
        match self {
            Principal::Anyone | Principal::Inner => Ok(()),
            Principal::User(u) if u.admin => Ok(()),
            Principal::User(u) => Err(refuse(
                ErrorKind::Unauthorized,
                format!("user {} is not an admin", u.username),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
