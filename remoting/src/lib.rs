//! The RocketMQ 4.x remoting protocol (Apache RocketMQ's `remoting` module:
//! `RemotingCommand`, `RocketMQSerializable`, `NettyDecoder`; facts in
//! `../shared/docs/rocketmq-remoting.md` §1): what 4.x clients (Java
//! `DefaultMQProducer`, the C++ core of PyPI `rocketmq`, crates.io
//! `rocketmq-client-rust`) send to name servers and brokers. Plain functions
//! over bytes, no I/O: a server reads a frame's bytes and hands them here.
//!
//! - [`frame`]: the length-prefixed frame, split from a byte stream with a
//!   bound on its length.
//! - [`command`]: a [`RemotingCommand`] (code, language, version, opaque,
//!   flag, remark, ext fields, body) in either header serialization, JSON or
//!   ROCKETMQ's binary one, and back in the one the request used.
//! - [`codes`]: request and response codes.
//! - [`acl`]: the 4.x ACL signature (`AccessKey`, `Signature` ext fields).
//! - [`message`]: messages on the wire (a pull answer's stored-message layout,
//!   a batch send's body, properties, the offset message id).
//! - `conn` (feature `io`, the one module with I/O): a server-side connection
//!   over tokio.

pub mod acl;
pub mod codes;
pub mod command;
#[cfg(feature = "io")]
pub mod conn;
pub mod error;
pub mod frame;
pub mod message;

pub use command::{LanguageCode, RemotingCommand, SerializeType};
pub use error::RemotingError;
pub use frame::{split_frame, DEFAULT_MAX_FRAME_BYTES};
