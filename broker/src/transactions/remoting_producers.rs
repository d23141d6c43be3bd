//! The 4.x producers connected to this node that a transaction check back can
//! reach: each producer group a client named in its HEART_BEAT, with the
//! client's connection (RocketMQ's `ProducerManager`) and who signed the
//! heartbeat. A check goes to one of them as CHECK_TRANSACTION_STATE (39),
//! oneway; the half message names its producer group in `PGROUP`. With
//! authentication on, only a producer whose user may publish to the half's
//! topic is asked (the check shows the whole message; the reference broker
//! asks any producer of the group). A client is recorded per connection, so
//! a heartbeat or an UNREGISTER_CLIENT naming another connection's client id
//! changes nothing of that connection's.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ledgermq_remoting::conn::Conn;
use ledgermq_remoting::RemotingCommand;

use crate::auth::Principal;

/// Most producer groups, and most clients of one group, recorded.
const MAX_GROUPS: usize = 4096;
const MAX_CLIENTS_PER_GROUP: usize = 4096;

/// A producer: its connection and who signed its heartbeat.
#[derive(Clone)]
pub struct Producer {
    /// The client id its heartbeat gave.
    pub client_id: String,
    /// Its connection.
    pub conn: Conn,
    /// Who signed its heartbeat (`Anyone` with authentication off).
    pub principal: Principal,
}

/// One producer group's producers by (client id, connection id).
type Clients = BTreeMap<(String, u64), Producer>;

/// Producer group → its [`Clients`].
#[derive(Default)]
pub struct RemotingProducers {
    groups: Mutex<HashMap<String, Clients>>,
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
    /// heartbeat signed by `principal`); past the bounds a new group or
    /// client is not recorded.
    pub fn register(&self, group: &str, client_id: &str, conn: &Conn, principal: Principal) {
        let mut g = self.groups.lock().unwrap();
        if !g.contains_key(group) && g.len() >= MAX_GROUPS {
            return;
        }
        let clients = g.entry(group.to_owned()).or_default();
        let key = (client_id.to_owned(), conn.id);
        if !clients.contains_key(&key) && clients.len() >= MAX_CLIENTS_PER_GROUP {
            return;
        }
        clients.insert(
            key,
            Producer {
                client_id: client_id.to_owned(),
                conn: conn.clone(),
                principal,
            },
        );
    }

    /// Forgets client `client_id` of `group` on connection `conn_id`
    /// (UNREGISTER_CLIENT on that connection).
    pub fn remove(&self, group: &str, client_id: &str, conn_id: u64) {
        let mut g = self.groups.lock().unwrap();
        if let Some(c) = g.get_mut(group) {
            c.remove(&(client_id.to_owned(), conn_id));
        }
        g.retain(|_, c| !c.is_empty());
    }

    /// Forgets every producer on connection `conn_id` (it closed).
    pub fn connection_closed(&self, conn_id: u64) {
        let mut g = self.groups.lock().unwrap();
        for c in g.values_mut() {
            c.retain(|(_, id), _| *id != conn_id);
        }
        g.retain(|_, c| !c.is_empty());
    }

    /// The live producers of `group` (copies: choose among them with
    /// [`Self::offer`] without holding anything).
    pub fn producers(&self, group: &str) -> Vec<Producer> {
        let mut g = self.groups.lock().unwrap();
        let Some(clients) = g.get_mut(group) else {
            return Vec::new();
        };
        clients.retain(|_, p| !p.conn.is_closed());
        clients.values().cloned().collect()
    }

    /// Sends `command` to one of `producers` (in turn across calls); the
    /// client id of the one that took it, None if none could.
    pub fn offer(&self, producers: &[Producer], command: &RemotingCommand) -> Option<String> {
        if producers.is_empty() {
            return None;
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed) % producers.len();
        (0..producers.len())
            .map(|i| &producers[(start + i) % producers.len()])
            .find(|p| p.conn.send_oneway(command.clone()))
            .map(|p| p.client_id.clone())
    }
}
