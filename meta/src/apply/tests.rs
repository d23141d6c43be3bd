//! The metadata rules alone: each command against a state in memory, and the rows
//! it asks to store.

use super::*;
use crate::command::{DeliveryAttempts, OffsetCommit};
use crate::config::{TopicMessageType, TopicPerm};
use crate::retry::RetryPolicy;

const TERM: u64 = 7;

fn commit(group: &str, queue_id: i32, offset: u64) -> Command {
    Command::CommitOffsets(vec![OffsetCommit {
        group: group.into(),
        topic: "T".into(),
        queue_id,
        offset,
    }])
}

fn key(group: &str, queue_id: i32) -> QueueKey {
    (group.into(), "T".into(), queue_id)
}

fn lease(group: &str, queue_offset: u64, term: u64, seq: u64) -> FifoLease {
    FifoLease {
        group: group.into(),
        topic: "T".into(),
        queue_id: 0,
        queue_offset,
        delivery_id: (term << FifoLease::DELIVERY_TERM_SHIFT) | seq,
        attempt: 1,
        visible_at_ms: 1_000,
    }
}

fn topic(name: &str, queue_count: u32) -> TopicConfig {
    TopicConfig {
        name: name.into(),
        queue_count,
        perm: TopicPerm::READ_WRITE,
        message_type: TopicMessageType::Normal,
    }
}

fn group(name: &str) -> GroupConfig {
    GroupConfig {
        name: name.into(),
        fifo: true,
        broadcast: false,
        max_delivery_attempts: 16,
    }
}

fn run(meta: &mut GroupMeta, cmd: Command) -> Applied {
    apply(meta, cmd, TERM, at(Instant::now(), 0), Canaries::default())
}

fn at(instant: Instant, wall_ms: i64) -> AppliedAt {
    AppliedAt { instant, wall_ms }
}

fn timed(l: FifoLease, invisible_ms: u64) -> TimedFifoLease {
    TimedFifoLease {
        lease: l,
        invisible_ms,
    }
}

#[test]
fn consumer_offsets_only_move_forward_and_the_stored_row_is_the_kept_one() {
    let mut m = GroupMeta::default();
    let a = run(&mut m, commit("g", 0, 10));
    assert_eq!(a.rows, vec![RowChange::Offset(key("g", 0), 10)]);
    // A commit that lands late (an older offset) keeps 10.
    let a = run(&mut m, commit("g", 0, 4));
    assert_eq!(a.outcome, Outcome::Applied);
    assert_eq!(a.rows, vec![RowChange::Offset(key("g", 0), 10)]);
    assert_eq!(m.offsets[&key("g", 0)], 10);
    run(&mut m, commit("g", 0, 12));
    assert_eq!(m.offsets[&key("g", 0)], 12);
}

#[test]
fn ensure_never_overrides_a_config_and_update_does() {
    let mut m = GroupMeta::default();
    run(&mut m, Command::UpdateTopic(topic("T", 8)));
    let a = run(&mut m, Command::EnsureTopic(topic("T", 4)));
    assert!(a.rows.is_empty());
    assert_eq!(m.topics["T"].queue_count, 8);
    let a = run(&mut m, Command::EnsureTopic(topic("U", 4)));
    assert_eq!(a.rows, vec![RowChange::Topic(topic("U", 4))]);
    run(&mut m, Command::UpdateTopic(topic("T", 2)));
    assert_eq!(m.topics["T"].queue_count, 2);
    let mut g = group("g");
    g.max_delivery_attempts = 3;
    run(&mut m, Command::UpdateGroup(g.clone()));
    assert!(run(&mut m, Command::EnsureGroup(group("g")))
        .rows
        .is_empty());
    assert_eq!(m.groups["g"], g);
    let a = run(&mut m, Command::DeleteTopic("T".into()));
    assert_eq!(a.rows, vec![RowChange::RemoveTopic("T".into())]);
    assert!(!m.topics.contains_key("T"));
}

