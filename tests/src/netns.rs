//! A network namespace of its own for a test, with its own hosts file: how a test
//! gives a cluster on 127.0.0.1-3 one DNS name without touching the machine's
//! `/etc/hosts`. `ip netns exec NAME cmd` bind-mounts `/etc/netns/NAME/hosts` over
//! `/etc/hosts` for `cmd`, and every address of 127.0.0.0/8 is on the namespace's
//! `lo`. Needs root and iproute2; [`NetNs::skip_reason`] says why a test cannot
//! run. The namespace and its `/etc/netns/NAME` folder are removed on drop (also
//! after a panic); [`NetNs::create`] first removes those a killed run left behind.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A network namespace with loopback up and its own hosts file.
pub struct NetNs {
    name: String,
}

/// Runs `ip ARGS`; error with its stderr if it fails.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("ip {args:?}"))?;
    if !out.status.success() {
        bail!(
            "ip {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn etc_dir(name: &str) -> PathBuf {
    PathBuf::from("/etc/netns").join(name)
}

/// The hosts file text: `localhost`, then each name on every address given, one
/// line per address in the order given (grpc-core tries them in that order).
pub fn hosts_text(names: &[(&str, &[&str])]) -> String {
    let mut s = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for (name, addrs) in names {
        for a in *addrs {
            s.push_str(&format!("{a} {name}\n"));
        }
    }
    s
}

/// This process's effective user id as `/proc/self/status` gives it ("0" for
/// root; empty if unreadable).
pub fn effective_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("")
        .to_owned()
}

impl NetNs {
    /// Why this process cannot make namespaces (not root, no `ip`), or `None`.
    pub fn skip_reason() -> Option<String> {
        let euid = effective_uid();
        if euid != "0" {
            return Some(format!(
                "needs root for a network namespace (effective uid {euid:?})"
            ));
        }
        match Command::new("ip").arg("-V").output() {
            Ok(o) if o.status.success() => None,
            _ => Some("needs iproute2 (`ip`) for a network namespace".into()),
        }
    }

    /// Creates namespace `{prefix}{pid}-{tag}` with `lo` up and the hosts file of
    /// [`hosts_text`]`(names)`. First removes namespaces `{prefix}{pid}-...` whose
    /// process is gone. Error: the failing command (not root, no iproute2).
    pub fn create(prefix: &str, tag: &str, names: &[(&str, &[&str])]) -> Result<Self> {
        remove_orphans(prefix);
        let name = format!("{prefix}{}-{tag}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        ns.set_hosts(names)?;
        Ok(ns)
    }

    /// The namespace's name (under `/var/run/netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rewrites the namespace's hosts file (processes started after this see it).
    pub fn set_hosts(&self, names: &[(&str, &[&str])]) -> Result<()> {
        let dir = etc_dir(&self.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("hosts"), hosts_text(names))?;
        Ok(())
    }

    /// A command running `program` inside the namespace, with its hosts file.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("could not remove namespace {}: {e}", self.name);
        }
        let _ = std::fs::remove_dir_all(etc_dir(&self.name));
    }
}

/// Removes namespaces (and their `/etc/netns` folders) named `{prefix}{pid}-...`
/// whose process `pid` is gone.
fn remove_orphans(prefix: &str) {
    let mut names: Vec<String> =
        ledgermq_jepsen::hosts::namespaces_with_prefix(prefix).unwrap_or_default();
    if let Ok(dir) = std::fs::read_dir("/etc/netns") {
        names.extend(
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix)),
        );
    }
    for ns in names {
        let pid = ns[prefix.len()..].split('-').next().unwrap_or("");
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &ns]);
            let _ = std::fs::remove_dir_all(etc_dir(&ns));
        }
    }
}
