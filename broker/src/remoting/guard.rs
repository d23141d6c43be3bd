//! Who may make a 4.x remoting request while authentication is on (`[auth]`):
//! its ACL signature ([`ledgermq_remoting::acl`]) names a user of this node's
//! copy of the group's users ([`crate::auth::AuthSettings::authenticate_remoting`]),
//! and the user must hold what the request needs, as the reference broker asks
//! it (Apache RocketMQ 5.3, `DefaultAuthorizationContextBuilder.build(ctx,
//! RemotingCommand)`):
//!
//! - SEND_MESSAGE (10, `topic`), SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (310,
//!   320, `b`): PUB on the topic; a send to `%RETRY%<group>` SUB on the group;
//! - END_TRANSACTION (37): PUB on its `topic` when it names one;
//! - PULL_MESSAGE (11): SUB on `consumerGroup` and on the topic (for
//!   `%RETRY%<g>`, SUB on group `g`: stricter than the reference, which checks
//!   nothing there); QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET (14, 15) the same;
//! - CONSUMER_SEND_MSG_BACK (36): SUB on `group`; GET_CONSUMER_LIST_BY_GROUP
//!   (38) and UNREGISTER_CLIENT (35, when it names one): SUB on `consumerGroup`;
//! - HEART_BEAT (34): SUB on each consumer group and each subscribed topic of
//!   its body (a retry topic as above); LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (41, 42): SUB on the body's group
//!   and each queue's topic;
//! - QUERY_MESSAGE (12): SUB on the topic; the queue offsets (29-32): PUB or SUB
//!   on the topic (the reference's GET); VIEW_MESSAGE_BY_ID (33): SUB on its
//!   `topic` when it names one.
//!
//! What a request points at is checked too once it is read (`Remoting::
//! authorize_resolved`): the stored message a VIEW_MESSAGE_BY_ID or a
//! CONSUMER_SEND_MSG_BACK names by offset needs SUB on its topic (the reference
//! checks neither, so any user could read any message by offset), and an
//! END_TRANSACTION without a topic PUB on its half message's topic. A refusal
//! answers NO_PERMISSION with the reason. A HEART_BEAT's producer groups need
//! nothing here, but the check-backs they bring are sent only to a producer
//! whose user may publish to the half's topic (`transactions::check`).
//! Decisions only, no I/O.

use ledgermq_remoting::codes::request;
use ledgermq_remoting::RemotingCommand;
use serde::Deserialize;

use crate::auth::{Need, Principal};
use crate::error::{refuse, BrokerError, ErrorKind};

const RETRY_PREFIX: &str = "%RETRY%";

fn field<'a>(req: &'a RemotingCommand, name: &str) -> &'a str {
    req.ext_fields.get(name).map_or("", String::as_str)
}

/// Receiving from `topic`: SUB on it, or for `%RETRY%<group>` SUB on that
/// group (stricter than the reference, which checks nothing for a retry
/// topic; the gRPC port has no such exemption either).
pub(crate) fn subscribe(topic: &str) -> Need {
    match topic.strip_prefix(RETRY_PREFIX) {
        Some(group) => Need::consume_as(group),
        None => Need::subscribe_topic(topic),
    }
}