#[test]
fn a_lease_of_another_term_changes_nothing() {
    let mut m = GroupMeta::default();
    let before = m.clone();
    let a = run(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM - 1,
            leases: vec![lease("g", 5, TERM - 1, 1)],
        },
    );
    assert_eq!(
        a.outcome,
        Outcome::StaleTerm {
            proposed_term: TERM - 1,
            entry_term: TERM
        }
    );
    assert!(a.rows.is_empty());
    assert_eq!(m, before);
    // The earlier releases' variant: the term is the one in the delivery id.
    let a = run(
        &mut m,
        Command::FifoLeases(vec![lease("g", 5, TERM - 1, 1)]),
    );
    assert!(matches!(a.outcome, Outcome::StaleTerm { .. }));
    assert_eq!(m, before);
    // The canary applies it anyway.
    let a = apply(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM - 1,
            leases: vec![lease("g", 5, TERM - 1, 1)],
        },
        TERM,
        at(Instant::now(), 0),
        Canaries {
            forward_fifo_leases: true,
        },
    );
    assert_eq!(a.outcome, Outcome::Applied);
    assert!(m.fifo_leases.contains_key(&key("g", 0)));
}

#[test]
fn a_lease_raises_the_offset_to_its_message_and_an_older_delivery_never_replaces_a_newer() {
    let mut m = GroupMeta::default();
    run(&mut m, commit("g", 0, 3));
    let newer = lease("g", 5, TERM, 9);
    let a = run(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM,
            leases: vec![newer.clone()],
        },
    );
    assert_eq!(
        a.rows,
        vec![
            RowChange::Offset(key("g", 0), 5),
            RowChange::Lease(newer.clone())
        ]
    );
    assert_eq!(m.offsets[&key("g", 0)], 5);
    // A lease with a lower delivery id (decided earlier) is skipped.
    let a = run(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM,
            leases: vec![lease("g", 6, TERM, 8)],
        },
    );
    assert!(a.rows.is_empty());
    assert_eq!(m.fifo_leases[&key("g", 0)], newer);
    // A lease below the committed offset leaves the offset alone.
    run(&mut m, commit("g", 0, 20));
    let a = run(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM,
            leases: vec![lease("g", 7, TERM, 10)],
        },
    );
    assert_eq!(a.rows, vec![RowChange::Lease(lease("g", 7, TERM, 10))]);
    assert_eq!(m.offsets[&key("g", 0)], 20);
}

#[test]
fn deleting_a_group_removes_its_and_its_broadcast_consumers_rows_only() {
    let mut m = GroupMeta::default();
    for g in ["g", "g@client-1", "g2", "other"] {
        run(&mut m, Command::UpdateGroup(group(g)));
        run(&mut m, commit(g, 0, 1));
        run(
            &mut m,
            Command::FifoLeasesOfTerm {
                term: TERM,
                leases: vec![lease(g, 1, TERM, 1)],
            },
        );
    }
    let a = run(&mut m, Command::DeleteGroup("g".into()));
    assert_eq!(
        a.rows,
        vec![
            RowChange::RemoveOffset(key("g", 0)),
            RowChange::RemoveOffset(key("g@client-1", 0)),
            RowChange::RemoveLease(key("g", 0)),
            RowChange::RemoveLease(key("g@client-1", 0)),
            RowChange::RemoveGroup("g".into()),
        ]
    );
    let left: Vec<&str> = m.offsets.keys().map(|k| k.0.as_str()).collect();
    assert_eq!(left, ["g2", "other"]);
    assert_eq!(m.fifo_leases.len(), 2);
    assert!(m.groups.contains_key("g2") && !m.groups.contains_key("g"));
}

#[test]
fn the_retention_point_only_moves_forward() {
    let mut m = GroupMeta::default();
    let a = run(&mut m, Command::PurgeThrough { index: 100 });
    assert_eq!(a.rows, vec![RowChange::PurgePoint(100)]);
    assert!(run(&mut m, Command::PurgeThrough { index: 40 })
        .rows
        .is_empty());
    assert!(run(&mut m, Command::PurgeThrough { index: 100 })
        .rows
        .is_empty());
    assert_eq!(m.purge_point, Some(100));
    run(&mut m, Command::PurgeThrough { index: 101 });
    assert_eq!(m.purge_point, Some(101));
}

