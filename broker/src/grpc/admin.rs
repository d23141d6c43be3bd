//! The admin service (`proto/ledgermq/admin.proto`): topic and consumer group
//! changes from `mqadmin`, committed through Raft from any member, and the
//! replica-audit digests of this node's own log, queues and metadata
//! ([`crate::grpc::audit`]), consumer progress ([`crate::grpc::progress`]),
//! rewinding a consumer group ([`crate::grpc::reset`]) and messages by key
//! ([`crate::grpc::query`]), and transaction checks back passed on by the
//! leader ([`crate::grpc::transaction`]).

use std::sync::Arc;

use ledgermq_meta::{Command, GroupConfig, RetryPolicy, TopicConfig, TopicMessageType, TopicPerm};
use tonic::{Request, Response, Status};

use crate::admin_pb::broker_admin_server::BrokerAdmin;
use crate::admin_pb::{
    AddNodeRequest, AdminResponse, BrokerStatusRequest, CheckTransactionRequest,
    CheckTransactionResponse, ConsumerConnectionRequest, ConsumerConnectionResponse,
    ConsumerProgressRequest, ConsumerProgressResponse, DeleteGroupRequest, DeleteTopicRequest,
    GetBrokerConfigRequest, KeyValues, LogDigestRequest, LogDigestResponse, MembershipResponse,
    QueryMessageRequest, QueryMessageResponse, QueueDigestRequest, QueueDigestResponse,
    RaftStatusRequest, RaftStatusResponse, RemoveNodeRequest, ResetOffsetRequest,
    ResetOffsetResponse, TransferLeaderRequest, TransferLeaderResponse, UpdateGroupRequest,
    UpdateTopicRequest,
};
use crate::broker::Broker;
use crate::broker::MAX_QUEUES;
use crate::error::ErrorKind;
use crate::error::{refuse, BrokerError};
use crate::message::{check_group, check_topic};

/// The admin service handle.
#[derive(Clone)]
pub struct Admin(pub Arc<Broker>);

/// The topic config an UpdateTopic asks for; `current` is the topic's message type
/// now (None for a new topic), kept when the request names none. Errors:
/// ILLEGAL_TOPIC, BAD_REQUEST (queue count outside 1..=`max_queues`, permission
/// bits other than 2, 4, 6, a message type RocketMQ does not define, or `fifo`
/// with another message type).
pub fn topic_config(
    r: &UpdateTopicRequest,
    max_queues: u32,
    current: Option<TopicMessageType>,
) -> Result<TopicConfig, BrokerError> {
    check_topic(&r.name)?;
    let max_queues = max_queues.min(MAX_QUEUES);
    if r.queue_count == 0 || r.queue_count > max_queues {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!(
                "queue count {} is outside 1..={max_queues} (the broker's max_queues_per_topic)",
                r.queue_count
            ),
        ));
    }
    let perm = if r.perm == 0 {
        TopicPerm::default()
    } else {
        TopicPerm::operator_choice(r.perm).ok_or_else(|| {
            refuse(
                ErrorKind::BadRequest,
                "perm must be 2 (write), 4 (read) or 6 (both)",
            )
        })?
    };
    let message_type = if r.message_type.is_empty() {
        if r.fifo {
            TopicMessageType::Fifo
        } else {
            current.unwrap_or_default()
        }
    } else {
        let t = TopicMessageType::from_attribute_value(&r.message_type).ok_or_else(|| {
            refuse(
                ErrorKind::BadRequest,
                format!(
                    "message.type {:?} is not one of NORMAL, FIFO, DELAY, TRANSACTION, MIXED",
                    r.message_type
                ),
            )
        })?;
        if r.fifo && t != TopicMessageType::Fifo {
            return Err(refuse(
                ErrorKind::BadRequest,
                format!(
                    "a FIFO topic (fifo set) cannot have message.type={}",
                    t.attribute_value()
                ),
            ));
        }
        t
    };
    Ok(TopicConfig {
        name: r.name.clone(),
        queue_count: r.queue_count,
        perm,
        message_type,
    })
}

