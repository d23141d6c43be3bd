//! Transactions over the 5.x protocol: EndTransaction on the leader, producers'
//! Telemetry streams recorded for checks back, and a check passed from the
//! leader to the member a producer is connected to (the admin service's
//! CheckTransaction).

use prost::Message as _;
use tonic::{Response, Status};

use crate::admin_pb::broker_admin_client::BrokerAdminClient;
use crate::admin_pb::{CheckTransactionRequest, CheckTransactionResponse};
use crate::broker::Broker;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::grpc::ToStatus;
use crate::pb;
use crate::transactions::end::EndSource;
use ledgermq_store::half_index::HalfEnd;

/// EndTransaction on this node (the ready leader): a commit or a rollback of the
/// half the transaction id names. Errors as [`Broker::end_transaction`];
/// BAD_REQUEST for a resolution other than COMMIT or ROLLBACK, or no topic.
pub async fn end_local(
    b: &Broker,
    req: &pb::EndTransactionRequest,
    client: Option<&str>,
) -> pb::EndTransactionResponse {
    let status = match end(b, req, client).await {
        Ok(()) => pb::Status::ok(),
        Err(e) => e.to_status(),
    };
    pb::EndTransactionResponse {
        status: Some(status),
    }
}

async fn end(
    b: &Broker,
    req: &pb::EndTransactionRequest,
    client: Option<&str>,
) -> Result<(), BrokerError> {
    let topic = req
        .topic
        .as_ref()
        .map(|t| t.name.as_str())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| refuse(ErrorKind::BadRequest, "EndTransaction without a topic"))?;
    let source = if req.source == pb::TransactionSource::SourceServerCheck as i32 {
        EndSource::ServerCheck
    } else {
        EndSource::Client
    };
    let asked = match pb::TransactionResolution::try_from(req.resolution) {
        Ok(pb::TransactionResolution::Commit) => HalfEnd::Committed,
        Ok(pb::TransactionResolution::Rollback) => HalfEnd::RolledBack,
        _ => {
            tracing::info!(
                topic,
                message_id = req.message_id,
                transaction_id = req.transaction_id,
                ?source,
                client,
                resolution = req.resolution,
                "transaction end without a resolution: left pending"
            );
            return Err(refuse(
                ErrorKind::BadRequest,
                "the resolution must be COMMIT or ROLLBACK",
            ));
        }
    };
    b.end_transaction(topic, &req.message_id, &req.transaction_id, asked, source)
        .await
}

/// EndTransaction on behalf of a 4.x producer (`remoting`'s END_TRANSACTION):
/// served here when this node is the ready leader, else passed on to it, as a
/// 5.x EndTransaction is, with `client_id` as the caller. The status it ended
/// with.
pub(crate) async fn end_from_remoting(
    b: &Broker,
    req: pb::EndTransactionRequest,
    client_id: &str,
) -> pb::Status {
    let mut r = tonic::Request::new(req);
    if let Ok(v) = client_id.parse() {
        r.metadata_mut().insert(crate::broker::CLIENT_ID_HEADER, v);
    }
    let answer = crate::grpc::service::on_leader(
        b,
        r,
        end_local,
        async |mut c, r| c.end_transaction(r).await,
        |s| pb::EndTransactionResponse { status: Some(s) },
    )
    .await;
    match answer {
        Ok(r) => r.into_inner().status.unwrap_or_else(pb::Status::ok),
        Err(s) => pb::Status {
            code: pb::Code::InternalError as i32,
            message: s.message().to_owned(),
        },
    }
}

/// Passes the check back `command` (a RecoverOrphanedTransactionCommand) to
/// member `node`, which hands it to one of its producers of `topic`: the client
/// id of the producer that took it, None if it has none. Errors: the member
/// cannot be reached or refused it.
pub async fn relay_check(
    b: &Broker,
    node: u64,
    topic: &str,
    command: &pb::TelemetryCommand,
) -> Result<Option<String>, BrokerError> {
    let channel = b.node_channel(node).await?;
    let mut c = BrokerAdminClient::new(channel).max_decoding_message_size(64 << 20);
    let mut req = tonic::Request::new(CheckTransactionRequest {
        topic: topic.to_owned(),
        command: command.encode_to_vec(),
    });
    req.set_timeout(std::time::Duration::from_secs(2));
    crate::grpc::guard::sign_onward(b, req.metadata_mut());
    let r = c
        .check_transaction(req)
        .await
        .map_err(|s| BrokerError::Transport(format!("node {node}: {}", s.message())))?
        .into_inner();
    if !r.error.is_empty() {
        return Err(BrokerError::Transport(format!("node {node}: {}", r.error)));
    }
    Ok(Some(r.client_id).filter(|c| !c.is_empty()))
}

/// The admin service's CheckTransaction: hands a check back passed on by the
/// leader to one producer of its topic connected to this node.
pub fn check_here(
    b: &Broker,
    req: CheckTransactionRequest,
) -> Result<Response<CheckTransactionResponse>, Status> {
    let answer = |client_id: String, error: String| {
        Ok(Response::new(CheckTransactionResponse { client_id, error }))
    };
    let command = match pb::TelemetryCommand::decode(req.command.as_slice()) {
        Ok(c) => c,
        Err(e) => return answer(String::new(), format!("the command does not decode: {e}")),
    };
    if !matches!(
        command.command,
        Some(pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(_))
    ) {
        return answer(
            String::new(),
            "only RecoverOrphanedTransactionCommand is passed on".into(),
        );
    }
    answer(
        b.producers.offer(&req.topic, &command).unwrap_or_default(),
        String::new(),
    )
}
