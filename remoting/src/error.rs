//! The one error type of the remoting codec.

/// Why bytes are not a remoting frame or command. A server answers with an
/// error response where it can (it knows the request's opaque) or closes the
/// connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RemotingError {
    /// The length field claims more than the largest frame accepted
    /// (RocketMQ's `frameMaxLength`, 16 MiB by default), or less than the
    /// 4-byte header length field it must hold.
    #[error("frame length {length_bytes} outside 4..={max_bytes} bytes")]
    FrameLength {
        /// What the length field says, bytes.
        length_bytes: i64,
        /// The largest frame accepted, bytes.
        max_bytes: usize,
    },
    /// The header length is longer than the frame holds.
    #[error("header of {header_bytes} bytes in a frame of {frame_bytes}")]
    HeaderLength {
        /// What the header length says, bytes.
        header_bytes: usize,
        /// The frame's length after its length field, bytes.
        frame_bytes: usize,
    },
    /// The serialize type byte is neither JSON (0) nor ROCKETMQ (1).
    #[error("unknown serialize type {0}")]
    SerializeType(u8),
    /// A JSON header that does not parse as a `RemotingCommand`.
    #[error("JSON header: {0}")]
    Json(String),
    /// A ROCKETMQ binary header cut short, or whose lengths overrun it.
    #[error("ROCKETMQ header: {0}")]
    Binary(&'static str),
    /// A message body (a batch send's) whose lengths overrun it or disagree.
    #[error("message: {0}")]
    Message(&'static str),
    /// A command too large to encode (a header over 16 MiB, a field over its
    /// length field's range).
    #[error("too large to encode: {0}")]
    TooLarge(&'static str),
}
