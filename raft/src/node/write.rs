//! Writes from any node: proposing on the leader, forwarding from a follower,
//! and telling apart what a failed forward may have done.

use std::sync::atomic::Ordering;

use super::*;

impl RaftNode {
    /// Commits `messages` and returns where each was placed, from any node: a
    /// follower forwards to the leader, and while no leader takes the write it waits
    /// for one. Fails with `Timeout` if the commit takes longer than the write
    /// timeout (the messages may still commit later), `NotLeader` if this node lost
    /// leadership with the write in its hands (not committed), `Forward` if the
    /// leader got it and failed or its answer was lost (it may have committed),
    /// `CutOff` at once when this node has not heard from a majority of its group
    /// for an election timeout (not written), `DiskFull` when the leader's disk is
    /// full (through a follower: `Forward` saying so), `Abandoned` (it may still
    /// commit) once, after at least an election timeout, its answer cannot come
    /// soon (`stall_reason`).
    pub async fn write_messages(
        &self,
        messages: Vec<MessageRecord>,
    ) -> Result<Vec<Placed>, RaftNodeError> {
        // Refuse bad input here with a typed error, whichever node leads.
        let mut encoded_bytes = 0usize;
        for m in &messages {
            encoded_bytes += self.store.validate_message(m)?;
        }
        // Before it is forwarded: the leader would refuse it too.
        self.writer
            .check_request_bytes(messages.len(), encoded_bytes)?;
        // This node's own disk does not matter here: the leader checks its own
        // (`Writer`) and the entry commits on a majority, so a follower whose disk
        // is full forwards (it falls behind and catches up once it has room).
        match self.write(Request::Messages(messages)).await? {
            Response::Messages(p) => Ok(p),
            Response::Applied | Response::StaleTerm { .. } => Err(RaftNodeError::Raft(
                "a message write applied as a command".into(),
            )),
        }
    }

    /// Commits a metadata command, from any node. Errors: as
    /// [`Self::write_messages`], and `StaleTerm` when the command is bound to an
    /// earlier term than the entry that carried it (it was not applied).
    pub async fn write_command(&self, command: Command) -> Result<Response, RaftNodeError> {
        applied(self.write(Request::Command(command)).await?)
    }

    /// Commits a metadata command only as this node's own proposal while it leads
    /// (never forwarded): a write that must not outlive this node's leadership, such
    /// as a FIFO delivery lease. An entry proposed in a term commits only with that
    /// term's quorum, or as part of a later leader's log before that leader serves.
    /// Errors: `NotLeader` (also when leadership is lost before the commit),
    /// `Timeout`, `StaleTerm` (the command is bound to a term other than the one
    /// its entry was proposed in: not applied).
    pub async fn write_command_as_leader(
        &self,
        command: Command,
    ) -> Result<Response, RaftNodeError> {
        if !self.is_leader() {
            return Err(RaftNodeError::NotLeader {
                leader: self.leader().map(|l| l.0),
            });
        }
        self.check_in_contact()?;
        let timeout_ms = self.write_timeout.as_millis() as u64;
        applied(
            tokio::time::timeout(
                self.write_timeout,
                self.writer.write_local(Request::Command(command)),
            )
            .await
            .unwrap_or(Err(RaftNodeError::Timeout { timeout_ms }))?,
        )
    }

    /// Commits messages only as this node's own proposal while it leads (never
    /// forwarded): writes that must not outlive this node's leadership, such as
    /// the delivery of due timers, which the next leader's own service takes
    /// over. Answered once committed and applied. Errors: `NotLeader` (also when
    /// leadership is lost before the commit), `CutOff`, `Timeout` (it may still
    /// commit), and the store's refusals of bad messages.
    pub async fn write_messages_as_leader(
        &self,
        messages: Vec<MessageRecord>,
    ) -> Result<Vec<Placed>, RaftNodeError> {
        if !self.is_leader() {
            return Err(RaftNodeError::NotLeader {
                leader: self.leader().map(|l| l.0),
            });
        }
        self.check_in_contact()?;
        let timeout_ms = self.write_timeout.as_millis() as u64;
        let written = tokio::time::timeout(
            self.write_timeout,
            self.writer.write_local(Request::Messages(messages)),
        )
        .await
        .unwrap_or(Err(RaftNodeError::Timeout { timeout_ms }))?;
        match written {
            Response::Messages(p) => Ok(p),
            Response::Applied | Response::StaleTerm { .. } => Err(RaftNodeError::Raft(
                "a message write applied as a command".into(),
            )),
        }
    }

