//! Free loopback ports, and waiting until something listens on one.

use std::time::{Duration, Instant};

use crate::KitError;

/// First port handed out: the low end of the range [`free_port`] uses.
const LOW_PORT: u16 = 20_000;
/// Ports at or above this are not handed out: Linux's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768-60999) starts just above.
const HIGH_PORT: u16 = 32_000;

/// A free loopback port below Linux's ephemeral range (32768-60999), so outgoing
/// connections of other tests cannot take it between this check and the bind by
/// the process it is meant for (binding `:0` hands out ephemeral ports, which a
/// concurrent test's outgoing connection may take meanwhile). Ports are handed out
/// in turn from a start point that depends on the process id, so concurrent test
/// processes mostly use different ports; a port something already holds is
/// skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Ports handed out so far by this process (wraps around the range).
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    let start = (std::process::id() % 600) * 20;
    loop {
        let p = nth_port(start, TAKEN.fetch_add(1, Ordering::Relaxed));
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// The `n`th port of a process whose ports start `start` into the range: always
/// within `LOW_PORT..HIGH_PORT`, wrapping around it.
fn nth_port(start: u32, n: u32) -> u16 {
    let span = u32::from(HIGH_PORT - LOW_PORT);
    LOW_PORT + ((start % span + n % span) % span) as u16
}

/// Waits (polling every 20 ms, blocking the thread) until something accepts a TCP
/// connection on `addr` (`host:port`). Error: [`KitError::NotListening`] after
/// `timeout`.
pub fn wait_listening(addr: &str, timeout: Duration) -> Result<(), KitError> {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(KitError::NotListening {
                addr: addr.to_owned(),
                waited_ms: timeout.as_millis(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port was handed out twice");
        for p in ports {
            assert!((LOW_PORT..HIGH_PORT).contains(&p), "{p}");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }

    #[test]
    fn ports_wrap_around_the_range() {
        assert_eq!(nth_port(0, 0), LOW_PORT);
        assert_eq!(nth_port(20, 1), LOW_PORT + 21);
        let span = u32::from(HIGH_PORT - LOW_PORT);
        assert_eq!(nth_port(0, span), LOW_PORT);
        for n in [span - 1, 65_535, 65_536, u32::MAX] {
            assert!((LOW_PORT..HIGH_PORT).contains(&nth_port(11_980, n)), "{n}");
        }
    }

    #[test]
    fn waiting_for_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        wait_listening(&addr, Duration::from_secs(5)).unwrap();
        drop(l);
        let err = wait_listening(&addr, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, KitError::NotListening { .. }), "{err}");
    }
}
