//! The history of a run: every client call as an `invoke` followed by its outcome
//! (`ok`, `fail`: surely did not happen, `info`: unknown), in Jepsen's model, one
//! JSON object per line (`history.jsonl`).
//!
//! A send's value is the unique message it carries; a receive's completion lists
//! the messages delivered, with where they came from.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::JepsenError;

/// Whether an op starts a call or says how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The call starts.
    Invoke,
    /// It took effect.
    Ok,
    /// It surely did not take effect.
    Fail,
    /// Unknown (timeout, connection lost): it may or may not have taken effect.
    Info,
}

/// What the call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpFn {
    /// Send one message.
    Send,
    /// Receive messages.
    Receive,
    /// Ack one received message (`delivered` holds it, as received).
    Ack,
}

/// The message a send carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Sent {
    /// The unique value (also the body).
    pub id: String,
    /// Message group of a FIFO message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Position in its group's send order (0, 1, ...), for FIFO messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// One delivered message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    /// The value received.
    pub id: String,
    /// Broker group it came from.
    pub broker: String,
    /// Topic it came from.
    #[serde(default)]
    pub topic: String,
    /// Message queue id.
    pub queue_id: i32,
    /// Its queue offset.
    pub queue_offset: u64,
    /// Message group of a FIFO message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Position in its group's send order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Milliseconds since the run started.
    pub time_ms: u64,
    /// The logical client process (one call at a time each).
    pub process: u64,
    /// Invoke or outcome.
    #[serde(rename = "type")]
    pub op_type: OpType,
    /// What the call does.
    pub f: OpFn,
    /// For sends: the message (on the invoke and its outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<Sent>,
    /// For receive outcomes: what was delivered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered: Vec<Delivered>,
    /// Why a call failed or is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node the call went to (index into the run's nodes), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<usize>,
    /// For a producer pinned to one access node (as a Python client given one
    /// endpoint): that node. Absent for producers that spread over every node
    /// (as the Rust client does) and for consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_to: Option<usize>,
}

/// Writes ops as JSON lines.
pub fn write_jsonl(out: &mut impl Write, ops: &[Op]) -> Result<(), JepsenError> {
    for op in ops {
        serde_json::to_writer(&mut *out, op).map_err(|e| JepsenError::History(e.to_string()))?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Reads JSON lines back. Error: `History` with the line number of a bad line.
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<Op>, JepsenError> {
    let mut ops = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        ops.push(
            serde_json::from_str(&line)
                .map_err(|e| JepsenError::History(format!("line {}: {e}", n + 1)))?,
        );
    }
    Ok(ops)
}

/// Each send's outcome: pairs every send invoke with the next outcome of its
/// process. Sends never completed count as `Info`.
pub fn send_outcomes(ops: &[Op]) -> Vec<(Sent, OpType)> {
    let mut open: std::collections::HashMap<u64, Sent> = Default::default();
    let mut out = Vec::new();
    for op in ops.iter().filter(|o| o.f == OpFn::Send) {
        match op.op_type {
            OpType::Invoke => {
                if let Some(prev) = op.sent.clone().and_then(|s| open.insert(op.process, s)) {
                    out.push((prev, OpType::Info));
                }
            }
            t => {
                if let Some(s) = open.remove(&op.process) {
                    out.push((s, t));
                }
            }
        }
    }
    out.extend(open.into_values().map(|s| (s, OpType::Info)));
    out
}

/// Every finished send attempt: (invoked, completed) times in ms, the node it went
/// to (when recorded) and its outcome. An invoke pairs with the next completion of
/// the same process (each process makes one call at a time).
pub fn send_attempts(ops: &[Op]) -> Vec<(u64, u64, Option<usize>, OpType)> {
    let mut open: std::collections::HashMap<u64, u64> = Default::default();
    let mut out = Vec::new();
    for o in ops.iter().filter(|o| o.f == OpFn::Send) {
        if o.op_type == OpType::Invoke {
            open.insert(o.process, o.time_ms);
        } else if let Some(t0) = open.remove(&o.process) {
            out.push((t0, o.time_ms, o.node, o.op_type));
        }
    }
    out
}

/// (invoked, acknowledged) times in ms of every acknowledged send, in the order
/// they completed, with the node that answered (when recorded).
pub fn acked_sends(ops: &[Op]) -> Vec<(u64, u64, Option<usize>)> {
    send_attempts(ops)
        .into_iter()
        .filter(|a| a.3 == OpType::Ok)
        .map(|(t0, t, node, _)| (t0, t, node))
        .collect()
}

/// A send op, for tests: `group` is (message group, seq).
#[cfg(test)]
pub(crate) fn send_op(
    time_ms: u64,
    process: u64,
    t: OpType,
    id: &str,
    group: Option<(&str, u64)>,
) -> Op {
    Op {
        time_ms,
        process,
        op_type: t,
        f: OpFn::Send,
        sent: Some(Sent {
            id: id.into(),
            group: group.map(|g| g.0.into()),
            seq: group.map(|g| g.1),
        }),
        delivered: vec![],
        error: None,
        node: None,
        pinned_to: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(time_ms: u64, process: u64, t: OpType, id: &str) -> Op {
        send_op(time_ms, process, t, id, None)
    }

    #[test]
    fn histories_round_trip_through_json_lines() {
        let ops = vec![send(0, 1, OpType::Invoke, "a"), send(3, 1, OpType::Ok, "a")];
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &ops).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.starts_with(r#"{"time_ms":0,"process":1,"type":"invoke","f":"send""#));
        assert_eq!(read_jsonl(&buf[..]).unwrap(), ops);
        let e = read_jsonl(&b"{}\nnot json\n"[..]).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn outcomes_pair_by_process_and_unfinished_sends_are_unknown() {
        let ops = vec![
            send(0, 1, OpType::Invoke, "a"),
            send(1, 2, OpType::Invoke, "b"),
            send(2, 1, OpType::Ok, "a"),
            send(3, 1, OpType::Invoke, "c"),
            send(4, 1, OpType::Fail, "c"),
        ];
        let mut got = send_outcomes(&ops);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let ids: Vec<_> = got.iter().map(|(s, t)| (s.id.as_str(), *t)).collect();
        assert_eq!(
            ids,
            vec![("a", OpType::Ok), ("b", OpType::Info), ("c", OpType::Fail)]
        );
    }
}
