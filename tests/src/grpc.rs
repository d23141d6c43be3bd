//! A minimal 5.x gRPC producer for harnesses that check what a node answers
//! (not how a client behaves): one SendMessage per call, no retry.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How a harness reaches a node that serves TLS and checks signatures.
#[derive(Clone)]
pub struct Secure {
    /// The CA certificates (PEM) the node's certificate chains to.
    pub ca_pem: Vec<u8>,
    /// The credentials calls are signed with.
    pub creds: ledgermq_proto::signature::Credentials,
}

/// A channel to client port `addr` (`host:port`; over TLS checked against
/// `ca_pem` if given), connected within 2 s, whose calls give up after
/// `call_timeout`.
pub async fn channel_to(
    addr: &str,
    call_timeout: Duration,
    ca_pem: Option<&[u8]>,
) -> Result<tonic::transport::Channel> {
    let endpoint = match ca_pem {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?,
        Some(ca) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )?,
    };
    Ok(endpoint
        .connect_timeout(Duration::from_secs(2))
        .timeout(call_timeout)
        .connect()
        .await?)
}

async fn channel(addr: &str, call_timeout: Duration) -> Result<tonic::transport::Channel> {
    channel_to(addr, call_timeout, None).await
}

/// Sends one normal message of `topic` (body `body`, also its message id) to
/// the client port `addr` (`host:port`); an error unless it is answered OK
/// within 5 s.
pub async fn send_one(addr: &str, topic: &str, body: &str) -> Result<()> {
    send_one_as(addr, topic, body, None).await
}

/// [`send_one`] over TLS and signed, as `secure` says.
pub async fn send_one_as(
    addr: &str,
    topic: &str,
    body: &str,
    secure: Option<&Secure>,
) -> Result<()> {
    use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
    use ledgermq_broker::pb::{Code, Message, Resource, SendMessageRequest, SystemProperties};
    let ca = secure.map(|s| s.ca_pem.as_slice());
    let channel = channel_to(addr, Duration::from_secs(5), ca).await?;
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
    if let Some(s) = secure {
        ledgermq_proto::signature::sign_request(&mut req, &s.creds);
    }
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

/// Sends a 5.x HeartbeatRequest of a simple consumer of `group`, as client
/// `client_id` (language PYTHON, version 5.0.0), to `addr`; an error unless
/// answered OK.
pub async fn heartbeat_consumer(addr: &str, group: &str, client_id: &str) -> Result<()> {
    use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
    use ledgermq_broker::pb::{ClientType, Code, HeartbeatRequest, Resource};
    let channel = channel(addr, Duration::from_secs(5)).await?;
    let mut req = tonic::Request::new(HeartbeatRequest {
        group: Some(Resource {
            resource_namespace: String::new(),
            name: group.to_owned(),
        }),
        client_type: ClientType::SimpleConsumer as i32,
    });
    req.metadata_mut()
        .insert("x-mq-client-id", client_id.parse()?);
    req.metadata_mut()
        .insert("x-mq-language", "PYTHON".parse()?);
    req.metadata_mut()
        .insert("x-mq-client-version", "5.0.0".parse()?);
    let status = MessagingServiceClient::new(channel)
        .heartbeat(req)
        .await?
        .into_inner()
        .status
        .context("a status")?;
    if status.code != Code::Ok as i32 {
        bail!("{addr}: {} {}", status.code, status.message);
    }
    Ok(())
}

/// One ReceiveMessage of up to 32 messages of `topic` for consumer group
/// `group` on `addr` (long-polling 2 s, invisible 30 s) as client
/// `client_id`, then one AckMessage of what came; returns the bodies
/// delivered, whatever the ack's outcome (an ack that fails, or whose answer
/// is lost, may still have taken effect: the messages were received either
/// way, and those not acked come again later). Error: the receive failed
/// before any message came.
pub async fn receive_and_ack(
    addr: &str,
    group: &str,
    topic: &str,
    client_id: &str,
) -> Result<Vec<String>> {
    use ledgermq_broker::pb::messaging_service_client::MessagingServiceClient;
    use ledgermq_broker::pb::receive_message_response::Content;
    use ledgermq_broker::pb::{AckMessageEntry, AckMessageRequest, Code, Resource};
    let channel = channel(addr, Duration::from_secs(10)).await?;
    let mut c = MessagingServiceClient::new(channel);
    let mut req = tonic::Request::new(ledgermq_jepsen::workload::receive_request(
        group, topic, 30, 2,
    ));
    req.metadata_mut()
        .insert("x-mq-client-id", client_id.parse()?);
    let mut stream = c.receive_message(req).await?.into_inner();
    let (mut bodies, mut entries) = (Vec::new(), Vec::new());
    loop {
        let item = match stream.message().await {
            Ok(Some(item)) => item,
            Ok(None) => break,
            // Cut off part way: what came was delivered.
            Err(e) if !bodies.is_empty() => {
                eprintln!(
                    "{addr}: the receive stream broke after {} message(s): {e}",
                    bodies.len()
                );
                break;
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(Content::Message(m)) = item.content {
            let handle = m
                .system_properties
                .and_then(|p| p.receipt_handle)
                .context("a receipt handle")?;
            bodies.push(String::from_utf8_lossy(&m.body).into_owned());
            entries.push(AckMessageEntry {
                message_id: String::new(),
                receipt_handle: handle,
            });
        }
    }
    if entries.is_empty() {
        return Ok(bodies);
    }
    let res = |name: &str| {
        Some(Resource {
            resource_namespace: String::new(),
            name: name.to_owned(),
        })
    };
    let mut ack = tonic::Request::new(AckMessageRequest {
        group: res(group),
        topic: res(topic),
        entries,
    });
    ack.metadata_mut()
        .insert("x-mq-client-id", client_id.parse()?);
    match c.ack_message(ack).await {
        Ok(r) => {
            let code = r.into_inner().status.map_or(-1, |s| s.code);
            if code != Code::Ok as i32 {
                eprintln!("{addr}: ack answered {code}");
            }
        }
        Err(e) => eprintln!("{addr}: ack failed: {e}"),
    }
    Ok(bodies)
}
