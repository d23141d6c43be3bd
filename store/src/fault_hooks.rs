//! Fault-injection hooks for tests run from outside the process (the jepsen
//! harness's slow disk and power loss): every fsync of the store's data first
//! sleeps for a delay read from a file; the machine's boot id can be read from a
//! file, so that a simulated power loss is also a reboot ([`boot_id`]).
//!
//! Compiled into every build (the harness runs release binaries too) but inert
//! unless the environment variable [`FSYNC_DELAY_FILE_ENV`] is set when the process
//! first fsyncs: then the file it names is read again at most every
//! [`REREAD_MS`] ms. Unset, a call costs one initialized `OnceLock` read.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable naming the delay file. The file holds `MIN MAX` (ms):
/// each fsync then sleeps a delay in `[MIN, MAX]`; one number `MS` means `MS MS`.
/// A missing, empty or unreadable file means no delay.
pub const FSYNC_DELAY_FILE_ENV: &str = "LEDGERMQ_FSYNC_DELAY_FILE";

/// The environment variable naming a file that stands for the kernel's boot id
/// (the jepsen harness writes a new one when a node "loses power").
pub const BOOT_ID_FILE_ENV: &str = "LEDGERMQ_BOOT_ID_FILE";

/// Where Linux tells the boot id, new at every boot.
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This machine's boot id (trimmed text): the file named by [`BOOT_ID_FILE_ENV`]
/// if set, else the kernel's. None when it cannot be read.
pub fn boot_id() -> Option<String> {
    let path = std::env::var_os(BOOT_ID_FILE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(KERNEL_BOOT_ID));
    let id = std::fs::read_to_string(path).ok()?.trim().to_owned();
    (!id.is_empty()).then_some(id)
}

/// How often the delay file is read again, ms.
pub const REREAD_MS: u64 = 100;

/// The delay file and what was last read from it.
struct FsyncDelay {
    path: PathBuf,
    since: Instant,
    /// When the file was last read, ms after `since` plus one (0: never).
    read_at_ms: AtomicU64,
    /// The delay range last read: MIN in the high 32 bits, MAX in the low ones (ms).
    range: AtomicU64,
    /// Spreads the delays over the range (a counter: no randomness needed).
    calls: AtomicU64,
}

static FSYNC_DELAY: OnceLock<Option<FsyncDelay>> = OnceLock::new();

/// Parses a delay file's text: `MIN MAX` or `MS`, in ms; `None` if malformed.
pub fn parse_delay(text: &str) -> Option<(u32, u32)> {
    let mut nums = text.split_whitespace().map(str::parse::<u32>);
    let min = nums.next()?.ok()?;
    let max = match nums.next() {
        Some(n) => n.ok()?,
        None => min,
    };
    (nums.next().is_none() && min <= max).then_some((min, max))
}

impl FsyncDelay {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            since: Instant::now(),
            read_at_ms: AtomicU64::new(0),
            range: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// The delay for this fsync, ms (0: none).
    fn next_ms(&self) -> u64 {
        let now = self.since.elapsed().as_millis() as u64 + 1;
        let read_at = self.read_at_ms.load(Ordering::Relaxed);
        if read_at == 0 || now.saturating_sub(read_at) >= REREAD_MS {
            self.read_at_ms.store(now, Ordering::Relaxed);
            let (min, max) = std::fs::read_to_string(&self.path)
                .ok()
                .and_then(|t| parse_delay(&t))
                .unwrap_or((0, 0));
            self.range
                .store((min as u64) << 32 | max as u64, Ordering::Relaxed);
        }
        let range = self.range.load(Ordering::Relaxed);
        let (min, max) = (range >> 32, range & 0xffff_ffff);
        let k = self.calls.fetch_add(1, Ordering::Relaxed);
        // A multiplicative hash of the call count walks the range evenly.
        min + k.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (max - min + 1)
    }
}

/// Sleeps for the configured fsync delay, if [`FSYNC_DELAY_FILE_ENV`] names a file
/// that asks for one. Called right before the store fsyncs (or msyncs) data.
pub fn before_fsync() {
    let hook = FSYNC_DELAY.get_or_init(|| {
        std::env::var_os(FSYNC_DELAY_FILE_ENV).map(|p| FsyncDelay::new(PathBuf::from(p)))
    });
    if let Some(h) = hook {
        let ms = h.next_ms();
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_files_parse() {
        assert_eq!(parse_delay("50 200\n"), Some((50, 200)));
        assert_eq!(parse_delay("80"), Some((80, 80)));
        assert_eq!(parse_delay(""), None);
        assert_eq!(parse_delay("200 50"), None);
        assert_eq!(parse_delay("1 2 3"), None);
        assert_eq!(parse_delay("fast"), None);
    }

    #[test]
    fn delays_follow_the_file_and_stay_in_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("delay");
        let hook = FsyncDelay::new(path.clone());
        assert_eq!(hook.next_ms(), 0, "no file, no delay");
        std::fs::write(&path, "50 200").unwrap();
        std::thread::sleep(Duration::from_millis(REREAD_MS + 10));
        let delays: Vec<u64> = (0..100).map(|_| hook.next_ms()).collect();
        assert!(delays.iter().all(|d| (50..=200).contains(d)), "{delays:?}");
        assert!(
            delays.iter().any(|&d| d < 100) && delays.iter().any(|&d| d > 150),
            "spread over the range: {delays:?}"
        );
        std::fs::remove_file(&path).unwrap();
        std::thread::sleep(Duration::from_millis(REREAD_MS + 10));
        assert_eq!(hook.next_ms(), 0, "file removed, delay gone");
    }
}
