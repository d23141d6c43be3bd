//! The Settings a client is sent over Telemetry: the broker's values merged
//! into what the client announced, as RocketMQ's proxy does
//! (`GrpcClientSettingsManager`): the max body size for producers; for
//! consumers the group's FIFO flag, batch size, long-polling time and retry
//! policy.

use ledgermq_meta::retry::ROCKETMQ_DELAY_LEVELS_MS;
use ledgermq_meta::RetryPolicy;

use crate::broker::Broker;
use crate::grpc::message::duration;
use crate::pb;

/// The backoff of a group given no retry policy: RocketMQ 4.x's delay levels
/// from level 3 (10 s, 30 s, 1 min, ... 2 h), its first retry's level.
const DEFAULT_RETRY_DELAYS_MS: &[u64] = ROCKETMQ_DELAY_LEVELS_MS.split_at(2).1;

/// The `backoff_policy` a consumer of a group is sent: at most
/// `max_delivery_attempts` deliveries, and the group's retry policy as RocketMQ's
/// proxy sends it (`GrpcClientSettingsManager.mergeSubscriptionData`: EXPONENTIAL
/// as ExponentialBackoff, CUSTOMIZED as CustomizedBackoff with its delays as
/// they are), or [`DEFAULT_RETRY_DELAYS_MS`] for a group without one (where
/// the proxy sends RocketMQ 5's CUSTOMIZED default, from 1 s). No I/O.
pub fn backoff_policy(max_delivery_attempts: u32, policy: Option<&RetryPolicy>) -> pb::RetryPolicy {
    let strategy = match policy {
        None => pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
            next: DEFAULT_RETRY_DELAYS_MS
                .iter()
                .map(|&ms| duration(ms))
                .collect(),
        }),
        Some(RetryPolicy::Customized { next_ms }) => {
            pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
                next: next_ms.iter().map(|&ms| duration(ms)).collect(),
            })
        }
        Some(RetryPolicy::Exponential {
            initial_ms,
            max_ms,
            multiplier,
        }) => pb::retry_policy::Strategy::ExponentialBackoff(pb::ExponentialBackoff {
            initial: Some(duration(*initial_ms)),
            max: Some(duration(*max_ms)),
            multiplier: *multiplier as f32,
        }),
    };
    pb::RetryPolicy {
        max_attempts: max_delivery_attempts.min(i32::MAX as u32) as i32,
        strategy: Some(strategy),
    }
}

/// The client's settings with the broker's values: the max body size for
/// producers; for consumers the group's FIFO flag, batch size, long-polling time and
/// retry policy.
pub fn merged_settings(b: &Broker, mut s: pb::Settings) -> pb::Settings {
    match &mut s.pub_sub {
        Some(pb::settings::PubSub::Publishing(p)) => {
            p.max_body_size = b.settings.max_body_bytes as i32;
        }
        Some(pb::settings::PubSub::Subscription(sub)) => {
            let group = sub
                .group
                .as_ref()
                .map(|g| g.name.clone())
                .unwrap_or_default();
            let (cfg, policy) = b.group_config_and_retry_policy(&group);
            sub.fifo = Some(cfg.as_ref().is_some_and(|g| g.fifo));
            sub.receive_batch_size = Some(b.settings.max_receive_batch as i32);
            if sub.long_polling_timeout.is_none() {
                sub.long_polling_timeout = Some(duration(b.settings.max_long_polling_ms));
            }
            let attempts = cfg.map_or(16, |g| g.max_delivery_attempts);
            s.backoff_policy = Some(backoff_policy(attempts, policy.as_ref()));
        }
        None => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: &prost_types::Duration) -> (i64, i32) {
        (d.seconds, d.nanos)
    }

    #[test]
    fn a_group_without_a_policy_gets_rocketmq_levels_from_level_3() {
        let p = backoff_policy(16, None);
        assert_eq!(p.max_attempts, 16);
        let Some(pb::retry_policy::Strategy::CustomizedBackoff(c)) = p.strategy else {
            panic!("{p:?}");
        };
        assert_eq!(c.next.len(), 16);
        assert_eq!(secs(&c.next[0]), (10, 0));
        assert_eq!(secs(&c.next[15]), (7200, 0));
    }

    #[test]
    fn a_groups_policy_is_sent_as_rocketmqs_proxy_sends_it() {
        let p = backoff_policy(
            3,
            Some(&RetryPolicy::Customized {
                next_ms: vec![1_000, 2_500],
            }),
        );
        assert_eq!(p.max_attempts, 3);
        let Some(pb::retry_policy::Strategy::CustomizedBackoff(c)) = p.strategy else {
            panic!("{p:?}");
        };
        let next: Vec<_> = c.next.iter().map(secs).collect();
        assert_eq!(next, [(1, 0), (2, 500_000_000)]);
        let p = backoff_policy(
            5,
            Some(&RetryPolicy::Exponential {
                initial_ms: 1_500,
                max_ms: 60_000,
                multiplier: 3,
            }),
        );
        let Some(pb::retry_policy::Strategy::ExponentialBackoff(e)) = p.strategy else {
            panic!("{p:?}");
        };
        assert_eq!(secs(e.initial.as_ref().unwrap()), (1, 500_000_000));
        assert_eq!(secs(e.max.as_ref().unwrap()), (60, 0));
        assert_eq!(e.multiplier, 3.0);
        assert_eq!(backoff_policy(u32::MAX, None).max_attempts, i32::MAX);
    }
}
