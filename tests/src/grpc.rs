//! A minimal 5.x gRPC producer for harnesses that check what a node answers
//! (not how a client behaves): one SendMessage per call, no retry.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Sends one normal message of `topic` (body `body`, also its message id) to
/// the client port `addr` (`host:port`); an error unless it is answered OK
/// within 5 s.
pub async fn send_one(addr: &str, topic: &str, body: &str) -> Result<()> {
    use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
    use ledgermq_broker::pb::{Code, Message, Resource, SendMessageRequest, SystemProperties};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let m = Message {
        topic: Some(Resource {
            resource_namespace: String::new(),
            name: topic.to_owned(),
        }),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            message_id: body.to_owned(),
            message_type: ledgermq_broker::pb::MessageType::Normal as i32,
            ..Default::default()
        }),
        body: body.as_bytes().to_vec(),
    };
    let mut req = tonic::Request::new(SendMessageRequest { messages: vec![m] });
    req.metadata_mut()
        .insert("x-mq-client-id", "ledgermq-probe@1".parse()?);
    let status = MessagingServiceClient::new(channel)
        .send_message(req)
        .await?
        .into_inner()
        .status
        .context("a status")?;
    if status.code != Code::Ok as i32 {
        bail!("{addr}: {} {}", status.code, status.message);
    }
    Ok(())
}
