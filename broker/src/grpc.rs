//! The RocketMQ 5.x gRPC protocol adapter: converts protocol messages to the
//! broker's domain types and back, and maps failures to status codes. It holds no
//! broker rules; a second protocol sits beside it.
//!
//! - [`service`]: the MessagingService; calls that reach a follower are passed
//!   on to the leader ([`relay`] decides what the client is told).
//! - [`send`]: SendMessage; [`route`]: QueryRoute and QueryAssignment;
//!   [`consume`]: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
//!   ForwardMessageToDeadLetterQueue.
//! - [`message`]: 5.x messages to the broker's and back.
//! - [`status`]: a failure's 5.x status code.
//! - [`admin`]: the admin service (`ledgermq.admin`) `mqadmin` calls.
//! - [`server`]: both services on the client port.

pub mod admin;
pub mod consume;
pub mod message;
mod relay;
pub mod route;
pub mod send;
pub mod server;
pub mod service;
pub mod status;

pub use status::ToStatus;
