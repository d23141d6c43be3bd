//! A consumer group's retry policy: how long a message a consumer failed stays
//! invisible before each redelivery (RocketMQ 5's `GroupRetryPolicy`, set with
//! `mqadmin updateSubGroup -p JSON` and sent to 5.x push consumers as the
//! `backoff_policy` of their Settings). A group without one gets the broker's
//! default, RocketMQ 4.x's delay levels from level 3 (10 s, 30 s, 1 min, ...),
//! which this broker has always sent; RocketMQ 5's proxy sends its CUSTOMIZED
//! default instead (1 s, 5 s, 10 s, ...), which `-p '{}'` gives here.
//!
//! The JSON is RocketMQ's (`remoting/.../subscription/GroupRetryPolicy.java`,
//! `ExponentialRetryPolicy.java`, `CustomizedRetryPolicy.java`):
//! `{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":5000,"max":7200000,"multiplier":2}}`
//! or `{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,5000,10000]}}`,
//! durations in ms. As there, a missing `type` is CUSTOMIZED, a missing policy
//! object or field takes RocketMQ's default, and unknown fields are ignored.

use serde::{Deserialize, Serialize};

use crate::error::MetaError;

/// The delays a policy may give, ms: what ChangeInvisibleDuration accepts (1 s
/// to 12 h), since a push consumer nacks with them.
pub const RETRY_DELAY_RANGE_MS: (u64, u64) = (1_000, 12 * 3_600_000);

/// The most delays a CUSTOMIZED policy may list (RocketMQ's default lists 18).
pub const MAX_CUSTOMIZED_DELAYS: usize = 64;

/// The largest exponential multiplier accepted.
pub const MAX_MULTIPLIER: u64 = 1_000;

/// The longest policy JSON accepted, bytes.
pub const MAX_POLICY_JSON_BYTES: usize = 4_096;

/// RocketMQ's `CustomizedRetryPolicy` default: its 18 delay levels, ms.
pub const ROCKETMQ_DELAY_LEVELS_MS: [u64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

/// A consumer group's retry policy, stored as postcard in its metadata row, in
/// format-2 snapshots and in `Command::UpdateGroupWithRetryPolicy`: variants and
/// fields are never removed or reordered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryPolicy {
    /// The n-th redelivery (n from 0) waits `min(max_ms, initial_ms ×
    /// multiplier^n)`.
    Exponential {
        /// First delay, ms.
        initial_ms: u64,
        /// Longest delay, ms.
        max_ms: u64,
        /// Growth per redelivery (at least 1).
        multiplier: u64,
    },
    /// The delays in order, ms; the last one repeats. 5.x clients take the n-th
    /// redelivery's delay at index n (RocketMQ's proxy sends them as they are).
    Customized {
        /// Delays, ms (1 to [`MAX_CUSTOMIZED_DELAYS`] of them).
        next_ms: Vec<u64>,
    },
}

impl RetryPolicy {
    /// Reads RocketMQ's `GroupRetryPolicy` JSON (module docs). Errors:
    /// `RetryPolicyJson` when it is not that JSON (or longer than
    /// [`MAX_POLICY_JSON_BYTES`]), `RetryPolicyInvalid` when a delay is outside
    /// [`RETRY_DELAY_RANGE_MS`], `max` is below `initial`, the multiplier is 0 or
    /// over [`MAX_MULTIPLIER`], or `next` is empty or longer than
    /// [`MAX_CUSTOMIZED_DELAYS`].
    pub fn from_rocketmq_json(json: &str) -> Result<RetryPolicy, MetaError> {
        if json.len() > MAX_POLICY_JSON_BYTES {
            return Err(MetaError::RetryPolicyJson(format!(
                "{} bytes, more than {MAX_POLICY_JSON_BYTES}",
                json.len()
            )));
        }
        let raw: RawGroupRetryPolicy =
            serde_json::from_str(json).map_err(|e| MetaError::RetryPolicyJson(e.to_string()))?;
        let kind = raw.kind.as_deref().unwrap_or("CUSTOMIZED");
        let policy = if kind.eq_ignore_ascii_case("EXPONENTIAL") {
            let e = raw.exponential_retry_policy.unwrap_or_default();
            RetryPolicy::Exponential {
                initial_ms: e.initial.unwrap_or(5_000),
                max_ms: e.max.unwrap_or(7_200_000),
                multiplier: e.multiplier.unwrap_or(2),
            }
        } else if kind.eq_ignore_ascii_case("CUSTOMIZED") {
            RetryPolicy::Customized {
                next_ms: raw
                    .customized_retry_policy
                    .and_then(|c| c.next)
                    .unwrap_or_else(|| ROCKETMQ_DELAY_LEVELS_MS.to_vec()),
            }
        } else {
            return Err(MetaError::RetryPolicyJson(format!(
                "type {kind:?} is neither EXPONENTIAL nor CUSTOMIZED"
            )));
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Checks the bounds [`RetryPolicy::from_rocketmq_json`] names. Errors:
    /// `RetryPolicyInvalid`.
    pub fn validate(&self) -> Result<(), MetaError> {
        let (lo, hi) = RETRY_DELAY_RANGE_MS;
        let in_range = |ms: u64| (lo..=hi).contains(&ms);
        let bad = |why: String| Err(MetaError::RetryPolicyInvalid(why));
        match self {
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
            } => {
                if !in_range(*initial_ms) || !in_range(*max_ms) {
                    return bad(format!(
                        "initial {initial_ms} ms and max {max_ms} ms must be within {lo}..={hi} ms"
                    ));
                }
                if max_ms < initial_ms {
                    return bad(format!("max {max_ms} ms is below initial {initial_ms} ms"));
                }
                if !(1..=MAX_MULTIPLIER).contains(multiplier) {
                    return bad(format!(
                        "multiplier {multiplier} must be within 1..={MAX_MULTIPLIER}"
                    ));
                }
            }
            RetryPolicy::Customized { next_ms } => {
                if next_ms.is_empty() || next_ms.len() > MAX_CUSTOMIZED_DELAYS {
                    return bad(format!(
                        "next lists {} delays; it must list 1 to {MAX_CUSTOMIZED_DELAYS}",
                        next_ms.len()
                    ));
                }
                if let Some(ms) = next_ms.iter().find(|&&ms| !in_range(ms)) {
                    return bad(format!("delay {ms} ms is not within {lo}..={hi} ms"));
                }
            }
        }
        Ok(())
    }
}

/// RocketMQ's `GroupRetryPolicy` as fastjson writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawGroupRetryPolicy {
    #[serde(rename = "type")]
    kind: Option<String>,
    exponential_retry_policy: Option<RawExponential>,
    customized_retry_policy: Option<RawCustomized>,
}