#[test]
fn a_timed_lease_is_held_from_its_apply_on_this_nodes_clock_whatever_the_wall_clock_says() {
    let mut m = GroupMeta::default();
    let applied_at = Instant::now();
    // The deciding leader's wall-clock deadline (1,000) is 10 s away by this
    // node's wall clock, 20 s ahead of the leader's: the 30 s left are what
    // counts.
    let l = lease("g", 5, TERM, 1);
    let a = apply(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM,
            leases: vec![timed(l.clone(), 30_000)],
        },
        TERM,
        at(applied_at, 1_000 - 10_000),
        Canaries::default(),
    );
    assert_eq!(a.outcome, Outcome::Applied);
    assert_eq!(
        a.rows,
        vec![
            RowChange::Offset(key("g", 0), 5),
            RowChange::Lease(l.clone())
        ],
        "the stored row is the lease as earlier releases store it"
    );
    assert_eq!(
        m.lease_deadlines.0[&key("g", 0)],
        LeaseDeadline {
            delivery_id: l.delivery_id,
            visible_at: applied_at + Duration::from_secs(30),
        }
    );
    // An older delivery neither replaces the lease nor its deadline.
    let older = lease("g", 5, TERM, 0);
    run(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM,
            leases: vec![timed(older, 1)],
        },
    );
    assert_eq!(m.lease_deadlines.0[&key("g", 0)].delivery_id, l.delivery_id);
    // A newer one written without its time left (an earlier release's leader)
    // drops the deadline: its delivery is judged by the wall clock.
    run(
        &mut m,
        Command::FifoLeasesOfTerm {
            term: TERM,
            leases: vec![lease("g", 5, TERM, 2)],
        },
    );
    assert!(!m.lease_deadlines.0.contains_key(&key("g", 0)));
}

#[test]
fn a_timed_lease_of_another_term_changes_nothing_and_deleting_its_group_drops_its_deadline() {
    let mut m = GroupMeta::default();
    let before = m.clone();
    let a = run(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM - 1,
            leases: vec![timed(lease("g", 5, TERM - 1, 1), 10_000)],
        },
    );
    assert!(matches!(a.outcome, Outcome::StaleTerm { .. }));
    assert!(a.rows.is_empty());
    assert_eq!(m, before);
    run(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM,
            leases: vec![timed(lease("g", 5, TERM, 1), 10_000)],
        },
    );
    assert!(m.lease_deadlines.0.contains_key(&key("g", 0)));
    run(&mut m, Command::DeleteGroup("g".into()));
    assert!(m.lease_deadlines.0.is_empty() && m.fifo_leases.is_empty());
}

#[test]
fn the_timed_variant_is_chosen_only_when_every_member_decodes_it() {
    let t = vec![timed(lease("g", 5, TERM, 1), 10_000)];
    assert_eq!(
        Command::fifo_leases(TERM, t.clone(), true),
        Command::FifoLeasesTimed {
            term: TERM,
            leases: t.clone()
        }
    );
    assert_eq!(
        Command::fifo_leases(TERM, t, false),
        Command::FifoLeasesOfTerm {
            term: TERM,
            leases: vec![lease("g", 5, TERM, 1)]
        }
    );
}

#[test]
fn a_timed_lease_applied_late_is_held_at_most_the_skew_allowance_past_its_wall_clock_end() {
    let t0 = Instant::now();
    let hour_ms = 3_600_000;
    // Applied as it is decided: the whole duration.
    assert_eq!(
        timed_lease_left_ms(hour_ms, 5_000 + hour_ms as i64, at(t0, 5_000)),
        hour_ms
    );
    // Replayed after a restart, or by a follower catching up, an hour after its
    // wall-clock end: the allowance, not another hour.
    assert_eq!(
        timed_lease_left_ms(hour_ms, 5_000, at(t0, 5_000 + hour_ms as i64)),
        LEASE_CLOCK_SKEW_ALLOWANCE_MS
    );
    // A short lease is never lengthened by the allowance.
    assert_eq!(
        timed_lease_left_ms(1_000, 5_000, at(t0, 5_000 + hour_ms as i64)),
        1_000
    );
    // Never past the longest invisible duration.
    assert_eq!(
        timed_lease_left_ms(u64::MAX, i64::MAX, at(t0, 0)),
        LEASE_TIME_LEFT_MAX_MS
    );
    let mut m = GroupMeta::default();
    apply(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM,
            leases: vec![timed(lease("g", 5, TERM, 1), hour_ms)],
        },
        TERM,
        at(t0, 1_000 + hour_ms as i64),
        Canaries::default(),
    );
    assert_eq!(
        m.lease_deadlines.0[&key("g", 0)].visible_at,
        t0 + Duration::from_millis(LEASE_CLOCK_SKEW_ALLOWANCE_MS)
    );
}

