//! The RocketMQ 4.x remoting protocol on a broker node (`remoting_addr`), an
//! adapter over the same core as `grpc` (facts in
//! `../shared/docs/rocketmq-remoting.md`). Every node serves it: sends are
//! written through Raft from any node (a follower passes them on to the
//! leader) and answered SUCCESS only once committed; pulls read the node's own
//! applied ConsumeQueues (committed messages only), so any member answers
//! them; consumer offsets are replicated.
//!
//! - [`fields`]: reading a request's header fields.
//! - [`send`]: SEND_MESSAGE (10, long names), SEND_MESSAGE_V2 (310, short
//!   names), SEND_BATCH_MESSAGE (320); the 18 delay levels of the `DELAY`
//!   property and 5.x timer properties become timers.
//! - [`pull`]: PULL_MESSAGE (11) with long polling, and the offsets by queue
//!   (GET_MAX_OFFSET 30, GET_MIN_OFFSET 31, SEARCH_OFFSET_BY_TIMESTAMP 29,
//!   GET_EARLIEST_MSG_STORETIME 32).
//! - [`clients`]: HEART_BEAT (34), UNREGISTER_CLIENT (35), the consumer list
//!   (38) and NOTIFY_CONSUMER_IDS_CHANGED (40), the orderly consumers' queue
//!   locks (41, 42), consumer offsets (14, 15; pulls' piggybacked commits),
//!   committed through Raft every flush interval.
//!
//! - [`query`]: QUERY_MESSAGE (12) by key or message id, VIEW_MESSAGE_BY_ID
//!   (33) by the offset message id's offset.
//! - [`retry`]: CONSUMER_SEND_MSG_BACK (36) into `%RETRY%<group>` after a
//!   delay level, or `%DLQ%<group>`.
//!
//! - [`transaction`]: END_TRANSACTION (37) and the check back (39) to a
//!   producer of the half's group connected here.
//!
//! Anything else answers REQUEST_CODE_NOT_SUPPORTED. With authentication on
//! (`[auth]`), each request's 4.x ACL signature and permissions are checked
//! first ([`guard`]); a refusal answers NO_PERMISSION.

mod clients;
mod fields;
mod guard;
mod pull;
mod query;
mod retry;
mod send;
pub(crate) mod transaction;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::conn::{serve_connection, serve_stream, Conn};
use ledgermq_remoting::{RemotingCommand, DEFAULT_MAX_FRAME_BYTES};
use ledgermq_tls::Stream;
use tokio::task::JoinHandle;

use crate::auth::Principal;
use crate::broker::Broker;
use crate::error::{BrokerError, ErrorKind};
use clients::Clients;

/// How often consumer offsets taken over remoting are committed through Raft.
pub const OFFSET_FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// A node's remoting service state.
pub(crate) struct Remoting {
    broker: Arc<Broker>,
    /// The address this node is reached at (the store host of offset message
    /// ids and of messages in pull answers).
    advertised: SocketAddr,
    clients: Clients,
}

/// The running remoting listener; stopping it closes the listener (open
/// connections end with the process or the client).
pub struct RemotingServer {
    accept: JoinHandle<()>,
    flusher: JoinHandle<()>,
    state: Arc<Remoting>,
    /// The announced address (a port 0 replaced by the bound one).
    pub advertised: SocketAddr,
}

impl RemotingServer {
    /// Stops accepting and commits the offsets still pending once.
    pub async fn stop(self) {
        self.accept.abort();
        // An offset stays pending until it is applied, so a flush cut off
        // here loses none of them: the last one writes them.
        self.flusher.abort();
        let _ = self.flusher.await;
        self.state.flush_offsets().await;
    }
}