#[derive(Deserialize, Default)]
struct RawExponential {
    initial: Option<u64>,
    max: Option<u64>,
    multiplier: Option<u64>,
}

#[derive(Deserialize)]
struct RawCustomized {
    next: Option<Vec<u64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rocketmq_json_of_both_types() {
        let e = RetryPolicy::from_rocketmq_json(
            r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":1000,"max":8000,"multiplier":3}}"#,
        )
        .unwrap();
        assert_eq!(
            e,
            RetryPolicy::Exponential {
                initial_ms: 1000,
                max_ms: 8000,
                multiplier: 3
            }
        );
        let c = RetryPolicy::from_rocketmq_json(
            r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,2000,3000]},"other":1}"#,
        )
        .unwrap();
        assert_eq!(
            c,
            RetryPolicy::Customized {
                next_ms: vec![1000, 2000, 3000]
            }
        );
    }

    #[test]
    fn missing_parts_take_rocketmq_defaults() {
        assert_eq!(
            RetryPolicy::from_rocketmq_json("{}").unwrap(),
            RetryPolicy::Customized {
                next_ms: ROCKETMQ_DELAY_LEVELS_MS.to_vec()
            }
        );
        assert_eq!(
            RetryPolicy::from_rocketmq_json(r#"{"type":"exponential"}"#).unwrap(),
            RetryPolicy::Exponential {
                initial_ms: 5_000,
                max_ms: 7_200_000,
                multiplier: 2
            }
        );
        assert_eq!(
            RetryPolicy::from_rocketmq_json(
                r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"max":60000}}"#
            )
            .unwrap(),
            RetryPolicy::Exponential {
                initial_ms: 5_000,
                max_ms: 60_000,
                multiplier: 2
            }
        );
    }

    #[test]
    fn bad_json_and_bad_values_are_refused_by_kind() {
        for json in [
            "not json",
            r#"{"type":"LINEAR"}"#,
            r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[-1]}}"#,
            r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":"1000"}}"#,
        ] {
            assert!(
                matches!(
                    RetryPolicy::from_rocketmq_json(json),
                    Err(MetaError::RetryPolicyJson(_))
                ),
                "{json}"
            );
        }
        let long = format!(r#"{{"type":"CUSTOMIZED","x":"{}"}}"#, "a".repeat(5000));
        assert!(matches!(
            RetryPolicy::from_rocketmq_json(&long),
            Err(MetaError::RetryPolicyJson(_))
        ));
        let too_many = format!(
            r#"{{"customizedRetryPolicy":{{"next":[{}]}}}}"#,
            vec!["1000"; MAX_CUSTOMIZED_DELAYS + 1].join(",")
        );
        for json in [
            r#"{"customizedRetryPolicy":{"next":[]}}"#,
            r#"{"customizedRetryPolicy":{"next":[1000,999]}}"#,
            r#"{"customizedRetryPolicy":{"next":[43200001]}}"#,
            too_many.as_str(),
            r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":9000,"max":8000}}"#,
            r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"multiplier":0}}"#,
            r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"multiplier":1001}}"#,
            r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":10}}"#,
        ] {
            assert!(
                matches!(
                    RetryPolicy::from_rocketmq_json(json),
                    Err(MetaError::RetryPolicyInvalid(_))
                ),
                "{json}"
            );
        }
    }
}
