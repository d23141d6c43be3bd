//! ReceiveMessage, AckMessage, ChangeInvisibleDuration and
//! ForwardMessageToDeadLetterQueue on the leader, in 5.x terms: each converts
//! the request to the broker's ([`crate::consume`]), calls it and converts the
//! result, failures as statuses. No rules of their own.

use std::time::Instant;

use ledgermq_store::store::now_ms;

use crate::broker::Broker;
use crate::consume::ReceiveRequest;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::filter::FilterExpr;
use crate::grpc::message::{delivered, duration_ms, timestamp};
use crate::grpc::ToStatus;
use crate::pb::{self, Code};

/// The name of an optional resource (empty when absent: the broker's name check
/// refuses it).
fn name(r: Option<&pb::Resource>) -> &str {
    r.map_or("", |r| r.name.as_str())
}

/// A 5.x filter expression in the broker's terms: SQL as SQL92, any other type
/// as a TAG expression.
pub fn filter_expr(e: &pb::FilterExpression) -> FilterExpr {
    if e.r#type == pb::FilterType::Sql as i32 {
        FilterExpr::Sql92(e.expression.clone())
    } else {
        FilterExpr::Tag(e.expression.clone())
    }
}

/// A ReceiveMessageRequest in the broker's terms.
pub fn receive_request(req: &pb::ReceiveMessageRequest) -> ReceiveRequest {
    ReceiveRequest {
        topic: name(req.message_queue.as_ref().and_then(|q| q.topic.as_ref())).to_owned(),
        group: name(req.group.as_ref()).to_owned(),
        filter: req.filter_expression.as_ref().map(filter_expr),
        invisible_ms: req.invisible_duration.as_ref().map(duration_ms),
        batch_size: req.batch_size,
        long_polling_ms: req.long_polling_timeout.as_ref().map(duration_ms),
    }
}

/// ReceiveMessage on the leader. Returns the stream's items: a status (OK, or
/// MESSAGE_NOT_FOUND when nothing came), the messages, then the delivery
/// timestamp.
pub async fn receive_local(
    b: &Broker,
    req: &pb::ReceiveMessageRequest,
    client_id: Option<&str>,
    started: Instant,
) -> Vec<pb::ReceiveMessageResponse> {
    let request = receive_request(req);
    match b.receive(&request, client_id, started).await {
        Ok(messages) if messages.is_empty() => vec![status_item(
            refuse(ErrorKind::MessageNotFound, "no new message").to_status(),
        )],
        Ok(messages) => {
            // One call per run of one topic (a receive names one topic).
            for run in messages.chunk_by(|a, b| a.record.topic == b.record.topic) {
                let bytes = run.iter().map(|d| d.record.body.len() as u64).sum();
                b.metrics.messages_out(
                    &run[0].record.topic,
                    &request.group,
                    run.len() as u64,
                    bytes,
                );
            }
            let mut out = Vec::with_capacity(messages.len() + 2);
            out.push(status_item(pb::Status::ok()));
            out.extend(messages.into_iter().map(|d| pb::ReceiveMessageResponse {
                content: Some(pb::receive_message_response::Content::Message(delivered(d))),
            }));
            out.push(pb::ReceiveMessageResponse {
                content: Some(pb::receive_message_response::Content::DeliveryTimestamp(
                    timestamp(now_ms()),
                )),
            });
            out
        }
        Err(e) => vec![status_item(e.to_status())],
    }
}

