//! The producers connected to this node that a transaction check back can reach:
//! every Telemetry stream whose client said, in its Settings, that it publishes
//! some topics. The reference proxy groups 5.x producers by topic the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use futures::channel::mpsc::Sender;
use tonic::Status;

use crate::pb;

/// Where a Telemetry stream's commands to its client go.
pub type CommandSender = Sender<Result<pb::TelemetryCommand, Status>>;

struct Producer {
    client_id: String,
    topics: Vec<String>,
    commands: CommandSender,
}

/// The publishing Telemetry streams of this node, by stream id.
#[derive(Default)]
pub struct Producers {
    streams: Mutex<HashMap<u64, Producer>>,
    next_stream: AtomicU64,
    rr: AtomicUsize,
}

impl Producers {
    /// A new stream id, for [`Self::register`] and [`Self::remove`].
    pub fn stream_id(&self) -> u64 {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// Records (or updates) stream `stream` of client `client_id`, which publishes
    /// `topics`; `commands` reach it. A stream without topics is removed.
    pub fn register(
        &self,
        stream: u64,
        client_id: &str,
        topics: Vec<String>,
        commands: CommandSender,
    ) {
        let mut s = self.streams.lock().unwrap();
        if topics.is_empty() {
            s.remove(&stream);
            return;
        }
        s.insert(
            stream,
            Producer {
                client_id: client_id.to_owned(),
                topics,
                commands,
            },
        );
    }

    /// Forgets stream `stream` (it ended).
    pub fn remove(&self, stream: u64) {
        self.streams.lock().unwrap().remove(&stream);
    }

    /// Hands `command` to one producer of `topic` on this node (in turn, skipping
    /// streams whose buffer is full or closed); the client id of the one that
    /// took it, None if none could.
    pub fn offer(&self, topic: &str, command: &pb::TelemetryCommand) -> Option<String> {
        let mut s = self.streams.lock().unwrap();
        let mut ids: Vec<u64> = s
            .iter()
            .filter(|(_, p)| p.topics.iter().any(|t| t == topic))
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return None;
        }
        ids.sort_unstable();
        let start = self.rr.fetch_add(1, Ordering::Relaxed) % ids.len();
        ids.rotate_left(start);
        for id in ids {
            let p = s.get_mut(&id).expect("listed under the same lock");
            match p.commands.try_send(Ok(command.clone())) {
                Ok(()) => return Some(p.client_id.clone()),
                Err(e) if e.is_disconnected() => {
                    s.remove(&id);
                }
                Err(_) => {}
            }
        }
        None
    }

    /// Streams recorded.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.streams.lock().unwrap().len()
    }

    /// True when no stream is recorded.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn command(id: &str) -> pb::TelemetryCommand {
        pb::TelemetryCommand {
            status: None,
            command: Some(
                pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(
                    pb::RecoverOrphanedTransactionCommand {
                        message: None,
                        transaction_id: id.into(),
                    },
                ),
            ),
        }
    }

    #[test]
    fn a_check_reaches_one_live_producer_of_its_topic() {
        let p = Producers::default();
        let (tx_a, mut rx_a) = futures::channel::mpsc::channel(4);
        let (tx_b, rx_b) = futures::channel::mpsc::channel(4);
        let (a, b) = (p.stream_id(), p.stream_id());
        p.register(a, "A", vec!["T".into()], tx_a);
        p.register(b, "B", vec!["T".into(), "U".into()], tx_b);
        assert_eq!(p.offer("V", &command("v")), None);
        assert_eq!(p.offer("U", &command("u")), Some("B".into()));
        // B's stream went away: checks of T reach A, whichever is tried first.
        drop(rx_b);
        for _ in 0..2 {
            assert_eq!(p.offer("T", &command("t")), Some("A".into()));
        }
        assert_eq!(p.len(), 1);
        let got = futures::executor::block_on(rx_a.next()).unwrap().unwrap();
        assert_eq!(got, command("t"));
        // A stream that says it publishes nothing is dropped.
        let (tx_c, _rx_c) = futures::channel::mpsc::channel(4);
        p.register(a, "A", vec![], tx_c);
        assert!(p.is_empty());
        assert_eq!(p.offer("T", &command("t")), None);
    }
}
