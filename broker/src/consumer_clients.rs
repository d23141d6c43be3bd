//! The consumers connected to this node, by consumer group, for `mqadmin
//! consumerConnection`: 5.x clients as their receive and heartbeat calls
//! arrive here (on the node the client calls, not on a leader a call is passed
//! on to), 4.x clients as their HEART_BEAT arrives (until UNREGISTER_CLIENT or
//! their connection closes). An entry not refreshed for [`CLIENT_EXPIRY`] is
//! dropped (RocketMQ's `channelExpiredTimeout`). Bounded: at most
//! [`MAX_GROUPS`] groups and [`MAX_CLIENTS_PER_GROUP`] clients each; past
//! them, new ones are not recorded (this is a view, not a decision).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A consumer not heard from for this long is dropped.
pub const CLIENT_EXPIRY: Duration = Duration::from_secs(120);
/// Most consumer groups recorded.
pub const MAX_GROUPS: usize = 4096;
/// Most clients recorded per group.
pub const MAX_CLIENTS_PER_GROUP: usize = 4096;
/// Longest client id, language or version string kept (longer ones are cut).
const MAX_TEXT_BYTES: usize = 255;

/// What a consumer said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// `gRPC 5.x` or `remoting 4.x`.
    pub protocol: &'static str,
    /// The client's language as it names it (`JAVA`, `CPP`, `PYTHON`, ...).
    pub language: String,
    /// The client's version, if it says.
    pub version: String,
    /// The address its connection comes from.
    pub addr: String,
    /// The remoting connection (4.x), so its close forgets it.
    pub conn_id: Option<u64>,
}

/// One consumer as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The client id.
    pub client_id: String,
    /// What it said.
    pub info: ClientInfo,
    /// Since it was last heard from.
    pub idle: Duration,
}

#[derive(Default)]
struct Inner {
    /// group → client id → (info, last heard).
    groups: HashMap<String, HashMap<String, (ClientInfo, Instant)>>,
}

/// The registry (see the module doc); cheap to share behind the broker.
#[derive(Default)]
pub struct ConsumerClients {
    inner: Mutex<Inner>,
}

fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_TEXT_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl ConsumerClients {
    /// Records that `client_id` of `group` was heard from at `now`.
    pub fn seen_at(&self, group: &str, client_id: &str, mut info: ClientInfo, now: Instant) {
        if group.is_empty() || client_id.is_empty() {
            return;
        }
        let (group, client_id) = (cut(group), cut(client_id));
        let (group, client_id) = (group.as_str(), client_id.as_str());
        info.language = cut(&info.language);
        info.version = cut(&info.version);
        let mut inner = self.inner.lock().unwrap();
        if !inner.groups.contains_key(group) {
            if inner.groups.len() >= MAX_GROUPS {
                prune(&mut inner, now);
                if inner.groups.len() >= MAX_GROUPS {
                    return;
                }
            }
            inner.groups.insert(group.to_owned(), HashMap::new());
        }
        let Some(clients) = inner.groups.get_mut(group) else {
            return;
        };
        if !clients.contains_key(client_id) && clients.len() >= MAX_CLIENTS_PER_GROUP {
            clients.retain(|_, (_, at)| now.saturating_duration_since(*at) <= CLIENT_EXPIRY);
            if clients.len() >= MAX_CLIENTS_PER_GROUP {
                return;
            }
        }
        clients.insert(client_id.to_owned(), (info, now));
    }

    /// Records that `client_id` of `group` was heard from just now.
    pub fn seen(&self, group: &str, client_id: &str, info: ClientInfo) {
        self.seen_at(group, client_id, info, Instant::now());
    }

    /// Forgets `client_id` of `group` (it unregistered).
    pub fn gone(&self, group: &str, client_id: &str) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(c) = inner.groups.get_mut(group) {
            c.remove(client_id);
            if c.is_empty() {
                inner.groups.remove(group);
            }
        }
    }

    /// Forgets every client of remoting connection `conn_id` (it closed).
    pub fn connection_closed(&self, conn_id: u64) {
        let mut inner = self.inner.lock().unwrap();
        for c in inner.groups.values_mut() {
            c.retain(|_, (info, _)| info.conn_id != Some(conn_id));
        }
        inner.groups.retain(|_, c| !c.is_empty());
    }

    /// The live consumers of `group` as of `now`, by client id.
    pub fn list_at(&self, group: &str, now: Instant) -> Vec<Seen> {
        let mut inner = self.inner.lock().unwrap();
        prune(&mut inner, now);
        let mut out: Vec<Seen> = inner
            .groups
            .get(group)
            .map(|c| {
                c.iter()
                    .map(|(id, (info, at))| Seen {
                        client_id: id.clone(),
                        info: info.clone(),
                        idle: now.saturating_duration_since(*at),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        out
    }

    /// The live consumers of `group` now.
    pub fn list(&self, group: &str) -> Vec<Seen> {
        self.list_at(group, Instant::now())
    }
}

/// Drops every entry not heard from within [`CLIENT_EXPIRY`] of `now`.
fn prune(inner: &mut Inner, now: Instant) {
    for c in inner.groups.values_mut() {
        c.retain(|_, (_, at)| now.saturating_duration_since(*at) <= CLIENT_EXPIRY);
    }
    inner.groups.retain(|_, c| !c.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(conn_id: Option<u64>) -> ClientInfo {
        ClientInfo {
            protocol: "gRPC 5.x",
            language: "PYTHON".into(),
            version: String::new(),
            addr: "127.0.0.1:5000".into(),
            conn_id,
        }
    }

    #[test]
    fn consumers_are_listed_until_they_leave_or_go_quiet() {
        let r = ConsumerClients::default();
        let t0 = Instant::now();
        r.seen_at("G", "c2", info(None), t0);
        r.seen_at("G", "c1", info(Some(7)), t0);
        r.seen_at("H", "c3", info(None), t0);
        let ids = |at| -> Vec<String> {
            r.list_at("G", at)
                .into_iter()
                .map(|s| s.client_id)
                .collect()
        };
        assert_eq!(ids(t0), ["c1", "c2"]);
        // Its remoting connection closed.
        r.connection_closed(7);
        assert_eq!(ids(t0), ["c2"]);
        // Unregistered.
        r.gone("G", "c2");
        assert!(ids(t0).is_empty());
        // Quiet past the expiry.
        let later = t0 + CLIENT_EXPIRY + Duration::from_secs(1);
        assert_eq!(r.list_at("H", t0).len(), 1);
        assert!(r.list_at("H", later).is_empty());
        // Nothing for an empty group or client id.
        r.seen_at("", "c", info(None), t0);
        r.seen_at("G", "", info(None), t0);
        assert!(r.list_at("", t0).is_empty() && ids(t0).is_empty());
    }

    #[test]
    fn the_registry_is_bounded() {
        let r = ConsumerClients::default();
        let t0 = Instant::now();
        for i in 0..MAX_CLIENTS_PER_GROUP + 10 {
            r.seen_at("G", &format!("c{i}"), info(None), t0);
        }
        assert_eq!(r.list_at("G", t0).len(), MAX_CLIENTS_PER_GROUP);
        // Once they expire, new ones take their places.
        let later = t0 + CLIENT_EXPIRY + Duration::from_secs(1);
        r.seen_at("G", "new", info(None), later);
        assert_eq!(r.list_at("G", later).len(), 1);
        // Long strings are cut.
        let mut long = info(None);
        long.language = "x".repeat(1000);
        r.seen_at("G", "new", long, later);
        assert_eq!(r.list_at("G", later)[0].info.language.len(), 255);
    }
}