#[test]
fn a_reset_sets_offsets_back_exactly_and_voids_the_queues_fifo_delivery() {
    let mut m = GroupMeta::default();
    run(&mut m, commit("g", 0, 10));
    run(&mut m, commit("g", 1, 7));
    let l = timed(lease("g", 12, TERM, 3), 30_000);
    run(
        &mut m,
        Command::FifoLeasesTimed {
            term: TERM,
            leases: vec![l],
        },
    );
    assert_eq!(m.offsets[&key("g", 0)], 12);
    assert!(m.lease_deadlines.0.contains_key(&key("g", 0)));
    let reset = |queue_id, offset| OffsetCommit {
        group: "g".into(),
        topic: "T".into(),
        queue_id,
        offset,
    };
    // Back on queue 0 (its lease goes), forward on queue 1.
    let a = run(
        &mut m,
        Command::ResetOffsets(vec![reset(0, 2), reset(1, 9)]),
    );
    assert_eq!(
        a.rows,
        vec![
            RowChange::Offset(key("g", 0), 2),
            RowChange::RemoveLease(key("g", 0)),
            RowChange::Offset(key("g", 1), 9),
        ]
    );
    assert_eq!(m.offsets[&key("g", 0)], 2);
    assert_eq!(m.offsets[&key("g", 1)], 9);
    assert!(m.fifo_leases.is_empty() && m.lease_deadlines.0.is_empty());
    // Commits after it move forward from the reset offset, not from the old one.
    run(&mut m, commit("g", 0, 3));
    assert_eq!(m.offsets[&key("g", 0)], 3);
    assert_eq!(Command::ResetOffsets(vec![]).log_command_set(), 4);
}

#[test]
fn a_retry_policy_comes_with_its_group_and_goes_with_a_plain_update_or_a_delete() {
    let mut m = GroupMeta::default();
    let policy = RetryPolicy::Customized {
        next_ms: vec![1_000, 2_000],
    };
    let a = run(
        &mut m,
        Command::UpdateGroupWithRetryPolicy {
            group: group("g"),
            retry_policy: policy.clone(),
        },
    );
    assert_eq!(
        a.rows,
        vec![
            RowChange::RetryPolicy("g".into(), policy.clone()),
            RowChange::Group(group("g"))
        ]
    );
    assert_eq!(m.retry_policies["g"], policy);
    assert_eq!(m.groups["g"], group("g"));
    // Auto-creation keeps it.
    assert!(run(&mut m, Command::EnsureGroup(group("g")))
        .rows
        .is_empty());
    assert_eq!(m.retry_policies["g"], policy);
    // A plain update replaces the whole config: the policy goes.
    let a = run(&mut m, Command::UpdateGroup(group("g")));
    assert_eq!(
        a.rows,
        vec![
            RowChange::RemoveRetryPolicy("g".into()),
            RowChange::Group(group("g"))
        ]
    );
    assert!(m.retry_policies.is_empty());
    // Without a policy, nothing to remove.
    let a = run(&mut m, Command::UpdateGroup(group("g")));
    assert_eq!(a.rows, vec![RowChange::Group(group("g"))]);
    // A deleted group's policy goes; another group's stays.
    for name in ["g", "h"] {
        run(
            &mut m,
            Command::UpdateGroupWithRetryPolicy {
                group: group(name),
                retry_policy: policy.clone(),
            },
        );
    }
    let a = run(&mut m, Command::DeleteGroup("g".into()));
    assert!(a.rows.contains(&RowChange::RemoveRetryPolicy("g".into())));
    assert_eq!(m.retry_policies.keys().collect::<Vec<_>>(), ["h"]);
}

fn attempts(entries: &[(&str, i32, u64, u32)]) -> Command {
    Command::DeliveryAttempts(
        entries
            .iter()
            .map(
                |&(group, queue_id, queue_offset, attempt)| DeliveryAttempts {
                    group: group.into(),
                    topic: "T".into(),
                    queue_id,
                    attempts: vec![(queue_offset, attempt)],
                },
            )
            .collect(),
    )
}

