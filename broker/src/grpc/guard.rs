//! Authentication and ACL checks on the client port ([`crate::auth`] decides):
//! what each MessagingService call needs, as the reference proxy's
//! `DefaultAuthorizationContextBuilder` asks it, the check every handler makes
//! first, the admin service's interceptor, and the signature this node puts on
//! the calls it passes on to the leader.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::Status;

use crate::auth::{Need, Principal, AUTHORIZATION_HEADER, DATE_TIME_HEADER};
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::grpc::status::ToStatus;
use crate::pb;

/// What a request needs, as the reference proxy asks it.
pub(crate) trait Needs {
    /// The permissions the request needs (none: authentication alone).
    fn needs(&self) -> Vec<Need>;
}

fn name(r: &Option<pb::Resource>) -> &str {
    r.as_ref().map_or("", |r| r.name.as_str())
}

fn consume(group: &Option<pb::Resource>, topic: &Option<pb::Resource>) -> Vec<Need> {
    vec![
        Need::consume_as(name(group)),
        Need::subscribe_topic(name(topic)),
    ]
}

impl Needs for pb::QueryRouteRequest {
    fn needs(&self) -> Vec<Need> {
        vec![Need::route(name(&self.topic))]
    }
}

impl Needs for pb::HeartbeatRequest {
    fn needs(&self) -> Vec<Need> {
        let consumer = [
            pb::ClientType::PushConsumer,
            pb::ClientType::SimpleConsumer,
            pb::ClientType::PullConsumer,
        ]
        .iter()
        .any(|t| *t as i32 == self.client_type);
        if consumer {
            vec![Need::consume_as(name(&self.group))]
        } else {
            vec![]
        }
    }
}

impl Needs for pb::SendMessageRequest {
    fn needs(&self) -> Vec<Need> {
        // Every message's topic (the reference checks the first; a call may
        // carry several topics here).
        let mut topics: Vec<&str> = self.messages.iter().map(|m| name(&m.topic)).collect();
        topics.sort_unstable();
        topics.dedup();
        topics.into_iter().map(Need::publish).collect()
    }
}

impl Needs for pb::QueryAssignmentRequest {
    fn needs(&self) -> Vec<Need> {
        consume(&self.group, &self.topic)
    }
}

impl Needs for pb::ReceiveMessageRequest {
    fn needs(&self) -> Vec<Need> {
        let topic = self.message_queue.as_ref().and_then(|q| q.topic.clone());
        consume(&self.group, &topic)
    }
}

impl Needs for pb::AckMessageRequest {
    fn needs(&self) -> Vec<Need> {
        consume(&self.group, &self.topic)
    }
}

impl Needs for pb::ForwardMessageToDeadLetterQueueRequest {
    fn needs(&self) -> Vec<Need> {
        consume(&self.group, &self.topic)
    }
}

impl Needs for pb::EndTransactionRequest {
    fn needs(&self) -> Vec<Need> {
        vec![Need::publish(name(&self.topic))]
    }
}

impl Needs for pb::NotifyClientTerminationRequest {
    fn needs(&self) -> Vec<Need> {
        match name(&self.group) {
            "" => vec![],
            g => vec![Need::consume_as(g)],
        }
    }
}

impl Needs for pb::ChangeInvisibleDurationRequest {
    fn needs(&self) -> Vec<Need> {
        vec![Need::consume_as(name(&self.group))]
    }
}

impl Needs for pb::Settings {
    fn needs(&self) -> Vec<Need> {
        match &self.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                p.topics.iter().map(|t| Need::publish(&t.name)).collect()
            }
            Some(pb::settings::PubSub::Subscription(s)) => {
                let mut n = vec![Need::consume_as(name(&s.group))];
                n.extend(
                    s.subscriptions
                        .iter()
                        .map(|e| Need::subscribe_topic(name(&e.topic))),
                );
                n
            }
            None => vec![],
        }
    }
}

fn header<'a>(md: &'a MetadataMap, key: &str) -> Option<&'a str> {
    md.get(key).and_then(|v| v.to_str().ok())
}

/// Who sent a call with headers `md` (`Principal::Anyone` while
/// authentication is off). Errors: UNAUTHORIZED ([`crate::auth`]).
pub(crate) fn principal(b: &Broker, md: &MetadataMap) -> Result<Principal, BrokerError> {
    let auth = &b.settings.auth;
    if !auth.enabled {
        return Ok(Principal::Anyone);
    }
    let now_ms = chrono::Utc::now().timestamp_millis();
    let meta = b.meta();
    auth.authenticate(
        &meta.acl_users,
        header(md, AUTHORIZATION_HEADER),
        header(md, DATE_TIME_HEADER),
        now_ms,
    )
}

/// `p` as this node's copy of the users has it now ([`Principal::refreshed`]).
pub(crate) fn refreshed(b: &Broker, p: &Principal) -> Result<Principal, BrokerError> {
    let meta = b.meta();
    p.refreshed(&meta.acl_users)
}

/// Checks that the sender of a call with headers `md` may make `req`.
/// Errors: the UNAUTHORIZED status to answer with.
pub(crate) fn admit<R: Needs>(b: &Broker, md: &MetadataMap, req: &R) -> Result<(), pb::Status> {
    if !b.settings.auth.enabled {
        return Ok(());
    }
    let refused = |e: BrokerError| {
        tracing::info!(error = %e, "a call is refused");
        e.to_status()
    };
    principal(b, md)
        .and_then(|p| p.authorize(&req.needs()))
        .map_err(refused)
}

/// The admin service's check: every admin call needs an admin user or the
/// members' own credentials while authentication is on. Errors: gRPC
/// `UNAUTHENTICATED` with the reason.
pub(crate) fn admit_admin(b: &Broker, md: &MetadataMap) -> Result<(), Status> {
    principal(b, md)
        .and_then(|p| p.authorize_admin())
        .map_err(|e| {
            tracing::info!(error = %e, "an admin call is refused");
            Status::unauthenticated(e.to_string())
        })
}

/// Signs a call this node passes on to another member with the members' own
/// credentials ([`crate::auth::AuthSettings::inner`]), when it has them.
pub(crate) fn sign_onward(b: &Broker, md: &mut MetadataMap) {
    let Some(creds) = &b.settings.auth.inner else {
        return;
    };
    let (authorization, date_time) = crate::auth::signed_headers(creds);
    if let (Ok(a), Ok(d)) = (
        MetadataValue::try_from(authorization),
        MetadataValue::try_from(date_time),
    ) {
        md.insert(AUTHORIZATION_HEADER, a);
        md.insert(DATE_TIME_HEADER, d);
    }
}