    /// Proposes `request` here while this node leads, else forwards it to the
    /// leader. Until some leader takes it (an election, a leader that cannot be
    /// reached, one that just stepped down) it is tried again every 50 ms: nothing
    /// was proposed, so that cannot duplicate it. The local path takes the request
    /// by value, so message bytes are never copied for a retry. A write whose
    /// answer cannot come soon ([`stall_reason`]) is answered `Abandoned` before
    /// the deadline.
    async fn write(&self, request: Request) -> Result<Response, RaftNodeError> {
        // A node cut off from its group answers at once: the caller can try
        // another node instead of waiting out the timeout.
        self.check_in_contact()?;
        let deadline = tokio::time::Instant::now() + self.write_timeout;
        // The leader last forwarded to (u64::MAX: none).
        let forwarded_to = std::sync::atomic::AtomicU64::new(u64::MAX);
        // Where the write is while its outcome is awaited (`await_outcome`).
        let in_flight = std::sync::Mutex::new(InFlight::Nothing);
        let attempt = async {
            loop {
                if self.is_leader() {
                    *in_flight.lock().unwrap() = InFlight::ProposedHere;
                    return self.writer.write_local(request).await;
                }
                match self
                    .forward(&request, deadline, &forwarded_to, &in_flight)
                    .await
                {
                    Err(RaftNodeError::NoLeader | RaftNodeError::Forward { sent: false, .. }) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => return other,
                }
            }
        };
        let result = self.await_outcome(attempt, deadline, &in_flight).await;
        // The deadline passed while the leader was being asked (a call it never
        // answered, or connections to it that never opened: packets lost one
        // way): until it answers a call again (a ping, `upkeep::probe_peers`),
        // writes here are refused at once.
        let leader = forwarded_to.load(Ordering::Relaxed);
        if matches!(result, Err(RaftNodeError::Timeout { .. })) && leader != u64::MAX {
            self.contacts.call_unanswered(leader);
        }
        result
    }

    /// Awaits `attempt` until `deadline` (then `Timeout`), or until the write
    /// `in_flight` describes can get no answer soon ([`stall_reason`], looked at
    /// every 50 ms once the contact window, an election timeout, has passed: a
    /// healthy group answers well within it, and no fault is judged on less than
    /// a window's evidence): then `Abandoned`. An answer that is ready wins. One
    /// timer per write until the window has passed, as a plain timeout would
    /// take.
    async fn await_outcome(
        &self,
        attempt: impl std::future::Future<Output = Result<Response, RaftNodeError>>,
        deadline: tokio::time::Instant,
        in_flight: &std::sync::Mutex<InFlight>,
    ) -> Result<Response, RaftNodeError> {
        let timeout_ms = self.write_timeout.as_millis() as u64;
        let watch_from =
            tokio::time::Instant::now() + Duration::from_millis(self.contacts.window_ms());
        tokio::pin!(attempt);
        loop {
            let now = tokio::time::Instant::now();
            let wake = if now < watch_from {
                watch_from
            } else {
                now + Duration::from_millis(50)
            };
            tokio::select! {
                biased;
                r = &mut attempt => return r,
                _ = tokio::time::sleep_until(wake.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftNodeError::Timeout { timeout_ms });
            }
            if tokio::time::Instant::now() >= watch_from {
                let out = *in_flight.lock().unwrap();
                let leader = self.leader().map(|(l, _)| l);
                if let Some(reason) =
                    stall_reason(out, leader, self.contacts.in_contact_with_quorum())
                {
                    return Err(RaftNodeError::Abandoned { reason });
                }
            }
        }
    }

