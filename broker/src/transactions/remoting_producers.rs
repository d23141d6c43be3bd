//! The 4.x producers connected to this node that a transaction check back can
//! reach: each producer group a client named in its HEART_BEAT, with the
//! client's connection (RocketMQ's `ProducerManager`). A check goes to one of
//! them as CHECK_TRANSACTION_STATE (39), oneway; the half message names its
//! producer group in `PGROUP`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ledgermq_remoting::conn::Conn;
use ledgermq_remoting::RemotingCommand;

/// Most producer groups, and most clients of one group, recorded.
const MAX_GROUPS: usize = 4096;
const MAX_CLIENTS_PER_GROUP: usize = 4096;

/// Producer group → client id → its connection.
#[derive(Default)]
pub struct RemotingProducers {
    groups: Mutex<HashMap<String, BTreeMap<String, Conn>>>,
    rr: AtomicUsize,
    store_host: Mutex<Option<std::net::SocketAddr>>,
}

impl RemotingProducers {
    /// The address this node's remoting service announces (what a check's
    /// offset message id names), once it serves one.
    pub fn store_host(&self) -> Option<std::net::SocketAddr> {
        *self.store_host.lock().unwrap()
    }

    /// Sets [`Self::store_host`] (the remoting service, when it starts).
    pub fn set_store_host(&self, addr: std::net::SocketAddr) {
        *self.store_host.lock().unwrap() = Some(addr);
    }

    /// Records client `client_id` of producer group `group` on `conn` (a
    /// heartbeat); past the bounds a new group or client is not recorded.
    pub fn register(&self, group: &str, client_id: &str, conn: &Conn) {
        let mut g = self.groups.lock().unwrap();
        if !g.contains_key(group) && g.len() >= MAX_GROUPS {
            return;
        }
        let clients = g.entry(group.to_owned()).or_default();
        if !clients.contains_key(client_id) && clients.len() >= MAX_CLIENTS_PER_GROUP {
            return;
        }
        clients.insert(client_id.to_owned(), conn.clone());
    }

    /// Forgets client `client_id` of `group` (UNREGISTER_CLIENT).
    pub fn remove(&self, group: &str, client_id: &str) {
        let mut g = self.groups.lock().unwrap();
        if let Some(c) = g.get_mut(group) {
            c.remove(client_id);
        }
        g.retain(|_, c| !c.is_empty());
    }

    /// Forgets every producer on connection `conn_id` (it closed).
    pub fn connection_closed(&self, conn_id: u64) {
        let mut g = self.groups.lock().unwrap();
        for c in g.values_mut() {
            c.retain(|_, conn| conn.id != conn_id);
        }
        g.retain(|_, c| !c.is_empty());
    }

    /// Sends `command` to one live producer of `group` (in turn); the client id
    /// of the one that took it, None if none could.
    pub fn offer(&self, group: &str, command: &RemotingCommand) -> Option<String> {
        let mut g = self.groups.lock().unwrap();
        let clients = g.get_mut(group)?;
        clients.retain(|_, conn| !conn.is_closed());
        let ids: Vec<String> = clients.keys().cloned().collect();
        if ids.is_empty() {
            return None;
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed) % ids.len();
        for i in 0..ids.len() {
            let id = &ids[(start + i) % ids.len()];
            if clients[id].send_oneway(command.clone()) {
                return Some(id.clone());
            }
        }
        None
    }
}