/// Binds `listen` and serves the remoting protocol for `broker`, advertising
/// `advertised` (a port 0 in it is replaced by the bound port). With the
/// broker's `[tls]` (`ServiceSettings::tls`) each connection starts with a
/// TLS handshake (the client's certificate is not asked for; requests are
/// signed), and with `remoting_tls_mode = "permissive"` a connection that
/// does not start one is served in plain text. Error: `Config` naming
/// `remoting_addr` when the address cannot be bound, `tls` when the TLS
/// material does not make a server configuration.
pub async fn serve(
    broker: Arc<Broker>,
    listen: SocketAddr,
    advertised: SocketAddr,
) -> Result<RemotingServer, BrokerError> {
    let listener =
        tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| BrokerError::Config {
                key: "remoting_addr",
                reason: format!("binding {listen}: {e}"),
            })?;
    let local_addr = listener.local_addr().map_err(|e| BrokerError::Config {
        key: "remoting_addr",
        reason: e.to_string(),
    })?;
    let mut advertised = advertised;
    if advertised.port() == 0 {
        advertised.set_port(local_addr.port());
    }
    let tls = match &broker.settings.tls {
        None => None,
        Some(m) => Some(m.acceptor(false).map_err(|e| BrokerError::Config {
            key: "tls",
            reason: e.to_string(),
        })?),
    };
    let plain_too = broker.settings.remoting_tls_mode.plain_too();
    if tls.is_some() {
        tracing::info!(
            %advertised,
            plain_too,
            "the remoting port serves TLS{}",
            if plain_too { " and plain text (remoting_tls_mode = permissive)" } else { " only" }
        );
    }
    broker.remoting_producers.set_store_host(advertised);
    let state = Arc::new(Remoting {
        clients: Clients::default(),
        broker,
        advertised,
    });
    let flusher = {
        let s = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(OFFSET_FLUSH_INTERVAL);
            loop {
                tick.tick().await;
                s.flush_offsets().await;
            }
        })
    };
    let kept = state.clone();
    let accept = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let s = state.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let stream = match &tls {
                    None => Stream::Plain(stream),
                    // A client speaks first: a TLS handshake, or (permissive)
                    // a frame's length.
                    Some(acceptor) => match ledgermq_tls::accept(
                        stream,
                        Some(acceptor),
                        plain_too,
                        ledgermq_tls::FIRST_BYTE_WAIT,
                    )
                    .await
                    {
                        Some((stream, _)) => stream,
                        None => return,
                    },
                };
                let on_close = {
                    let s = s.clone();
                    move |c: &Conn| {
                        s.clients.connection_closed(c.id);
                        s.broker.consumer_clients.connection_closed(c.id);
                        s.broker.remoting_producers.connection_closed(c.id);
                    }
                };
                let handle = move |req, conn| {
                    let s = s.clone();
                    async move { s.handle(req, conn).await }
                };
                let max = DEFAULT_MAX_FRAME_BYTES;
                match stream {
                    Stream::Plain(tcp) => {
                        serve_connection(tcp, max, handle, is_send, on_close).await
                    }
                    tls => serve_stream(tls, peer, max, handle, is_send, on_close).await,
                }
            });
        }
    });
    Ok(RemotingServer {
        accept,
        flusher,
        state: kept,
        advertised,
    })
}

/// Sends, which a connection takes in arrival order when they are oneway.
fn is_send(req: &RemotingCommand) -> bool {
    matches!(
        req.code,
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE
    )
}

/// The response code a core error answers with.
fn error_code(e: &BrokerError) -> i32 {
    match e.kind() {
        ErrorKind::TopicNotFound => response::TOPIC_NOT_EXIST,
        ErrorKind::Forbidden | ErrorKind::Unauthorized => response::NO_PERMISSION,
        ErrorKind::ConsumerGroupNotFound => response::SUBSCRIPTION_GROUP_NOT_EXIST,
        ErrorKind::TooManyRequests => response::SYSTEM_BUSY,
        ErrorKind::NoLeader | ErrorKind::OutcomeUnknown => response::SERVICE_NOT_AVAILABLE,
        ErrorKind::Internal => response::SYSTEM_ERROR,
        ErrorKind::Unsupported => response::REQUEST_CODE_NOT_SUPPORTED,
        _ => response::MESSAGE_ILLEGAL,
    }
}

/// An error answer to `req`.
pub(crate) fn error_answer(req: &RemotingCommand, e: &BrokerError) -> RemotingCommand {
    RemotingCommand::response_to(req, error_code(e), Some(e.to_string()))
}