#[test]
fn delivery_attempts_keep_the_highest_until_the_offset_passes_them() {
    let mut m = GroupMeta::default();
    let a = run(
        &mut m,
        attempts(&[("g", 0, 5, 1), ("g", 0, 6, 2), ("g", 1, 0, 1)]),
    );
    assert_eq!(
        a.rows,
        vec![
            RowChange::DeliveryAttempt(key("g", 0), 5, 1),
            RowChange::DeliveryAttempt(key("g", 0), 6, 2),
            RowChange::DeliveryAttempt(key("g", 1), 0, 1),
        ]
    );
    // A lower attempt (a late record) keeps the higher; a higher replaces it.
    let a = run(&mut m, attempts(&[("g", 0, 6, 1), ("g", 0, 5, 3)]));
    assert_eq!(a.rows, vec![RowChange::DeliveryAttempt(key("g", 0), 5, 3)]);
    assert_eq!(m.delivery_attempts[&key("g", 0)], [(5, 3), (6, 2)].into());
    // The committed offset passes offset 5: its record goes; 6 stays.
    let a = run(&mut m, commit("g", 0, 6));
    assert_eq!(
        a.rows,
        vec![
            RowChange::Offset(key("g", 0), 6),
            RowChange::PruneDeliveryAttempts(key("g", 0), 6)
        ]
    );
    assert_eq!(m.delivery_attempts[&key("g", 0)], [(6, 2)].into());
    // A record below the committed offset is of a consumed message.
    assert!(run(&mut m, attempts(&[("g", 0, 4, 9)])).rows.is_empty());
    // A commit that prunes nothing stores no prune row.
    assert_eq!(run(&mut m, commit("g", 0, 6)).rows.len(), 1);
    run(&mut m, commit("g", 0, 7));
    assert!(!m.delivery_attempts.contains_key(&key("g", 0)));
    assert!(m.delivery_attempts.contains_key(&key("g", 1)));
}

#[test]
fn a_reset_or_a_deleted_group_drops_its_delivery_attempts() {
    let mut m = GroupMeta::default();
    run(
        &mut m,
        attempts(&[("g", 0, 5, 2), ("g@c1", 0, 5, 1), ("h", 0, 5, 1)]),
    );
    let a = run(
        &mut m,
        Command::ResetOffsets(vec![OffsetCommit {
            group: "h".into(),
            topic: "T".into(),
            queue_id: 0,
            offset: 0,
        }]),
    );
    assert!(a
        .rows
        .contains(&RowChange::PruneDeliveryAttempts(key("h", 0), u64::MAX)));
    let a = run(&mut m, Command::DeleteGroup("g".into()));
    assert!(a
        .rows
        .contains(&RowChange::PruneDeliveryAttempts(key("g", 0), u64::MAX)));
    assert!(a
        .rows
        .contains(&RowChange::PruneDeliveryAttempts(key("g@c1", 0), u64::MAX)));
    assert!(m.delivery_attempts.is_empty());
}

#[test]
fn acl_users_keep_their_permissions_across_a_key_change_and_go_with_a_delete() {
    use crate::acl::{AclResource, Action, Perm};
    let mut m = GroupMeta::default();
    let put = |secret: &str, admin: bool| Command::PutAclUser {
        username: "demo".into(),
        secret_key: secret.into(),
        admin,
    };
    let grant = |user: &str| Command::SetAclPerm {
        username: user.into(),
        resource: AclResource::Topic("SecureTopic".into()),
        perm: Some(Perm::PubSub),
    };
    // A permission for a user that does not exist changes nothing.
    assert!(run(&mut m, grant("demo")).rows.is_empty());
    assert!(m.acl_users.is_empty());
    run(&mut m, put("one", false));
    let a = run(&mut m, grant("demo"));
    assert_eq!(
        a.rows,
        vec![RowChange::AclUser(m.acl_users["demo"].clone())]
    );
    // A new secret keeps the permissions.
    run(&mut m, put("two", false));
    let u = &m.acl_users["demo"];
    assert_eq!(u.secret_key.expose(), "two");
    assert!(u.permits(&AclResource::Topic("SecureTopic".into()), &[Action::Pub]));
    assert!(!u.permits(&AclResource::Topic("Other".into()), &[Action::Pub]));
    let d = run(&mut m, Command::DeleteAclUser("demo".into()));
    assert_eq!(d.rows, vec![RowChange::RemoveAclUser("demo".into())]);
    assert!(m.acl_users.is_empty());
    assert!(run(&mut m, Command::DeleteAclUser("demo".into()))
        .rows
        .is_empty());
    assert_eq!(put("x", true).log_command_set(), 9);
    assert!(!put("x", true).written_past_silent_members());
}

#[test]
fn creating_a_user_whole_never_replaces_one_that_exists() {
    use crate::acl::{AclResource, AclUser, Perm};
    let mut m = GroupMeta::default();
    let mut u = AclUser::new("demo", "one", false);
    u.set_perm(&AclResource::Topic("T".into()), Some(Perm::Pub));
    let a = run(&mut m, Command::CreateAclUser(u.clone()));
    assert_eq!(a.rows, vec![RowChange::AclUser(u.clone())]);
    let other = AclUser::new("demo", "two", true);
    assert!(run(&mut m, Command::CreateAclUser(other)).rows.is_empty());
    assert_eq!(m.acl_users["demo"], u);
}
