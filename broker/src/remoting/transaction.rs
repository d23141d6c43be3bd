//! Transactions over remoting: END_TRANSACTION (37, oneway from Java clients),
//! the end of a half message a 4.x transactional send stored, served by the
//! same core as the 5.x EndTransaction (on the ready leader, passed on to it
//! from a follower: `grpc::transaction::end_from_remoting`); and
//! CHECK_TRANSACTION_STATE (39), the check back the leader's check service
//! sends to a producer of the half's producer group (`PGROUP`) connected here
//! ([`check_command`]). Fields: `EndTransactionRequestHeader` and
//! `CheckTransactionStateRequestHeader` (`../shared/docs/rocketmq-remoting.md`
//! §1.3).

use std::net::SocketAddr;

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::half_index::HalfState;
use ledgermq_store::timer_index::PROPERTY_REAL_TOPIC;
use ledgermq_store::MessageRecord;

use super::fields::{opt, req_num, req_str};
use super::pull::wire_bytes;
use super::Remoting;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::pb;
use crate::transactions::parse_transaction_id;

/// How long an end waits for this node to apply the half it names.
const HALF_APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `MessageSysFlag` values of `commitOrRollback`.
const TRANSACTION_COMMIT: i32 = 8;
const TRANSACTION_ROLLBACK: i32 = 12;

/// The CHECK_TRANSACTION_STATE request showing `half` (its real topic and
/// queue restored: what the leader's check service shows 5.x producers) at
/// `half_queue_offset` and `physical_offset`, as transaction `transaction_id`
/// of message `message_id`; `store_host` is the address in its layout.
pub fn check_command(
    half: &MessageRecord,
    half_queue_offset: u64,
    physical_offset: u64,
    message_id: &str,
    transaction_id: &str,
    store_host: SocketAddr,
) -> RemotingCommand {
    let mut c = RemotingCommand::request(
        request::CHECK_TRANSACTION_STATE,
        [
            ("tranStateTableOffset", half_queue_offset.to_string()),
            ("commitLogOffset", physical_offset.to_string()),
            ("msgId", message_id.to_owned()),
            ("transactionId", transaction_id.to_owned()),
            (
                "offsetMsgId",
                ledgermq_remoting::message::offset_message_id(store_host, physical_offset),
            ),
        ],
    );
    c.body = wire_bytes(half, half_queue_offset, physical_offset, store_host);
    c
}

impl Remoting {
    /// The real topic of the half message transaction `transaction_id` names
    /// once this node has applied it (waiting up to [`HALF_APPLY_WAIT`]: an
    /// end may reach a follower before the half's entry does); `Ok(None)`
    /// when the half has ended already. Error: BAD_REQUEST (not a transaction
    /// id of this broker, or no half this node knows).
    pub(super) async fn half_topic(
        &self,
        transaction_id: &str,
    ) -> Result<Option<String>, BrokerError> {
        let unknown = || {
            refuse(
                ErrorKind::BadRequest,
                format!("no transaction {transaction_id} here and no topic named"),
            )
        };
        let offset = parse_transaction_id(transaction_id).ok_or_else(unknown)?;
        let store = self.broker.node.store();
        let deadline = tokio::time::Instant::now() + HALF_APPLY_WAIT;
        loop {
            match store.timers().halves().state(offset)? {
                Some(HalfState::Pending(h)) => {
                    let rec = store.read_half(&h)?;
                    return rec
                        .properties
                        .get(PROPERTY_REAL_TOPIC)
                        .cloned()
                        .map(Some)
                        .ok_or_else(unknown);
                }
                Some(HalfState::Ended(_)) => return Ok(None),
                None if tokio::time::Instant::now() >= deadline => return Err(unknown()),
                None => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }

    /// Answers END_TRANSACTION (usually oneway: then the answer is dropped).
    /// A state other than commit or rollback leaves the half pending (it is
    /// checked back later). Errors: BAD_REQUEST (a missing field, an unknown
    /// state, a half whose topic this node does not know), the end's.
    pub(super) async fn end_transaction(
        &self,
        req: &RemotingCommand,
        conn_peer: SocketAddr,
    ) -> Result<RemotingCommand, BrokerError> {
        let transaction_id = req_str(req, "transactionId", None)?;
        let message_id = req_str(req, "msgId", None)?;
        let state: i32 = req_num(req, "commitOrRollback", None)?;
        let from_check = matches!(opt(req, "fromTransactionCheck", None), Some("true" | "1"));
        let group = opt(req, "producerGroup", None).unwrap_or("");
        let resolution = match state {
            TRANSACTION_COMMIT => pb::TransactionResolution::Commit,
            TRANSACTION_ROLLBACK => pb::TransactionResolution::Rollback,
            _ => {
                tracing::info!(
                    transaction_id,
                    message_id,
                    group,
                    state,
                    from_check,
                    "transaction end without a state: left pending"
                );
                return Ok(RemotingCommand::response_to(req, response::SUCCESS, None));
            }
        };
        // 4.x clients name no topic: the half's own, where this node has it.
        let topic = match opt(req, "topic", None).filter(|t| !t.is_empty()) {
            Some(t) => t.to_owned(),
            None => match self.half_topic(transaction_id).await? {
                Some(t) => t,
                None => {
                    tracing::info!(
                        transaction_id,
                        message_id,
                        group,
                        state,
                        from_check,
                        "transaction end asked again: ended already"
                    );
                    return Ok(RemotingCommand::response_to(req, response::SUCCESS, None));
                }
            },
        };
        let end = pb::EndTransactionRequest {
            topic: Some(pb::Resource {
                resource_namespace: String::new(),
                name: topic,
            }),
            message_id: message_id.to_owned(),
            transaction_id: transaction_id.to_owned(),
            resolution: resolution as i32,
            source: if from_check {
                pb::TransactionSource::SourceServerCheck
            } else {
                pb::TransactionSource::SourceClient
            } as i32,
            trace_context: String::new(),
        };
        let client = format!("remoting:{group}@{conn_peer}");
        let status = crate::grpc::transaction::end_from_remoting(&self.broker, end, &client).await;
        if status.code == pb::Code::Ok as i32 {
            Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
        } else {
            tracing::info!(
                transaction_id,
                message_id,
                group,
                code = status.code,
                status.message,
                "transaction end refused"
            );
            Ok(RemotingCommand::response_to(
                req,
                response::SYSTEM_ERROR,
                Some(status.message),
            ))
        }
    }
}