    /// Forwards `request` to the leader with the time left until `deadline` (when
    /// this node gives up on it, on its monotonic clock): the leader does not
    /// propose it after that time has passed on its own monotonic clock, counted
    /// from the request's arrival (so up to one network transit after this node
    /// gave up; wall clocks play no part: [`crate::network::TIMEOUT_HEADER`]).
    async fn forward(
        &self,
        request: &Request,
        deadline: tokio::time::Instant,
        forwarded_to: &std::sync::atomic::AtomicU64,
        in_flight: &std::sync::Mutex<InFlight>,
    ) -> Result<Response, RaftNodeError> {
        let (leader, addr) = self.leader().ok_or(RaftNodeError::NoLeader)?;
        if leader == self.id {
            // Elected but not yet serving as leader: look again shortly.
            return Err(RaftNodeError::NoLeader);
        }
        forwarded_to.store(leader, Ordering::Relaxed);
        let unsent = |reason: String| RaftNodeError::Forward {
            leader,
            reason,
            sent: false,
        };
        if self.filter.is_blocked(self.id, leader) {
            return Err(unsent("blocked by the network filter".into()));
        }
        let sent = |reason: String| RaftNodeError::Forward {
            leader,
            reason,
            sent: true,
        };
        let channel = self.channel(&addr).map_err(unsent)?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(RaftNodeError::Timeout {
                timeout_ms: self.write_timeout.as_millis() as u64,
            });
        }
        let mut req = peer_request(self.id, request, left).map_err(|s| unsent(s.to_string()))?;
        let request_bytes = req.get_ref().data.len();
        set_forward_budget(&mut req, left, ledgermq_store::store::now_ms());
        let (filter, from) = (&self.filter, self.id);
        let call = async {
            // The test network's latency, as the Raft calls get it.
            tokio::time::sleep(filter.transfer_delay(from, leader, request_bytes)).await;
            RaftPeerClient::new(channel).forward(req).await
        };
        *in_flight.lock().unwrap() = InFlight::Forwarded(leader);
        // No answer in time: `write` marks the leader unanswered.
        let reply = tokio::time::timeout_at(deadline, call).await;
        *in_flight.lock().unwrap() = InFlight::Nothing;
        let reply = reply.map_err(|_| RaftNodeError::Timeout {
            timeout_ms: self.write_timeout.as_millis() as u64,
        })?;
        let reply = reply.map_err(|s| {
            // Only a failed connection proves the request never left; UNAVAILABLE
            // also covers connections lost after sending (keep-alive timeouts).
            if s.code() == tonic::Code::Unavailable && is_connect_error(&s) {
                unsent(s.to_string())
            } else {
                sent(s.to_string())
            }
        })?;
        self.contacts.call_answered(leader);
        // A reply that does not decode (a leader of another release) may hide
        // anything: the write may have been proposed.
        let result: Result<Response, ForwardRefusal> =
            decode(reply.get_ref()).map_err(|s| sent(s.to_string()))?;
        result.map_err(|refusal| match refusal {
            ForwardRefusal::NotWritten(reason) => unsent(reason),
            ForwardRefusal::MaybeWritten(reason) => sent(reason),
            ForwardRefusal::MembersCannotDecode(set) => RaftNodeError::MembersCannotDecode { set },
        })
    }
}

/// Where a write stands while this node awaits its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InFlight {
    /// Nothing is out: not yet proposed or forwarded, or a forward came back
    /// unsent and is about to be tried again.
    Nothing,
    /// Proposed to this node's Raft while it led.
    ProposedHere,
    /// Forwarded to this leader, no answer yet.
    Forwarded(NodeId),
}

