//! `mqadmin`: administration commands, RocketMQ style.
//!
//! - `clusterList -n NAMESRV`: one line per node: client address, role, term, commit
//!   (applied) index, seconds since its last heartbeat.
//! - `topicRoute -n NAMESRV -t TOPIC`: the topic's broker groups, queues and leaders.
//! - `raftStatus -n NAMESRV [-c CLUSTER] [-b GROUP]`: each member's own view of
//!   its Raft group (role, term, leader, last log and applied index), and each
//!   leader's of its followers (match index, lag in entries).
//! - `topicStatus -n NAMESRV -t TOPIC`: each queue's min and max offsets in every
//!   broker group serving the topic, and the messages held in all.
//! - `topicList -n NAMESRV [-c CLUSTER]`: every topic a node serves, one per
//!   line; with `-c`, that cluster's, each with its cluster and broker groups.
//!
//! - `updateTopic -n NAMESRV -t TOPIC [-q QUEUES] [-p PERM] [--fifo]
//!   [-a +message.type=TYPE] [-c CLUSTER] [-b GROUP]`: creates or updates the topic
//!   on every broker group (of the cluster, or the one group given). `-a` takes
//!   RocketMQ's attribute changes, comma-separated: `+message.type=NORMAL|FIFO|
//!   DELAY|TRANSACTION|MIXED` sets the type, `-message.type` puts back NORMAL; an
//!   update naming no type keeps the topic's (`--fifo` is `+message.type=FIFO`).
//! - `updateSubGroup -n NAMESRV -g GROUP [--fifo] [--broadcast] [-r MAX_ATTEMPTS]
//!   [-p RETRY_POLICY_JSON] [-c CLUSTER] [-b GROUP]`: the same for a consumer
//!   group; `-p` takes RocketMQ 5's groupRetryPolicy JSON (its consumers'
//!   backoff), and an update without it gives the group the broker's default.
//! - `consumerProgress -n NAMESRV -g GROUP [-t TOPIC]`: each queue's end, the
//!   group's offset and the difference.
//! - `resetOffsetByTime -n NAMESRV -g GROUP -t TOPIC -s TIME [-c CLUSTER]
//!   [-b GROUP]`: rewinds (or moves forward) the group on every queue of the
//!   topic to its first message stored at or after TIME: `now`, ms since the
//!   Unix epoch, or local time as `yyyy-MM-dd#HH:mm:ss:SSS` (RocketMQ's forms).
//! - `queryMsgByKey -n NAMESRV -t TOPIC -k KEY [--beginTimestamp MS] [-e MS]
//!   [--maxNum N]`: one line per message whose message id or one of whose keys is
//!   KEY (message id, queue id, queue offset); `queryMsgByUniqueKey -n NAMESRV -t
//!   TOPIC -i ID`: the message with that message id in full (properties, times,
//!   hosts, the body's first 4 KiB). Each broker group's leader answers (another
//!   member if it does not).
//!
//! - `addNode -n NAMESRV -b GROUP -i ID -p PEER_ADDR [--timeoutSeconds S]`: adds
//!   node ID (started with `mqbroker --join`, its Raft peer server at PEER_ADDR)
//!   to the group: a learner until it holds the leader's log, then a voter.
//!   `removeNode -n NAMESRV -b GROUP -i ID`: removes node ID (a voter is made a
//!   learner first). Replacing a node whose disk died is both, with a new id.
//!
//! - `deleteTopic -n NAMESRV -t TOPIC (-c CLUSTER | -b GROUP)`,
//!   `deleteSubGroup -n NAMESRV -g GROUP -r true (-c CLUSTER | -b GROUP)`:
//!   delete a topic's configuration (its messages age out by retention; the
//!   broker's own topics and a group's retry and DLQ topics are refused), or a
//!   consumer group with its offsets, retry and DLQ topics (`-r true` says the
//!   offsets may go), on every selected broker group.
//! - `transferLeader -n NAMESRV -b GROUP [-i NODE]`: hands the group's
//!   leadership to node NODE (or the most caught-up follower).
//! - `brokerStatus -n NAMESRV [-c CLUSTER] [-b GROUP | -b HOST:PORT]`,
//!   `getBrokerConfig` (same flags): each node's (or the one node's) status
//!   (role, term, log, store, traffic since start) or effective configuration,
//!   `key : value` per line.
//! - `consumerConnection -n NAMESRV -g GROUP [-c CLUSTER] [-b GROUP]`: the
//!   consumers of consumer group GROUP connected to any node (client id,
//!   protocol, language, version, address, the nodes it is connected to).
//! - `verifyReplicas -n NAMESRV [-c CLUSTER] [-b GROUP]`: whether every member
//!   of each group holds the same committed log entries (over the indexes all
//!   hold and applied) and ConsumeQueue entries; exits non-zero if not.
//! - `createUser`, `updateUser`, `deleteUser`, `listUser` (`listAcl`),
//!   `createAcl` (`updateAcl`), `deleteAcl`: users and their permissions
//!   (`acl.rs`).
//!
//! Where the brokers check credentials (`[auth]`), every command signs its
//! calls with `--accessKey`/`--secretKey` (or `LEDGERMQ_ACCESS_KEY` /
//! `LEDGERMQ_SECRET_KEY`): an admin user's, or the members' own. Where they
//! serve TLS (`[tls]`), `--tlsCa FILE` (or `LEDGERMQ_TLS_CA`) names the CA
//! certificates to check them against; where the name servers do,
//! `--namesrvCa FILE` (or `LEDGERMQ_NAMESRV_TLS_CA`).
//!
//! `-n` takes one name server (`host:port`) or several separated by `;`. Changes go
//! to any live member of each group (the admin service on its client port), which
//! commits them through Raft.