/// AckMessage on the leader: one result per entry.
pub async fn ack_local(
    b: &Broker,
    req: &pb::AckMessageRequest,
    client_id: Option<&str>,
) -> pb::AckMessageResponse {
    let handles: Vec<&str> = req
        .entries
        .iter()
        .map(|e| e.receipt_handle.as_str())
        .collect();
    let results = match b
        .ack(
            name(req.group.as_ref()),
            name(req.topic.as_ref()),
            &handles,
            client_id,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return ack_error(req, e),
    };
    let entries: Vec<_> = req
        .entries
        .iter()
        .zip(results)
        .map(|(entry, r)| pb::AckMessageResultEntry {
            message_id: entry.message_id.clone(),
            receipt_handle: entry.receipt_handle.clone(),
            status: Some(r.map_or_else(|e| e.to_status(), |_| pb::Status::ok())),
        })
        .collect();
    pb::AckMessageResponse {
        status: Some(overall(entries.iter().filter_map(|e| e.status.as_ref()))),
        entries,
    }
}

/// ChangeInvisibleDuration on the leader.
pub async fn change_invisible_local(
    b: &Broker,
    req: &pb::ChangeInvisibleDurationRequest,
    client_id: Option<&str>,
) -> pb::ChangeInvisibleDurationResponse {
    let ms = req
        .invisible_duration
        .as_ref()
        .map(duration_ms)
        .unwrap_or(0);
    match b
        .change_invisible(name(req.group.as_ref()), &req.receipt_handle, ms, client_id)
        .await
    {
        Ok(h) => pb::ChangeInvisibleDurationResponse {
            status: Some(pb::Status::ok()),
            receipt_handle: h.encode(),
        },
        Err(e) => pb::ChangeInvisibleDurationResponse {
            status: Some(e.to_status()),
            receipt_handle: String::new(),
        },
    }
}

/// ForwardMessageToDeadLetterQueue on the leader.
pub async fn forward_to_dlq_local(
    b: &Broker,
    req: &pb::ForwardMessageToDeadLetterQueueRequest,
    client_id: Option<&str>,
) -> pb::ForwardMessageToDeadLetterQueueResponse {
    let r = b
        .forward_to_dlq(name(req.group.as_ref()), &req.receipt_handle, client_id)
        .await;
    pb::ForwardMessageToDeadLetterQueueResponse {
        status: Some(r.map_or_else(|e| e.to_status(), |_| pb::Status::ok())),
    }
}

/// A receive stream item holding only status `s`.
pub(crate) fn status_item(s: pb::Status) -> pb::ReceiveMessageResponse {
    pb::ReceiveMessageResponse {
        content: Some(pb::receive_message_response::Content::Status(s)),
    }
}

fn ack_error(req: &pb::AckMessageRequest, e: BrokerError) -> pb::AckMessageResponse {
    ack_failed(&req.entries, e.to_status())
}

/// An AckMessage answer that fails the call and each of `entries` with status `s`.
pub(crate) fn ack_failed(entries: &[pb::AckMessageEntry], s: pb::Status) -> pb::AckMessageResponse {
    pb::AckMessageResponse {
        status: Some(s.clone()),
        entries: entries
            .iter()
            .map(|x| pb::AckMessageResultEntry {
                message_id: x.message_id.clone(),
                receipt_handle: x.receipt_handle.clone(),
                status: Some(s.clone()),
            })
            .collect(),
    }
}

/// One status for many results: theirs if they agree, MULTIPLE_RESULTS otherwise.
pub fn overall<'a>(mut statuses: impl Iterator<Item = &'a pb::Status>) -> pb::Status {
    let Some(first) = statuses.next() else {
        return refuse(ErrorKind::BadRequest, "no entries").to_status();
    };
    if statuses.all(|s| s.code == first.code) {
        first.clone()
    } else {
        pb::Status {
            code: Code::MultipleResults as i32,
            message: "entries have different results".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overall_status_agrees_or_says_multiple() {
        let ok = pb::Status::ok();
        let bad = refuse(ErrorKind::InvalidReceiptHandle, "x").to_status();
        assert_eq!(overall([&ok, &ok].into_iter()).code, Code::Ok as i32);
        assert_eq!(
            overall([&ok, &bad].into_iter()).code,
            Code::MultipleResults as i32
        );
        assert_eq!(overall([].into_iter()).code, Code::BadRequest as i32);
    }
}