/// Why a write that is out (`in_flight`) can get no answer soon, so waiting
/// longer only holds the client, or `None` to keep waiting. No I/O.
///
/// - This node has not heard from a majority for the window
///   (`in_contact_with_quorum` false): as leader it cannot commit the entry, and
///   as a follower the leader's answer cannot reach it.
/// - It forwarded the write to a leader and another node is now known to lead:
///   the old leader's entry commits only if the new leader's log holds it, which
///   the old leader cannot tell this node before it rejoins.
///
/// Either way the write may still commit, so the answer is an unknown outcome.
/// Nothing out (about to retry a forward that was not sent) is never abandoned:
/// the retry loop and the deadline decide.
fn stall_reason(
    in_flight: InFlight,
    leader_now: Option<NodeId>,
    in_contact_with_quorum: bool,
) -> Option<String> {
    let what = match in_flight {
        InFlight::Nothing => return None,
        InFlight::ProposedHere => "proposed here".to_owned(),
        InFlight::Forwarded(leader) => format!("forwarded to leader {leader}"),
    };
    if !in_contact_with_quorum {
        return Some(format!(
            "{what} and this node has not heard from a majority of its group for an election timeout"
        ));
    }
    match (in_flight, leader_now) {
        (InFlight::Forwarded(old), Some(new)) if new != old => Some(format!(
            "{what}, which node {new} has replaced before it answered"
        )),
        _ => None,
    }
}

/// A command's response as a result: `StaleTerm` (committed, not applied) is an
/// error to the caller.
fn applied(r: Response) -> Result<Response, RaftNodeError> {
    match r {
        Response::StaleTerm {
            proposed_term,
            entry_term,
        } => Err(RaftNodeError::StaleTerm {
            proposed_term,
            entry_term,
        }),
        other => Ok(other),
    }
}

/// True if the status comes from failing to connect (tonic's `ConnectError`,
/// which its channel wraps every error of the connection's set-up in), so the
/// request was never sent.
fn is_connect_error(s: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_told_apart_from_other_unavailability() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(); // released: nothing listens there now
        let ch = lazy_channel(
            &format!("127.0.0.1:{port}"),
            Duration::from_millis(500),
            None,
        )
        .unwrap();
        let req = peer_request(
            1,
            &Request::Command(Command::DeleteTopic("t".into())),
            Duration::from_secs(1),
        )
        .unwrap();
        let s = RaftPeerClient::new(ch).forward(req).await.unwrap_err();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(is_connect_error(&s), "{s:?}");
        assert!(!is_connect_error(&tonic::Status::unavailable(
            "connection reset"
        )));
    }

    #[test]
    fn a_write_is_abandoned_only_while_out_and_only_when_no_answer_can_come_soon() {
        use InFlight::*;
        // Nothing out: never (the retry loop and the deadline decide).
        assert_eq!(stall_reason(Nothing, Some(2), false), None);
        assert_eq!(stall_reason(Nothing, None, true), None);
        // Proposed here: only once cut off from a majority.
        assert_eq!(stall_reason(ProposedHere, Some(0), true), None);
        assert!(stall_reason(ProposedHere, Some(0), false).is_some());
        // Forwarded: when another leader is known, or this node is cut off.
        assert_eq!(stall_reason(Forwarded(1), Some(1), true), None);
        assert_eq!(stall_reason(Forwarded(1), None, true), None);
        let replaced = stall_reason(Forwarded(1), Some(2), true).unwrap();
        assert!(replaced.contains("node 2"), "{replaced}");
        assert!(stall_reason(Forwarded(1), Some(1), false).is_some());
    }

    #[test]
    fn a_leader_says_by_type_whether_a_forwarded_write_can_still_commit() {
        let not_written =
            |e: RaftNodeError| matches!(ForwardRefusal::from(e), ForwardRefusal::NotWritten(_));
        assert!(not_written(RaftNodeError::NotLeader { leader: Some(2) }));
        assert!(not_written(RaftNodeError::NoLeader));
        assert!(not_written(RaftNodeError::Expired));
        for maybe in [
            RaftNodeError::Timeout { timeout_ms: 5 },
            RaftNodeError::ShuttingDown,
            RaftNodeError::Raft("x".into()),
        ] {
            assert!(!not_written(maybe));
        }
        // The reply as it travels.
        let r: Result<Response, ForwardRefusal> = Err(RaftNodeError::NoLeader.into());
        let p = crate::network::encode(&r).unwrap();
        let back: Result<Response, ForwardRefusal> = decode(&p).unwrap();
        assert_eq!(back, r);
    }
}
