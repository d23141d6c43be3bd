//! Log command sets at the leader's writer: a command of a later set (a MIXED
//! topic, set 3) is written only once every member has said, in the leader's
//! current term, that it decodes that set; otherwise it is refused with a typed
//! error, not written, whether it was proposed at the leader or forwarded to it.

mod common;

use std::time::Duration;

use common::Cluster;
use ledgermq_raft::format::SET_MIXED_TOPICS;
use ledgermq_raft::{Command, RaftNodeError, TopicConfig, TopicMessageType, TopicPerm};
use ledgermq_store::FlushMode;

const T: Duration = Duration::from_secs(20);

fn topic(name: &str, message_type: TopicMessageType) -> Command {
    Command::UpdateTopic(TopicConfig {
        name: name.into(),
        queue_count: 4,
        perm: TopicPerm::READ_WRITE,
        message_type,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_topic_is_written_only_while_every_member_decodes_set_3() {
    let mut c = Cluster::start(3, FlushMode::Sync).await;
    let leader = c.wait_leader(T).await;
    c.wait_members_decode(leader, SET_MIXED_TOPICS, T).await;
    c.node(leader)
        .write_command(topic("Mixed1", TopicMessageType::Mixed))
        .await
        .unwrap();

    // One follower goes down, and leadership moves to the other one: in the new
    // term the member that is down never says what it decodes.
    let down = (leader + 1) % 3;
    let next = (leader + 2) % 3;
    c.crash(down).await;
    c.node(leader)
        .transfer_leadership(Some(next), T)
        .await
        .unwrap();
    assert_eq!(c.wait_leader(T).await, next);
    assert!(!c.node(next).members_decode(SET_MIXED_TOPICS));
    // Refused at the leader and through a forward alike, typed, and not written.
    for via in [next, leader] {
        let r = c
            .node(via)
            .write_command(topic("Mixed2", TopicMessageType::Mixed))
            .await;
        assert!(
            matches!(r, Err(RaftNodeError::MembersCannotDecode { set: 3 })),
            "via node {via}: {r:?}"
        );
    }
    // A command of set 1 is written as before.
    c.node(leader)
        .write_command(topic("Normal1", TopicMessageType::Normal))
        .await
        .unwrap();
    for id in [leader, next] {
        let meta = c.node(id).shared_meta();
        let meta = meta.read().unwrap();
        assert!(!meta.topics.contains_key("Mixed2"), "node {id}");
        assert_eq!(meta.topics["Mixed1"].message_type, TopicMessageType::Mixed);
    }

    // Back up and heard from in this term: the set opens again.
    c.restart(down).await;
    c.wait_members_decode(next, SET_MIXED_TOPICS, T).await;
    c.node(down)
        .write_command(topic("Mixed2", TopicMessageType::Mixed))
        .await
        .unwrap();
    c.wait_converged(T).await;
    for id in 0..3 {
        let meta = c.node(id).shared_meta();
        let meta = meta.read().unwrap();
        assert_eq!(
            meta.topics["Mixed2"].message_type,
            TopicMessageType::Mixed,
            "node {id}"
        );
    }
}
