//! The metadata crate's errors.

/// What reading operator input for the metadata can refuse. The rules that
/// apply committed commands never fail.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// Not RocketMQ's `GroupRetryPolicy` JSON (or too long to read).
    #[error("retry policy is not RocketMQ's GroupRetryPolicy JSON: {0}")]
    RetryPolicyJson(String),
    /// A retry policy whose values are out of bounds.
    #[error("retry policy: {0}")]
    RetryPolicyInvalid(String),
}
