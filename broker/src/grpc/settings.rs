//! The Settings a client is sent over Telemetry: the broker's values merged
//! into what the client announced, as RocketMQ's proxy does
//! (`GrpcClientSettingsManager`): the max body size for producers; for
//! consumers the group's FIFO flag, batch size, long-polling time and retry
//! policy.

use ledgermq_meta::RetryPolicy;

use crate::broker::Broker;
use crate::grpc::message::duration;
use crate::pb;

/// RocketMQ's retry delays for a consumer group's redeliveries (delay levels
/// 3+): the backoff of a group given no retry policy.
const RETRY_DELAYS_S: [i64; 16] = [
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
];

fn ms_duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The `backoff_policy` a consumer of a group is sent: at most
/// `max_delivery_attempts` deliveries, and the group's retry policy as RocketMQ's
/// proxy sends it (`GrpcClientSettingsManager.mergeSubscriptionData`: EXPONENTIAL
/// as ExponentialBackoff, CUSTOMIZED as CustomizedBackoff with its delays as
/// they are), or [`RETRY_DELAYS_S`] for a group without one. No I/O.
pub fn backoff_policy(max_delivery_attempts: u32, policy: Option<&RetryPolicy>) -> pb::RetryPolicy {
    let strategy = match policy {
        None => pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
            next: RETRY_DELAYS_S
                .iter()
                .map(|&secs| prost_types::Duration {
                    seconds: secs,
                    nanos: 0,
                })
                .collect(),
        }),
        Some(RetryPolicy::Customized { next_ms }) => {
            pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
                next: next_ms.iter().map(|&ms| ms_duration(ms)).collect(),
            })
        }
        Some(RetryPolicy::Exponential {
            initial_ms,
            max_ms,
            multiplier,
        }) => pb::retry_policy::Strategy::ExponentialBackoff(pb::ExponentialBackoff {
            initial: Some(ms_duration(*initial_ms)),
            max: Some(ms_duration(*max_ms)),
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
