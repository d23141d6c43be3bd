//! Request and response codes (Apache RocketMQ's `RequestCode`, `ResponseCode`
//! and `RemotingSysResponseCode`; `../shared/docs/rocketmq-remoting.md` §1.1-1.2).

/// Request codes this project reads or sends.
pub mod request {
    /// SEND_MESSAGE: long-name header (the C++ core, PyPI `rocketmq`).
    pub const SEND_MESSAGE: i32 = 10;
    /// PULL_MESSAGE.
    pub const PULL_MESSAGE: i32 = 11;
    /// QUERY_MESSAGE.
    pub const QUERY_MESSAGE: i32 = 12;
    /// QUERY_CONSUMER_OFFSET.
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    /// UPDATE_CONSUMER_OFFSET.
    pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
    /// SEARCH_OFFSET_BY_TIMESTAMP.
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    /// GET_MAX_OFFSET.
    pub const GET_MAX_OFFSET: i32 = 30;
    /// GET_MIN_OFFSET.
    pub const GET_MIN_OFFSET: i32 = 31;
    /// GET_EARLIEST_MSG_STORETIME.
    pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
    /// VIEW_MESSAGE_BY_ID.
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    /// HEART_BEAT.
    pub const HEART_BEAT: i32 = 34;
    /// UNREGISTER_CLIENT.
    pub const UNREGISTER_CLIENT: i32 = 35;
    /// CONSUMER_SEND_MSG_BACK.
    pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
    /// END_TRANSACTION (oneway).
    pub const END_TRANSACTION: i32 = 37;
    /// GET_CONSUMER_LIST_BY_GROUP.
    pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
    /// CHECK_TRANSACTION_STATE (broker to producer, oneway).
    pub const CHECK_TRANSACTION_STATE: i32 = 39;
    /// NOTIFY_CONSUMER_IDS_CHANGED (broker to consumer, oneway).
    pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;
    /// LOCK_BATCH_MQ.
    pub const LOCK_BATCH_MQ: i32 = 41;
    /// UNLOCK_BATCH_MQ.
    pub const UNLOCK_BATCH_MQ: i32 = 42;
    /// GET_KV_CONFIG (name server).
    pub const GET_KV_CONFIG: i32 = 101;
    /// GET_ROUTEINFO_BY_TOPIC (name server).
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    /// GET_BROKER_CLUSTER_INFO (name server).
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    /// GET_ALL_TOPIC_LIST_FROM_NAMESERVER (name server).
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    /// SEND_MESSAGE_V2: short-name header (Java's default).
    pub const SEND_MESSAGE_V2: i32 = 310;
    /// SEND_BATCH_MESSAGE.
    pub const SEND_BATCH_MESSAGE: i32 = 320;
}

/// Response codes.
pub mod response {
    /// SUCCESS.
    pub const SUCCESS: i32 = 0;
    /// SYSTEM_ERROR.
    pub const SYSTEM_ERROR: i32 = 1;
    /// SYSTEM_BUSY.
    pub const SYSTEM_BUSY: i32 = 2;
    /// REQUEST_CODE_NOT_SUPPORTED.
    pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
    /// FLUSH_DISK_TIMEOUT.
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    /// MESSAGE_ILLEGAL.
    pub const MESSAGE_ILLEGAL: i32 = 13;
    /// SERVICE_NOT_AVAILABLE.
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    /// NO_PERMISSION.
    pub const NO_PERMISSION: i32 = 16;
    /// TOPIC_NOT_EXIST.
    pub const TOPIC_NOT_EXIST: i32 = 17;
    /// PULL_NOT_FOUND: no new message.
    pub const PULL_NOT_FOUND: i32 = 19;
    /// PULL_RETRY_IMMEDIATELY: nothing matched the filter.
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    /// PULL_OFFSET_MOVED: the offset is out of range.
    pub const PULL_OFFSET_MOVED: i32 = 21;
    /// QUERY_NOT_FOUND.
    pub const QUERY_NOT_FOUND: i32 = 22;
    /// SUBSCRIPTION_GROUP_NOT_EXIST.
    pub const SUBSCRIPTION_GROUP_NOT_EXIST: i32 = 26;
}