impl Admin {
    /// Commits `cmd` through Raft (from any member; the node waits for a leader).
    async fn commit(&self, cmd: Command) -> AdminResponse {
        AdminResponse {
            error: self
                .0
                .node
                .write_command(cmd)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl BrokerAdmin for Admin {
    async fn update_topic(
        &self,
        req: Request<UpdateTopicRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let max_queues = self.0.settings.max_queues_per_topic;
        // The type as this node applied it: an update racing another one on the
        // same topic may keep a type that one just replaced (admin changes are
        // the operator's to order).
        let current = self.0.topic(&req.get_ref().name).map(|t| t.message_type);
        Ok(Response::new(
            match topic_config(req.get_ref(), max_queues, current) {
                Ok(t) => self.commit(Command::UpdateTopic(t)).await,
                Err(e) => AdminResponse {
                    error: e.to_string(),
                    ..Default::default()
                },
            },
        ))
    }

    async fn update_group(
        &self,
        req: Request<UpdateGroupRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let r = req.into_inner();
        if let Err(e) = check_group(&r.name) {
            return Ok(Response::new(AdminResponse {
                error: e.to_string(),
                ..Default::default()
            }));
        }
        let group = GroupConfig {
            name: r.name,
            fifo: r.fifo,
            broadcast: r.broadcast,
            max_delivery_attempts: if r.max_delivery_attempts == 0 {
                16
            } else {
                r.max_delivery_attempts
            },
        };
        if r.retry_policy.is_empty() {
            return Ok(Response::new(
                self.commit(Command::UpdateGroup(group)).await,
            ));
        }
        let mut answer = match RetryPolicy::from_rocketmq_json(&r.retry_policy) {
            Ok(retry_policy) => {
                self.commit(Command::UpdateGroupWithRetryPolicy {
                    group,
                    retry_policy,
                })
                .await
            }
            Err(e) => AdminResponse {
                error: e.to_string(),
                ..Default::default()
            },
        };
        answer.retry_policy_set = answer.error.is_empty();
        Ok(Response::new(answer))
    }

    async fn log_digest(
        &self,
        req: Request<LogDigestRequest>,
    ) -> Result<Response<LogDigestResponse>, Status> {
        let broker = self.0.clone();
        // Reads many entries: off the runtime's threads.
        tokio::task::spawn_blocking(move || crate::grpc::audit::log_digest(&broker, req.get_ref()))
            .await
            .map(Response::new)
            .map_err(|e| Status::internal(format!("log digest task failed: {e}")))
    }

    async fn queue_digest(
        &self,
        req: Request<QueueDigestRequest>,
    ) -> Result<Response<QueueDigestResponse>, Status> {
        let broker = self.0.clone();
        // Reads up to a million records: off the runtime's threads.
        tokio::task::spawn_blocking(move || {
            crate::grpc::audit::queue_digest(broker.node.store(), broker.node.id(), req.get_ref())
        })
        .await
        .map(Response::new)
        .map_err(|e| Status::internal(format!("queue digest task failed: {e}")))
    }

    async fn reset_offset(
        &self,
        req: Request<ResetOffsetRequest>,
    ) -> Result<Response<ResetOffsetResponse>, Status> {
        let md = req.metadata().clone();
        Ok(Response::new(
            crate::grpc::reset::reset_offset(&self.0, &md, req.into_inner()).await,
        ))
    }

    async fn query_message(
        &self,
        req: Request<QueryMessageRequest>,
    ) -> Result<Response<QueryMessageResponse>, Status> {
        // Index and CommitLog reads: off the async workers.
        let node = self.0.node.clone();
        let r = req.into_inner();
        tokio::task::spawn_blocking(move || {
            crate::grpc::query::query_message(node.store(), node.id(), &r)
        })
        .await
        .map(Response::new)
        .map_err(|e| Status::internal(format!("the query task failed: {e}")))
    }

    async fn check_transaction(
        &self,
        req: Request<CheckTransactionRequest>,
    ) -> Result<Response<CheckTransactionResponse>, Status> {
        crate::grpc::transaction::check_here(&self.0, req.into_inner())
    }

    async fn raft_status(
        &self,
        _: Request<RaftStatusRequest>,
    ) -> Result<Response<RaftStatusResponse>, Status> {
        let node = &self.0.node;
        let metrics = node.raft().metrics().borrow().clone();
        Ok(Response::new(crate::grpc::raft_status::raft_status(
            node.id(),
            &metrics,
        )))
    }

    async fn add_node(
        &self,
        req: Request<AddNodeRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        Ok(Response::new(
            crate::grpc::membership::add_node(&self.0.node, req.into_inner()).await,
        ))
    }

    async fn remove_node(
        &self,
        req: Request<RemoveNodeRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        Ok(Response::new(
            crate::grpc::membership::remove_node(&self.0.node, req.into_inner()).await,
        ))
    }

    async fn delete_topic(
        &self,
        req: Request<DeleteTopicRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let name = req.into_inner().name;
        let refused = crate::grpc::ops::undeletable_topic(&name)
            .or_else(|| check_topic(&name).err().map(|e| e.to_string()));
        if let Some(error) = refused {
            return Ok(Response::new(AdminResponse {
                error,
                ..Default::default()
            }));
        }
        tracing::info!(topic = %name, "deleteTopic asked");
        Ok(Response::new(self.commit(Command::DeleteTopic(name)).await))
    }

    async fn delete_group(
        &self,
        req: Request<DeleteGroupRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let name = req.into_inner().name;
        if let Err(e) = check_group(&name) {
            return Ok(Response::new(AdminResponse {
                error: e.to_string(),
                ..Default::default()
            }));
        }
        tracing::info!(group = %name, "deleteSubGroup asked");
        let answer = self.commit(Command::DeleteGroup(name.clone())).await;
        if !answer.error.is_empty() {
            return Ok(Response::new(answer));
        }
        // Its retry and dead-letter topics go with it, as in RocketMQ. Each
        // delete is committed whether this node has the topic or not (it may
        // lag the leader; deleting what is not there changes nothing).
        for topic in [format!("%RETRY%{name}"), format!("%DLQ%{name}")] {
            let mut a = self.commit(Command::DeleteTopic(topic.clone())).await;
            if !a.error.is_empty() {
                a.error = format!(
                    "group {name} is deleted, its topic {topic} not ({}): run deleteSubGroup again",
                    a.error
                );
                return Ok(Response::new(a));
            }
        }
        Ok(Response::new(answer))
    }

    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        Ok(Response::new(
            crate::grpc::ops::transfer_leader(&self.0, req.into_inner()).await,
        ))
    }

    async fn broker_status(
        &self,
        _: Request<BrokerStatusRequest>,
    ) -> Result<Response<KeyValues>, Status> {
        let broker = self.0.clone();
        // Asks the file system for the disk's usage: off the async workers.
        tokio::task::spawn_blocking(move || crate::grpc::ops::broker_status(&broker))
            .await
            .map(Response::new)
            .map_err(|e| Status::internal(format!("the status task failed: {e}")))
    }

    async fn get_broker_config(
        &self,
        _: Request<GetBrokerConfigRequest>,
    ) -> Result<Response<KeyValues>, Status> {
        Ok(Response::new(crate::grpc::ops::broker_config(&self.0)))
    }

    async fn put_user(
        &self,
        req: Request<crate::admin_pb::PutUserRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        Ok(Response::new(
            crate::grpc::acl_admin::put_user(&self.0, req.get_ref()).await,
        ))
    }

    async fn delete_user(
        &self,
        req: Request<crate::admin_pb::DeleteUserRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        Ok(Response::new(
            crate::grpc::acl_admin::delete_user(&self.0, req.get_ref()).await,
        ))
    }

    async fn set_acl(
        &self,
        req: Request<crate::admin_pb::SetAclRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        Ok(Response::new(
            crate::grpc::acl_admin::set_acl(&self.0, req.get_ref()).await,
        ))
    }

    async fn list_users(
        &self,
        req: Request<crate::admin_pb::ListUsersRequest>,
    ) -> Result<Response<crate::admin_pb::ListUsersResponse>, Status> {
        Ok(Response::new(crate::grpc::acl_admin::list_users(
            &self.0,
            req.get_ref(),
        )))
    }

    async fn consumer_connection(
        &self,
        req: Request<ConsumerConnectionRequest>,
    ) -> Result<Response<ConsumerConnectionResponse>, Status> {
        Ok(Response::new(crate::grpc::ops::consumer_connection(
            &self.0,
            &req.get_ref().group,
        )))
    }

    async fn consumer_progress(
        &self,
        req: Request<ConsumerProgressRequest>,
    ) -> Result<Response<ConsumerProgressResponse>, Status> {
        let node = &self.0.node;
        let store = node.store();
        let meta = node.shared_meta().read().unwrap();
        Ok(Response::new(crate::grpc::progress::consumer_progress(
            &meta,
            node.id(),
            req.get_ref(),
            |t, q| store.queue_offsets(t, q),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::ServiceSettings;

    #[test]
    fn topic_requests_are_checked() {
        let ok = UpdateTopicRequest {
            name: "T".into(),
            queue_count: 4,
            perm: 0,
            fifo: true,
            message_type: String::new(),
        };
        let t = topic_config(&ok, MAX_QUEUES, None).unwrap();
        assert_eq!(
            (t.perm, t.message_type),
            (TopicPerm::READ_WRITE, TopicMessageType::Fifo)
        );
        for bad in [
            UpdateTopicRequest {
                queue_count: 0,
                ..ok.clone()
            },
            UpdateTopicRequest {
                queue_count: 5000,
                ..ok.clone()
            },
            UpdateTopicRequest {
                perm: 3,
                ..ok.clone()
            },
            UpdateTopicRequest {
                name: "a/b".into(),
                ..ok.clone()
            },
            UpdateTopicRequest {
                message_type: "SCHEDULED".into(),
                fifo: false,
                ..ok.clone()
            },
            UpdateTopicRequest {
                message_type: "DELAY".into(),
                ..ok.clone()
            },
        ] {
            let e = topic_config(&bad, MAX_QUEUES, None).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::BadRequest | ErrorKind::IllegalTopic),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn an_update_keeps_the_topics_message_type_unless_it_names_one() {
        use TopicMessageType::*;
        let req = |message_type: &str, fifo| UpdateTopicRequest {
            name: "T".into(),
            queue_count: 4,
            perm: 0,
            fifo,
            message_type: message_type.into(),
        };
        let t = |r: UpdateTopicRequest, current| {
            topic_config(&r, MAX_QUEUES, current).unwrap().message_type
        };
        assert_eq!(t(req("", false), None), Normal);
        assert_eq!(t(req("", false), Some(Delay)), Delay);
        assert_eq!(t(req("", true), Some(Delay)), Fifo);
        assert_eq!(t(req("mixed", false), Some(Fifo)), Mixed);
        assert_eq!(t(req("NORMAL", false), Some(Fifo)), Normal);
        assert_eq!(t(req("FIFO", true), None), Fifo);
        assert_eq!(t(req("TRANSACTION", false), None), Transaction);
    }

    #[test]
    fn topics_get_at_most_the_configured_queue_count() {
        let req = UpdateTopicRequest {
            name: "T".into(),
            queue_count: 1024,
            perm: 0,
            fifo: false,
            message_type: String::new(),
        };
        let max = ServiceSettings::default().max_queues_per_topic;
        assert!(topic_config(&req, max, None).is_err());
        let fits = UpdateTopicRequest {
            queue_count: max,
            ..req.clone()
        };
        assert_eq!(topic_config(&fits, max, None).unwrap().queue_count, max);
        assert!(topic_config(&req, MAX_QUEUES, None).is_ok());
    }
}