/// A send to `topic`: PUB, or for a retry topic SUB on its group.
fn send_to(topic: &str) -> Need {
    match topic.strip_prefix(RETRY_PREFIX) {
        Some(group) => Need::consume_as(group),
        None => Need::publish(topic),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Heartbeat {
    #[serde(default)]
    consumer_data_set: Vec<Consumer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Consumer {
    #[serde(default)]
    group_name: String,
    #[serde(default)]
    subscription_data_set: Vec<Subscription>,
}

#[derive(Deserialize)]
struct Subscription {
    #[serde(default)]
    topic: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LockBody {
    #[serde(default)]
    consumer_group: String,
    #[serde(default)]
    mq_set: Vec<Queue>,
}

#[derive(Deserialize)]
struct Queue {
    #[serde(default)]
    topic: String,
}

/// What `req` needs (see the module doc). Error: UNAUTHORIZED when a body
/// the needs are read from is not JSON of its kind.
pub(crate) fn needs(req: &RemotingCommand) -> Result<Vec<Need>, BrokerError> {
    let unreadable = |what: &str, e: serde_json::Error| {
        refuse(
            ErrorKind::Unauthorized,
            format!("the {what} body cannot be read to check its permissions: {e}"),
        )
    };
    let group_and_topic =
        |group: &str, topic: &str| vec![Need::consume_as(group), subscribe(topic)];
    let needs = match req.code {
        request::SEND_MESSAGE => vec![send_to(field(req, "topic"))],
        request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => vec![send_to(field(req, "b"))],
        request::END_TRANSACTION => match field(req, "topic") {
            "" => vec![],
            t => vec![Need::publish(t)],
        },
        request::PULL_MESSAGE
        | request::QUERY_CONSUMER_OFFSET
        | request::UPDATE_CONSUMER_OFFSET => {
            group_and_topic(field(req, "consumerGroup"), field(req, "topic"))
        }
        request::CONSUMER_SEND_MSG_BACK => vec![Need::consume_as(field(req, "group"))],
        request::GET_CONSUMER_LIST_BY_GROUP => vec![Need::consume_as(field(req, "consumerGroup"))],
        request::UNREGISTER_CLIENT => match field(req, "consumerGroup") {
            "" => vec![],
            g => vec![Need::consume_as(g)],
        },
        request::HEART_BEAT => {
            let hb: Heartbeat =
                serde_json::from_slice(&req.body).map_err(|e| unreadable("heartbeat", e))?;
            hb.consumer_data_set
                .iter()
                .flat_map(|c| {
                    std::iter::once(Need::consume_as(&c.group_name))
                        .chain(c.subscription_data_set.iter().map(|s| subscribe(&s.topic)))
                })
                .collect()
        }
        request::LOCK_BATCH_MQ | request::UNLOCK_BATCH_MQ => {
            let body: LockBody =
                serde_json::from_slice(&req.body).map_err(|e| unreadable("lock", e))?;
            std::iter::once(Need::consume_as(&body.consumer_group))
                .chain(body.mq_set.iter().map(|q| subscribe(&q.topic)))
                .collect()
        }
        request::QUERY_MESSAGE => vec![subscribe(field(req, "topic"))],
        // A retry topic's offsets are its group's (a push consumer asks for
        // them when it rebalances).
        request::GET_MAX_OFFSET
        | request::GET_MIN_OFFSET
        | request::SEARCH_OFFSET_BY_TIMESTAMP
        | request::GET_EARLIEST_MSG_STORETIME => match field(req, "topic") {
            t if t.starts_with(RETRY_PREFIX) => vec![subscribe(t)],
            t => vec![Need::route(t)],
        },
        request::VIEW_MESSAGE_BY_ID => match field(req, "topic") {
            "" => vec![],
            t => vec![Need::subscribe_topic(t)],
        },
        // Not served (REQUEST_CODE_NOT_SUPPORTED): nothing to guard.
        _ => vec![],
    };
    Ok(needs)
}

/// Checks that `principal` may make `req`. Errors: UNAUTHORIZED (answered
/// NO_PERMISSION) naming what is missing.
pub(crate) fn authorize(principal: &Principal, req: &RemotingCommand) -> Result<(), BrokerError> {
    principal.authorize(&needs(req)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(code: i32, fields: &[(&str, &str)], body: &str) -> RemotingCommand {
        let mut r = RemotingCommand::request(code, fields.iter().copied());
        r.body = body.as_bytes().to_vec();
        r
    }

    #[test]
    fn sends_need_pub_and_a_send_back_into_retry_needs_the_group() {
        let plain = needs(&req(
            request::SEND_MESSAGE_V2,
            &[("a", "PG"), ("b", "T")],
            "",
        ))
        .unwrap();
        assert_eq!(plain, vec![Need::publish("T")]);
        let retry = needs(&req(request::SEND_MESSAGE, &[("topic", "%RETRY%G")], "")).unwrap();
        assert_eq!(retry, vec![Need::consume_as("G")]);
    }

    #[test]
    fn consumer_calls_need_sub_on_the_group_and_the_topic() {
        let pull = needs(&req(
            request::PULL_MESSAGE,
            &[("consumerGroup", "G"), ("topic", "T")],
            "",
        ))
        .unwrap();
        assert_eq!(
            pull,
            vec![Need::consume_as("G"), Need::subscribe_topic("T")]
        );
        let hb = r#"{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T"},{"topic":"%RETRY%H"}]}],"producerDataSet":[{"groupName":"P"}]}"#;
        assert_eq!(
            needs(&req(request::HEART_BEAT, &[], hb)).unwrap(),
            vec![
                Need::consume_as("G"),
                Need::subscribe_topic("T"),
                Need::consume_as("H")
            ]
        );
        // Another group's retry topic needs that group.
        assert_eq!(
            needs(&req(
                request::PULL_MESSAGE,
                &[("consumerGroup", "G"), ("topic", "%RETRY%H")],
                "",
            ))
            .unwrap(),
            vec![Need::consume_as("G"), Need::consume_as("H")]
        );
        let lock = r#"{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":0}]}"#;
        assert_eq!(
            needs(&req(request::LOCK_BATCH_MQ, &[], lock)).unwrap(),
            vec![Need::consume_as("G"), Need::subscribe_topic("T")]
        );
        assert!(needs(&req(request::HEART_BEAT, &[], "not json")).is_err());
        assert_eq!(
            needs(&req(request::GET_MAX_OFFSET, &[("topic", "%RETRY%G")], "")).unwrap(),
            vec![Need::consume_as("G")]
        );
        assert_eq!(
            needs(&req(request::GET_MAX_OFFSET, &[("topic", "T")], "")).unwrap(),
            vec![Need::route("T")]
        );
        assert_eq!(
            needs(&req(request::VIEW_MESSAGE_BY_ID, &[("offset", "1")], "")).unwrap(),
            Vec::<Need>::new()
        );
    }
}
