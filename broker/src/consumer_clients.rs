//! The consumers connected to this node, by consumer group, for `mqadmin
//! consumerConnection`: 5.x clients as their receive and heartbeat calls
//! arrive here (on the node the client calls, not on a leader a call is passed
//! on to), 4.x clients as their HEART_BEAT arrives (until UNREGISTER_CLIENT or
//! their connection closes). An entry not refreshed for [`CLIENT_EXPIRY`] is
//! dropped (RocketMQ's `channelExpiredTimeout`). Bounded: at most
//! [`MAX_ENTRIES`] (group, client) entries in all; past it, new ones are not
//! recorded (this is a view, not a decision); the index of 4.x connections
//! holds exactly the entries each carries. Expired entries are swept at most
//! once a second, so a full registry costs a caller a few map lookups.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A consumer not heard from for this long is dropped.
pub const CLIENT_EXPIRY: Duration = Duration::from_secs(120);
/// Most (group, client) entries recorded.
pub const MAX_ENTRIES: usize = 65_536;
/// Longest group, client id, language or version string kept (longer ones are
/// cut).
const MAX_TEXT_BYTES: usize = 255;
/// Least time between two sweeps of expired entries.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

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
    /// Entries in `groups`.
    entries: usize,
    /// remoting connection → the (group, client id) entries whose `conn_id` it
    /// is: exactly those, so it never holds more than `entries` pairs.
    by_conn: HashMap<u64, HashSet<(String, String)>>,
    /// When expired entries were last swept.
    swept: Option<Instant>,
}

impl Inner {
    /// Takes `(group, client_id)` out of connection `conn`'s index.
    fn unlink(&mut self, conn: u64, group: &str, client_id: &str) {
        if let Some(set) = self.by_conn.get_mut(&conn) {
            set.remove(&(group.to_owned(), client_id.to_owned()));
            if set.is_empty() {
                self.by_conn.remove(&conn);
            }
        }
    }

    fn remove(&mut self, group: &str, client_id: &str) {
        let Some(c) = self.groups.get_mut(group) else {
            return;
        };
        let removed = c.remove(client_id);
        if c.is_empty() {
            self.groups.remove(group);
        }
        if let Some((info, _)) = removed {
            self.entries -= 1;
            if let Some(conn) = info.conn_id {
                self.unlink(conn, group, client_id);
            }
        }
    }

    /// Drops every entry not heard from within [`CLIENT_EXPIRY`] of `now`, if
    /// the last sweep was [`SWEEP_EVERY`] ago or more.
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        let expired: Vec<(String, String)> = self
            .groups
            .iter()
            .flat_map(|(g, c)| {
                c.iter()
                    .filter(|(_, (_, at))| now.saturating_duration_since(*at) > CLIENT_EXPIRY)
                    .map(move |(id, _)| (g.clone(), id.clone()))
            })
            .collect();
        for (g, id) in expired {
            self.remove(&g, &id);
        }
    }
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
        info.language = cut(&info.language);
        info.version = cut(&info.version);
        let conn_id = info.conn_id;
        let mut inner = self.inner.lock().unwrap();
        inner.sweep(now);
        let known = inner
            .groups
            .get(&group)
            .is_some_and(|c| c.contains_key(&client_id));
        if !known && inner.entries >= MAX_ENTRIES {
            return;
        }
        let previous = inner
            .groups
            .entry(group.clone())
            .or_default()
            .insert(client_id.clone(), (info, now));
        match previous {
            None => inner.entries += 1,
            // It moved off another connection (a 4.x client that reconnected,
            // or a 5.x call taking it over).
            Some((old, _)) => {
                if let Some(old_conn) = old.conn_id.filter(|c| Some(*c) != conn_id) {
                    inner.unlink(old_conn, &group, &client_id);
                }
            }
        }
        if let Some(conn) = conn_id {
            inner
                .by_conn
                .entry(conn)
                .or_default()
                .insert((group, client_id));
        }
    }

    /// Records that `client_id` of `group` was heard from just now.
    pub fn seen(&self, group: &str, client_id: &str, info: ClientInfo) {
        self.seen_at(group, client_id, info, Instant::now());
    }

    /// Forgets `client_id` of `group` (it unregistered).
    pub fn gone(&self, group: &str, client_id: &str) {
        self.inner.lock().unwrap().remove(group, client_id);
    }

    /// Forgets every client of remoting connection `conn_id` (it closed).
    pub fn connection_closed(&self, conn_id: u64) {
        let mut inner = self.inner.lock().unwrap();
        // Exactly the entries whose connection this is (`Inner::by_conn`).
        for (group, client_id) in inner.by_conn.remove(&conn_id).unwrap_or_default() {
            inner.remove(&group, &client_id);
        }
    }

    /// The live consumers of `group` as of `now`, by client id.
    pub fn list_at(&self, group: &str, now: Instant) -> Vec<Seen> {
        let inner = self.inner.lock().unwrap();
        let mut out: Vec<Seen> = inner
            .groups
            .get(group)
            .map(|c| {
                c.iter()
                    .filter(|(_, (_, at))| now.saturating_duration_since(*at) <= CLIENT_EXPIRY)
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

    /// Entries recorded (expired ones included until the next sweep).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().entries
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    fn the_registry_is_bounded_in_all() {
        let r = ConsumerClients::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            r.seen_at(&format!("G{}", i % 1000), &format!("c{i}"), info(None), t0);
        }
        assert_eq!(r.len(), MAX_ENTRIES);
        // A known one is still refreshed when full: it outlives the others.
        r.seen_at("G0", "c0", info(None), t0 + Duration::from_secs(60));
        assert_eq!(r.len(), MAX_ENTRIES);
        let past_the_others = t0 + CLIENT_EXPIRY + Duration::from_secs(1);
        let ids: Vec<String> = r
            .list_at("G0", past_the_others)
            .into_iter()
            .map(|s| s.client_id)
            .collect();
        assert_eq!(ids, ["c0"]);
        assert!(r.list_at("G1", past_the_others).is_empty());
        // Once they expire, new ones take their places.
        let later = t0 + CLIENT_EXPIRY + Duration::from_secs(1);
        r.seen_at("G", "new", info(None), later);
        assert_eq!(r.len(), 2, "c0 and the new one");
        assert_eq!(r.list_at("G", later).len(), 1);
        // Long strings are cut.
        let mut long = info(None);
        long.language = "x".repeat(1000);
        r.seen_at("G", "new", long, later);
        assert_eq!(r.list_at("G", later)[0].info.language.len(), 255);
    }

    #[test]
    fn a_closed_connection_forgets_only_what_it_still_carries() {
        let r = ConsumerClients::default();
        let t0 = Instant::now();
        r.seen_at("G", "c1", info(Some(1)), t0);
        // The client came back on connection 2 before 1 was seen closing.
        r.seen_at("G", "c1", info(Some(2)), t0);
        r.connection_closed(1);
        assert_eq!(r.list_at("G", t0).len(), 1);
        r.connection_closed(2);
        assert!(r.list_at("G", t0).is_empty());
        assert!(r.is_empty());
        // The index never holds more than the entries: one client heartbeating
        // for many groups over connections that come and go.
        for conn in 0..100u64 {
            for g in 0..50 {
                r.seen_at(&format!("G{g}"), "c", info(Some(conn)), t0);
            }
        }
        let inner = r.inner.lock().unwrap();
        let indexed: usize = inner.by_conn.values().map(HashSet::len).sum();
        assert_eq!((inner.entries, indexed, inner.by_conn.len()), (50, 50, 1));
    }
}
