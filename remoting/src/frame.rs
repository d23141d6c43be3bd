//! Frames: `[length: i32 BE][header length and serialize type: i32 BE][header]
//! [body]`, where `length` counts everything after itself (RocketMQ's
//! `NettyDecoder`, a `LengthFieldBasedFrameDecoder(maxFrameLength, 0, 4, 0, 4)`).

use crate::error::RemotingError;

/// RocketMQ's default largest frame (`com.rocketmq.remoting.frameMaxLength`).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;

/// Splits the first frame off `buf`: `Ok(None)` while `buf` holds less than a
/// whole frame, else the frame's bytes after the length field (what
/// [`crate::RemotingCommand::decode`] reads) and how many bytes of `buf` it
/// took. Checks the length field before anything is buffered for it, so a
/// reader never holds more than `max_frame_bytes` for one frame. Error:
/// `FrameLength` (a frame over `max_frame_bytes` with its length field, as
/// Netty's decoder counts it, or a length under 4: no room for the header
/// length); the connection cannot be resynchronised after it.
pub fn split_frame(
    buf: &[u8],
    max_frame_bytes: usize,
) -> Result<Option<(&[u8], usize)>, RemotingError> {
    let Some(len) = buf.get(..4) else {
        return Ok(None);
    };
    let length = i32::from_be_bytes(len.try_into().expect("4 bytes"));
    if length < 4 || length as usize + 4 > max_frame_bytes {
        return Err(RemotingError::FrameLength {
            length_bytes: length.into(),
            max_bytes: max_frame_bytes,
        });
    }
    let total = 4 + length as usize;
    match buf.get(4..total) {
        Some(frame) => Ok(Some((frame, total))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_once_whole_and_bad_lengths_are_errors() {
        let mut buf = 6i32.to_be_bytes().to_vec();
        buf.extend_from_slice(&[0, 0, 0, 2, b'{', b'}', 9, 9]);
        assert_eq!(split_frame(&buf[..9], 64), Ok(None));
        assert_eq!(split_frame(&buf[..2], 64), Ok(None));
        let (frame, used) = split_frame(&buf, 64).unwrap().unwrap();
        assert_eq!((frame, used), (&buf[4..10], 10));
        // 60 bytes after the length field make a 64-byte frame: the limit.
        assert_eq!(split_frame(&60i32.to_be_bytes(), 64), Ok(None));
        assert_eq!(split_frame(&4i32.to_be_bytes(), 64), Ok(None));
        for bad in [3i32, -1, i32::MIN, 61] {
            assert!(matches!(
                split_frame(&bad.to_be_bytes(), 64),
                Err(RemotingError::FrameLength { .. })
            ));
        }
    }
}