impl Remoting {
    /// Who sent `req`, once it is checked that they may make it while
    /// authentication is on ([`guard`]); the refusal otherwise.
    async fn authorized(&self, req: &RemotingCommand) -> Result<Principal, BrokerError> {
        let principal = {
            let meta = self.broker.meta();
            self.broker
                .settings
                .auth
                .authenticate_remoting(&meta.acl_users, req)
        };
        let checked = match principal.and_then(|p| guard::authorize(&p, req).map(|()| p)) {
            Ok(p) => self.authorize_resolved(&p, req).await.map(|()| p),
            Err(e) => Err(e),
        };
        if let Err(e) = &checked {
            tracing::info!(code = req.code, error = %e, "a remoting request is refused");
        }
        checked
    }

    /// What `req` needs beyond its fields, once what it points at is read:
    /// SUB on the topic of the message a VIEW_MESSAGE_BY_ID or a
    /// CONSUMER_SEND_MSG_BACK names by offset (for a `%RETRY%` topic, its
    /// group), PUB on the topic of the half message an END_TRANSACTION without
    /// a topic ends. Fails closed: what cannot be read is refused with the
    /// error the handler would answer (a missing field is the handler's to
    /// name); a transaction ended already changes nothing and passes.
    async fn authorize_resolved(
        &self,
        p: &crate::auth::Principal,
        req: &RemotingCommand,
    ) -> Result<(), BrokerError> {
        match req.code {
            request::VIEW_MESSAGE_BY_ID | request::CONSUMER_SEND_MSG_BACK => {
                let Ok(offset) = fields::req_num::<u64>(req, "offset", None) else {
                    return Ok(());
                };
                let m = self.committed_message_at(offset)?;
                p.authorize(&[guard::subscribe(m.view().topic())])
            }
            request::END_TRANSACTION
                if fields::opt(req, "topic", None).is_none_or(str::is_empty) =>
            {
                let Ok(id) = fields::req_str(req, "transactionId", None) else {
                    return Ok(());
                };
                match self.half_topic(id).await? {
                    Some(topic) => p.authorize(&[crate::auth::Need::publish(&topic)]),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    async fn handle(
        self: Arc<Self>,
        mut req: RemotingCommand,
        conn: Conn,
    ) -> Option<RemotingCommand> {
        let started = std::time::Instant::now();
        let checked = if self.broker.settings.auth.enabled {
            self.authorized(&req).await
        } else {
            Ok(Principal::Anyone)
        };
        let answer = match checked {
            Err(refusal) => Err(refusal),
            Ok(principal) => match req.code {
                request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
                    let body = std::mem::take(&mut req.body);
                    self.send(&req, body, &conn).await
                }
                request::PULL_MESSAGE => self.pull(&req).await,
                request::GET_MAX_OFFSET
                | request::GET_MIN_OFFSET
                | request::SEARCH_OFFSET_BY_TIMESTAMP
                | request::GET_EARLIEST_MSG_STORETIME => self.queue_offsets(&req),
                request::HEART_BEAT => self.heartbeat(&req, &conn, &principal).await,
                request::UNREGISTER_CLIENT => self.unregister(&req, &conn),
                request::GET_CONSUMER_LIST_BY_GROUP => self.consumer_list(&req),
                request::QUERY_CONSUMER_OFFSET => self.query_offset(&req),
                request::UPDATE_CONSUMER_OFFSET => self.update_offset(&req),
                request::CONSUMER_SEND_MSG_BACK => self.send_back(&req).await,
                request::END_TRANSACTION => self.end_transaction(&req, conn.peer).await,
                request::QUERY_MESSAGE => self.query_message(&req),
                request::VIEW_MESSAGE_BY_ID => self.view_message(&req),
                request::LOCK_BATCH_MQ => self.lock(&req),
                request::UNLOCK_BATCH_MQ => self.unlock(&req),
                other => Ok(RemotingCommand::response_to(
                    &req,
                    response::REQUEST_CODE_NOT_SUPPORTED,
                    Some(format!("request code {other} not supported")),
                )),
            },
        };
        let answer = answer.unwrap_or_else(|e| error_answer(&req, &e));
        // A code this node does not serve is the client's to choose: one label.
        let code = if answer.code == response::REQUEST_CODE_NOT_SUPPORTED {
            "other".to_owned()
        } else {
            req.code.to_string()
        };
        self.broker.metrics.rpc(
            "remoting",
            &code,
            &answer.code.to_string(),
            started.elapsed(),
        );
        Some(answer)
    }
}
