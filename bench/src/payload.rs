//! The message body every benchmark sends, whatever the system: the send time and
//! the run's id in a 16-byte header, then filler up to the body size. Consumers read
//! the header to compute end-to-end latency and to tell this run's messages from
//! ones left over by an earlier run on the same topic or queue.

use std::time::{SystemTime, UNIX_EPOCH};

/// Bytes of the header: send time (µs since the Unix epoch, u64 LE), run id (u64 LE).
pub const HEADER_BYTES: usize = 16;

/// Checks a body size from the command line. Error: it is below [`HEADER_BYTES`]
/// (the summary would report a size that was never sent).
pub fn check_body_bytes(body_bytes: usize) -> Result<(), String> {
    if body_bytes < HEADER_BYTES {
        return Err(format!(
            "--body-bytes {body_bytes}: bodies carry a {HEADER_BYTES}-byte header, so at least {HEADER_BYTES}"
        ));
    }
    Ok(())
}

/// Microseconds since the Unix epoch, by the wall clock (producers and consumers of
/// one run share the machine, or need synchronised clocks for end-to-end latency).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A body of `len` bytes (at least [`HEADER_BYTES`]) stamped with the current time
/// and `run_id`.
pub fn make_body(len: usize, run_id: u64) -> Vec<u8> {
    let mut b = vec![b'x'; len.max(HEADER_BYTES)];
    b[..8].copy_from_slice(&now_micros().to_le_bytes());
    b[8..16].copy_from_slice(&run_id.to_le_bytes());
    b
}

/// The (send time µs, run id) of a body, if it is long enough to carry them.
pub fn read_header(body: &[u8]) -> Option<(u64, u64)> {
    if body.len() < HEADER_BYTES {
        return None;
    }
    let ts = u64::from_le_bytes(body[..8].try_into().ok()?);
    let run = u64::from_le_bytes(body[8..16].try_into().ok()?);
    Some((ts, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_short_bodies_grow() {
        let b = make_body(4, 42);
        assert_eq!(b.len(), HEADER_BYTES);
        let (ts, run) = read_header(&b).unwrap();
        assert_eq!(run, 42);
        assert!(ts > 0 && ts <= now_micros());
        assert_eq!(make_body(1024, 1).len(), 1024);
        assert!(read_header(&[0; 15]).is_none());
    }
}
