//! Server processes of the peers: found on disk, started in their own process
//! group with output to a log file, and killed with their whole group.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

/// Finds `name` on `PATH` or in `extra_dirs` (searched first, in order). Errors
/// name the Debian package that provides it.
pub fn find_binary(name: &str, extra_dirs: &[&str], apt_package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = extra_dirs.iter().map(PathBuf::from).collect();
    dirs.extend(std::env::split_paths(&path));
    if let Some(p) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
        return Ok(p);
    }
    bail!(
        "{name} not found in {extra_dirs:?} nor on PATH: install Debian's package with \
         `apt-get install -y {apt_package}`"
    )
}

/// One server process (and whatever it started in its process group).
pub struct PeerProc {
    /// Name for messages (`nats n1`).
    pub name: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    child: Option<Child>,
}

impl PeerProc {
    /// Starts `cmd` in a new process group, stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Self {
            name: name.to_owned(),
            log: log.to_path_buf(),
            child: Some(child),
        })
    }

    /// The process id, which is also its process group's id; None once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILLs the process group and reaps the process.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the negated pid of the group this child leads.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        self.stop();
    }
}
