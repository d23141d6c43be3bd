//! SendMessage in 5.x terms: converts each message ([`incoming`]), sends them
//! through the broker ([`Broker::send`]) and answers one entry per message.

use crate::broker::Broker;
use crate::grpc::message::incoming;
use crate::grpc::ToStatus;
use crate::pb;
use crate::send::check_send_count;

/// SendMessage: one result entry per message, every entry with the send's
/// status (all are stored in one Raft entry, or none is).
pub async fn send(b: &Broker, req: pb::SendMessageRequest) -> pb::SendMessageResponse {
    let n = req.messages.len();
    let mut ids = Vec::with_capacity(n);
    // Broker::send checks the count too; checked here first only so that the
    // refusal can name every message's id without converting any.
    let result = match check_send_count(n, b.settings.max_messages_per_send) {
        Err(e) => {
            ids.extend(req.messages.iter().map(|m| {
                m.system_properties
                    .as_ref()
                    .map(|p| p.message_id.clone())
                    .unwrap_or_default()
            }));
            Err(e)
        }
        Ok(()) => {
            let max_body_bytes = b.settings.max_body_bytes;
            let messages = req
                .messages
                .into_iter()
                .map(|m| incoming(m, max_body_bytes));
            b.send(messages, &mut ids).await
        }
    };
    let entries = match &result {
        Ok(placed) => ids
            .iter()
            .zip(placed)
            .map(|(id, p)| pb::SendResultEntry {
                status: Some(pb::Status::ok()),
                message_id: id.clone(),
                transaction_id: p.transaction_id.clone().unwrap_or_default(),
                offset: p.queue_offset as i64,
            })
            .collect(),
        Err(e) => (0..n)
            .map(|i| pb::SendResultEntry {
                status: Some(e.to_status()),
                message_id: ids.get(i).cloned().unwrap_or_default(),
                transaction_id: String::new(),
                offset: 0,
            })
            .collect(),
    };
    if let Err(e) = &result {
        tracing::debug!(error = %e, "send refused");
    }
    pb::SendMessageResponse {
        status: Some(match &result {
            Ok(_) => pb::Status::ok(),
            Err(e) => e.to_status(),
        }),
        entries,
    }
}
