//! The RocketMQ 5.x gRPC protocol adapter: converts protocol messages to the
//! broker's domain types and back, and maps failures to status codes. Sending,
//! consuming and their checks are the core's; what remains here besides
//! conversion is how a 5.x route names a group's members (`route`, from the name
//! servers' view) and passing consumption calls on to the leader (`service`,
//! `relay`). The 4.x remoting protocol is to sit beside it.
//!
//! - [`service`]: the MessagingService; calls that reach a follower are passed
//!   on to the leader (`relay` decides what the client is told).
//! - [`send`]: SendMessage; [`route`]: QueryRoute and QueryAssignment;
//!   [`consume`]: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
//!   ForwardMessageToDeadLetterQueue.
//! - [`message`]: 5.x messages to the broker's and back.
//! - [`status`]: a failure's 5.x status code.
//! - [`settings`]: the Settings a client is sent over Telemetry (a group's
//!   retry policy as its consumers' backoff).
//! - [`admin`]: the admin service (`ledgermq.admin`) `mqadmin` calls;
//!   [`audit`]: the replica audit's digests; [`progress`]: consumer progress;
//!   [`reset`]: rewinding a consumer group to a time; [`query`]: messages by
//!   key; [`raft_status`]: a node's view of its Raft group.
//! - [`server`]: both services on the client port.

pub mod acl_admin;
pub mod admin;
pub mod audit;
pub mod consume;
pub(crate) mod guard;
pub mod membership;
pub mod message;
pub mod metrics_layer;
pub mod ops;
pub mod progress;
pub mod query;
pub mod raft_status;
mod relay;
pub mod reset;
pub mod route;
pub mod send;
pub mod server;
pub mod service;
pub mod settings;
pub mod status;
pub mod transaction;

pub use status::ToStatus;