use std::collections::BTreeMap;
use std::time::Duration;

mod acl;
mod changes;
mod cluster;
mod membership;
mod messages;
mod ops;
mod progress;
mod select;
mod verify;

use changes::{apply, topic_message_type, AdminReq};
use cluster::{client, role_name};
use select::{group_members, group_nodes, groups, topic_groups, Scope};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use ledgermq_broker::admin_pb::{
    DeleteGroupRequest, DeleteTopicRequest, UpdateGroupRequest, UpdateTopicRequest,
};
use ledgermq_meta::RetryPolicy;
use ledgermq_namesrv::pb::QueryRouteRequest;

#[derive(Parser)]
#[command(
    name = "mqadmin",
    about = "LedgerMQ administration (RocketMQ mqadmin subset)"
)]
struct Args {
    /// Access key admin calls are signed with (needed when the brokers check
    /// credentials: an admin user's, or the members' own).
    #[arg(long = "accessKey", env = "LEDGERMQ_ACCESS_KEY", global = true)]
    access_key: Option<String>,
    /// Secret key of `--accessKey`.
    #[arg(
        long = "secretKey",
        env = "LEDGERMQ_SECRET_KEY",
        global = true,
        hide_env_values = true
    )]
    secret_key: Option<String>,
    /// CA certificates (PEM) to check the brokers' client ports against when
    /// they serve TLS (`[tls]`); without it mqadmin calls them in plain text.
    #[arg(long = "tlsCa", env = "LEDGERMQ_TLS_CA", global = true)]
    tls_ca: Option<std::path::PathBuf>,
    /// CA certificates (PEM) to check the name servers against when they
    /// serve TLS (their `[tls]`); without it mqadmin calls them in plain text.
    #[arg(long = "namesrvCa", env = "LEDGERMQ_NAMESRV_TLS_CA", global = true)]
    namesrv_ca: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    #[command(flatten)]
    Acl(acl::AclCmd),
    /// List every broker node the name server knows.
    #[command(name = "clusterList")]
    ClusterList {
        /// Name server address(es), `host:port[;host:port...]`.
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
    },
    /// Create or update a topic on broker groups.
    #[command(name = "updateTopic")]
    UpdateTopic {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
        /// Message queues per broker group.
        #[arg(short = 'q', long = "queueNums", default_value_t = 8)]
        queues: u32,
        /// Permission: 2 write, 4 read, 6 both.
        #[arg(short = 'p', long = "perm", default_value_t = 6)]
        perm: u32,
        /// FIFO topic (messages with message groups): `+message.type=FIFO`.
        #[arg(long)]
        fifo: bool,
        /// Topic attribute changes, RocketMQ style: `+message.type=DELAY` (NORMAL,
        /// FIFO, DELAY, TRANSACTION, MIXED) or `-message.type` (back to NORMAL).
        #[arg(short = 'a', long = "attributes", allow_hyphen_values = true)]
        attributes: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Create or update a consumer group on broker groups.
    #[command(name = "updateSubGroup")]
    UpdateSubGroup {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Consumer group.
        #[arg(short = 'g', long = "groupName")]
        group: String,
        /// Strict order per queue.
        #[arg(long)]
        fifo: bool,
        /// Broadcasting: every consumer gets every message.
        #[arg(long)]
        broadcast: bool,
        /// Deliveries before the dead-letter queue.
        #[arg(short = 'r', long = "retryMaxTimes", default_value_t = 16)]
        max_attempts: u32,
        /// RocketMQ's groupRetryPolicy JSON, ms, e.g.
        /// '{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":5000,"max":7200000,"multiplier":2}}'
        /// or '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,5000,10000]}}'.
        /// Without it the group gets the broker's default (an update replaces
        /// the whole group config, a policy given before included).
        #[arg(short = 'p', long = "groupRetryPolicy")]
        retry_policy: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Show a consumer group's progress per message queue: each queue's end
    /// (broker offset), the group's committed consumer offset and the difference,
    /// as each broker group's leader has applied them.
    #[command(name = "consumerProgress")]
    ConsumerProgress {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Consumer group.
        #[arg(short = 'g', long = "groupName")]
        group: String,
        /// Only this topic (default: every topic the group committed an offset in).
        #[arg(short = 't', long = "topic")]
        topic: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Rewind a consumer group on a topic to a time: on every queue it next
    /// consumes the first message stored at or after it.
    #[command(name = "resetOffsetByTime")]
    ResetOffsetByTime {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Consumer group.
        #[arg(short = 'g', long = "group")]
        group: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
        /// `now`, ms since the Unix epoch, or local time `yyyy-MM-dd#HH:mm:ss:SSS`.
        #[arg(short = 's', long = "timestamp")]
        timestamp: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Find a topic's messages whose message id or one of whose keys is KEY.
    #[command(name = "queryMsgByKey")]
    QueryMsgByKey {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
        /// Key (or message id).
        #[arg(short = 'k', long = "msgKey")]
        key: String,
        /// Stored at or after, ms since the Unix epoch.
        #[arg(long = "beginTimestamp", default_value_t = 0)]
        begin: i64,
        /// Stored at or before, ms since the Unix epoch (0: no end).
        #[arg(short = 'e', long = "endTimestamp", default_value_t = 0)]
        end: i64,
        /// Most messages per broker group.
        #[arg(long = "maxNum", default_value_t = 64)]
        max: u32,
        #[command(flatten)]
        scope: Scope,
    },
    /// Show a message by its message id (the client's, UNIQ_KEY), in full.
    #[command(name = "queryMsgByUniqueKey")]
    QueryMsgByUniqueKey {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
        /// Message id.
        #[arg(short = 'i', long = "msgId")]
        id: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Each member's view of its Raft group, and the leaders' of their followers.
    #[command(name = "raftStatus")]
    RaftStatus {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Add a node to a broker group: it joins as a learner (started with
    /// `mqbroker --join`), catches up, then votes.
    #[command(name = "addNode")]
    AddNode {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// The broker group.
        #[arg(short = 'b', long = "brokerName")]
        broker_group: String,
        /// The new node's id (unused in the group).
        #[arg(short = 'i', long = "nodeId")]
        node_id: u64,
        /// The new node's Raft peer address, host:port.
        #[arg(short = 'p', long = "peerAddr")]
        peer_addr: String,
        /// How long to wait for it to catch up and vote, in seconds.
        #[arg(long = "timeoutSeconds", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout_s: u64,
    },
    /// Remove a node from a broker group (a voter is made a learner first; a
    /// leader hands leadership over first).
    #[command(name = "removeNode")]
    RemoveNode {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// The broker group.
        #[arg(short = 'b', long = "brokerName")]
        broker_group: String,
        /// The node's id.
        #[arg(short = 'i', long = "nodeId")]
        node_id: u64,
        /// How long to wait, in seconds.
        #[arg(long = "timeoutSeconds", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout_s: u64,
    },
    /// Delete a topic's configuration on every broker group (of the cluster, or
    /// the group given); its stored messages age out by retention.
    #[command(name = "deleteTopic")]
    DeleteTopic {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Delete a consumer group with its offsets, FIFO leases, retry and
    /// dead-letter topics, on every broker group of the cluster (or the group
    /// given).
    #[command(name = "deleteSubGroup")]
    DeleteSubGroup {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Consumer group.
        #[arg(short = 'g', long = "groupName")]
        group: String,
        /// Remove the group's consumer offsets too (RocketMQ's `-r true`).
        /// Required: this broker deletes a group's offsets with it.
        #[arg(short = 'r', long = "removeOffset", default_value_t = false, action = clap::ArgAction::Set)]
        remove_offset: bool,
        #[command(flatten)]
        scope: Scope,
    },
    /// Hand a broker group's leadership to a caught-up follower.
    #[command(name = "transferLeader")]
    TransferLeader {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// The broker group.
        #[arg(short = 'b', long = "brokerName")]
        broker_group: String,
        /// The follower to hand it to (default: the most caught-up one).
        #[arg(short = 'i', long = "nodeId")]
        node_id: Option<u64>,
        /// How long to wait, in seconds.
        /// (at most 30: writes pause during a hand-over).
        #[arg(long = "timeoutSeconds", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=30))]
        timeout_s: u64,
    },
    /// Each node's status: Raft, store and traffic since start.
    #[command(name = "brokerStatus")]
    BrokerStatus {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// The consumers of a consumer group connected to the nodes (RocketMQ's
    /// consumerConnection).
    #[command(name = "consumerConnection")]
    ConsumerConnection {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Consumer group.
        #[arg(short = 'g', long = "consumerGroup")]
        group: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Each node's effective configuration, defaults included.
    #[command(name = "getBrokerConfig")]
    GetBrokerConfig {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Check that every member of each broker group holds the same committed
    /// log and ConsumeQueue entries.
    #[command(name = "verifyReplicas")]
    VerifyReplicas {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Each queue's min and max offsets of a topic (RocketMQ's topicStatus).
    #[command(name = "topicStatus")]
    TopicStatus {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
    },
    /// Every topic the nodes serve (RocketMQ's topicList).
    #[command(name = "topicList")]
    TopicList {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Only this cluster's topics, with their broker groups.
        #[arg(short = 'c', long = "clusterName")]
        cluster: Option<String>,
    },
    /// Show where a topic's queues live and who leads each group.
    #[command(name = "topicRoute")]
    TopicRoute {
        /// Name server address(es).
        #[arg(short = 'n', long = "namesrvAddr")]
        namesrv: String,
        /// Topic.
        #[arg(short = 't', long = "topic")]
        topic: String,
    },
}

/// Asks `change` of broker group `group` (its members from the name servers),
/// waiting up to `timeout_s`.
async fn change_membership(
    namesrv: &str,
    group: &str,
    change: membership::Change,
    timeout_s: u64,
) -> Result<()> {
    let members = group_members(namesrv, group).await?;
    membership::change(group, &members, change, Duration::from_secs(timeout_s)).await
}

/// Refuses a destructive command `what` that names neither a cluster nor a
/// broker group (RocketMQ's deleteTopic requires a cluster).
fn require_scope(what: &str, scope: &Scope) -> Result<()> {
    if scope.cluster.is_none() && scope.broker_group.is_none() {
        bail!("{what} needs -c CLUSTER or -b BROKER_GROUP");
    }
    Ok(())
}

/// The nodes a node-local command asks: `-b HOST:PORT` is the one node with
/// that client (gRPC) or remoting address (RocketMQ's broker address), as
/// the name servers list it; otherwise every node of the selected groups.
async fn nodes_or_addr(namesrv: &str, scope: &Scope) -> Result<BTreeMap<String, Vec<String>>> {
    let Some(addr) = scope.broker_group.as_ref().filter(|b| b.contains(':')) else {
        return groups(namesrv, scope).await;
    };
    let node = cluster::nodes(namesrv)
        .await?
        .into_iter()
        .filter_map(|n| n.node)
        .find(|n| {
            n.client_addr == *addr || n.remoting_addr == *addr || cluster::member_addr(n) == addr
        });
    match node {
        Some(n) => Ok(BTreeMap::from([(
            n.broker_group.clone(),
            vec![cluster::member_addr(&n).to_owned()],
        )])),
        None => bail!("the name servers know no node at {addr} (its client or remoting address)"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    cluster::set_credentials(args.access_key, args.secret_key)?;
    cluster::set_tls_ca(args.tls_ca.as_deref(), args.namesrv_ca.as_deref())?;
    match args.cmd {
        Cmd::Acl(c) => acl::run(c).await?,
        Cmd::ClusterList { namesrv } => cluster::cluster_list(&namesrv).await?,
        Cmd::TopicList { namesrv, cluster } => {
            cluster::topic_list(&namesrv, cluster.as_deref()).await?
        }
        Cmd::UpdateTopic {
            namesrv,
            topic,
            queues,
            perm,
            fifo,
            attributes,
            scope,
        } => {
            let message_type = match attributes.as_deref() {
                Some(a) => topic_message_type(a)?,
                None => None,
            };
            let req = UpdateTopicRequest {
                name: topic.clone(),
                queue_count: queues,
                perm,
                fifo,
                message_type: message_type.clone().unwrap_or_default(),
            };
            let kind = match (&message_type, fifo) {
                (Some(t), _) => t.as_str(),
                (None, true) => "FIFO",
                (None, false) => "unchanged",
            };
            let what =
                format!("updateTopic {topic} ({queues} queues, perm {perm}, message.type {kind})");
            apply(&namesrv, &scope, &what, AdminReq::Topic(req)).await?;
        }
        Cmd::UpdateSubGroup {
            namesrv,
            group,
            fifo,
            broadcast,
            max_attempts,
            retry_policy,
            scope,
        } => {
            // Checked here first: a bad policy changes no broker group.
            let policy = match &retry_policy {
                Some(json) => Some(RetryPolicy::from_rocketmq_json(json)?),
                None => None,
            };
            let req = UpdateGroupRequest {
                name: group.clone(),
                fifo,
                broadcast,
                max_delivery_attempts: max_attempts,
                retry_policy: retry_policy.unwrap_or_default(),
            };
            let what = format!(
                "updateSubGroup {group} (fifo {fifo}, broadcast {broadcast}, retry policy {})",
                policy.map_or("the broker's default".to_owned(), |p| format!("{p:?}"))
            );
            apply(&namesrv, &scope, &what, AdminReq::Group(req)).await?;
        }
        Cmd::ConsumerProgress {
            namesrv,
            group,
            topic,
            scope,
        } => {
            if group.is_empty() {
                bail!("consumerProgress needs a consumer group (-g)");
            }
            progress::consumer_progress(groups(&namesrv, &scope).await?, &group, topic).await
        }
        Cmd::AddNode {
            namesrv,
            broker_group,
            node_id,
            peer_addr,
            timeout_s,
        } => {
            let change = membership::Change::Add {
                id: node_id,
                peer_addr,
            };
            change_membership(&namesrv, &broker_group, change, timeout_s).await?
        }
        Cmd::RemoveNode {
            namesrv,
            broker_group,
            node_id,
            timeout_s,
        } => {
            let change = membership::Change::Remove { id: node_id };
            change_membership(&namesrv, &broker_group, change, timeout_s).await?
        }
        Cmd::DeleteTopic {
            namesrv,
            topic,
            scope,
        } => {
            require_scope("deleteTopic", &scope)?;
            let req = AdminReq::DeleteTopic(DeleteTopicRequest {
                name: topic.clone(),
            });
            apply(&namesrv, &scope, &format!("deleteTopic {topic}"), req).await?;
        }
        Cmd::DeleteSubGroup {
            namesrv,
            group,
            remove_offset,
            scope,
        } => {
            require_scope("deleteSubGroup", &scope)?;
            if !remove_offset {
                bail!(
                    "this broker deletes a consumer group's offsets with it: pass -r true to \
                     delete {group} and its offsets (a consumer that comes back starts from its \
                     consume-from position)"
                );
            }
            let req = AdminReq::DeleteGroup(DeleteGroupRequest {
                name: group.clone(),
            });
            apply(&namesrv, &scope, &format!("deleteSubGroup {group}"), req).await?;
        }
        Cmd::TransferLeader {
            namesrv,
            broker_group,
            node_id,
            timeout_s,
        } => {
            let members = group_members(&namesrv, &broker_group).await?;
            ops::transfer_leader(
                &broker_group,
                &members,
                node_id,
                Duration::from_secs(timeout_s),
            )
            .await?
        }
        Cmd::BrokerStatus { namesrv, scope } => {
            ops::each_node(
                nodes_or_addr(&namesrv, &scope).await?,
                ops::NodeCall::Status,
            )
            .await?
        }
        Cmd::ConsumerConnection {
            namesrv,
            group,
            scope,
        } => ops::consumer_connection(groups(&namesrv, &scope).await?, &group).await?,
        Cmd::GetBrokerConfig { namesrv, scope } => {
            ops::each_node(
                nodes_or_addr(&namesrv, &scope).await?,
                ops::NodeCall::Config,
            )
            .await?
        }
        Cmd::VerifyReplicas { namesrv, scope } => {
            verify::verify_replicas(group_nodes(&namesrv, &scope).await?).await?
        }
        Cmd::RaftStatus { namesrv, scope } => {
            progress::raft_status(group_nodes(&namesrv, &scope).await?).await?
        }
        Cmd::TopicStatus { namesrv, topic } => {
            let serving = topic_groups(&namesrv, &Scope::default(), &topic).await?;
            progress::topic_status(serving, &topic).await?
        }
        Cmd::ResetOffsetByTime {
            namesrv,
            group,
            topic,
            timestamp,
            scope,
        } => {
            let groups = topic_groups(&namesrv, &scope, &topic).await?;
            messages::reset_offset_by_time(&groups, &group, &topic, &timestamp).await?;
        }
        Cmd::QueryMsgByKey {
            namesrv,
            topic,
            key,
            begin,
            end,
            max,
            scope,
        } => {
            let groups = topic_groups(&namesrv, &scope, &topic).await?;
            let q = messages::Query {
                topic,
                key,
                begin_ms: begin,
                end_ms: end,
                max_results: max,
                unique_key_only: false,
            };
            messages::query_by_key(&groups, &q).await?;
        }
        Cmd::QueryMsgByUniqueKey {
            namesrv,
            topic,
            id,
            scope,
        } => {
            let groups = topic_groups(&namesrv, &scope, &topic).await?;
            let q = messages::Query {
                topic,
                key: id,
                begin_ms: 0,
                end_ms: 0,
                max_results: 32,
                unique_key_only: true,
            };
            messages::query_by_unique_key(&groups, &q).await?;
        }
        Cmd::TopicRoute { namesrv, topic } => {
            let r = client(&namesrv)
                .await?
                .query_route(QueryRouteRequest {
                    topic: topic.clone(),
                })
                .await?
                .into_inner();
            if !r.found {
                bail!("topic {topic} is not served by any broker group");
            }
            for g in r.groups {
                let leader = if g.has_leader {
                    g.leader_addr.clone()
                } else {
                    "(none)".into()
                };
                println!(
                    "topic {topic} group {} cluster {}: {} queues, perm {}, leader {} (node {}, term {})",
                    g.broker_group, g.cluster, g.queue_count, g.perm, leader, g.leader_node_id, g.leader_term
                );
                for m in g.members {
                    println!(
                        "  node {} {} {} term {} commit {}",
                        m.node_id,
                        m.client_addr,
                        role_name(m.role),
                        m.term,
                        m.commit_index
                    );
                }
            }
        }
    }
    Ok(())
}
