//! QUERY_MESSAGE (12) and VIEW_MESSAGE_BY_ID (33): what `mqadmin
//! queryMsgByKey`, `queryMsgByUniqueKey` and `queryMsgById` of a 4.x
//! toolchain ask, answered from this node's IndexFile and CommitLog with
//! committed messages only, in RocketMQ's stored layout.

use ledgermq_remoting::codes::response;
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::StoredMessage;

use super::fields::{opt, opt_num, req_num, req_str};
use super::pull::pull_body;
use super::Remoting;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::check_topic;

/// Most messages one QUERY_MESSAGE answers with.
pub const MAX_QUERY_RESULTS: usize = 64;

impl Remoting {
    /// The committed message whose record begins at CommitLog `offset`, of a
    /// readable topic clients may see (not the broker's own timer and
    /// half-message topics). Errors: the store's (no record there),
    /// MESSAGE_NOT_FOUND when its entry is not applied on this node or its
    /// topic is not one a client may read.
    pub(super) fn committed_message_at(&self, offset: u64) -> Result<StoredMessage, BrokerError> {
        let stored = self.broker.node.store().message_at(offset)?;
        let applied = self
            .broker
            .node
            .raft()
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index);
        let view = stored.view();
        let visible = view.log_index() <= applied
            && check_topic(view.topic()).is_ok()
            && self.broker.readable_topic(view.topic()).is_ok();
        if !visible {
            return Err(refuse(
                ErrorKind::MessageNotFound,
                format!("no committed message a client may read at physical offset {offset}"),
            ));
        }
        Ok(stored)
    }

    /// Answers VIEW_MESSAGE_BY_ID: the message at the header's `offset` (the
    /// offset message id's).
    pub(super) fn view_message(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let offset: u64 = req_num(req, "offset", None)?;
        let m = self.committed_message_at(offset)?;
        let (body, _) = pull_body(
            std::slice::from_ref(&m),
            self.advertised,
            self.broker.settings.max_body_bytes,
        );
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        r.body = body;
        Ok(r)
    }

    /// Answers QUERY_MESSAGE: a topic's messages by key, or by message id
    /// with `_UNIQUE_KEY_QUERY=true`, stored within the time range, newest
    /// first, at most `maxNum` (bounded by [`MAX_QUERY_RESULTS`]);
    /// QUERY_NOT_FOUND when there is none.
    pub(super) fn query_message(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let topic = self.broker.readable_topic(req_str(req, "topic", None)?)?;
        let key = req_str(req, "key", None)?;
        let max: usize = opt_num(req, "maxNum", None)?.unwrap_or(32);
        let begin: i64 = opt_num(req, "beginTimestamp", None)?.unwrap_or(0);
        let end: i64 = opt_num(req, "endTimestamp", None)?.unwrap_or(i64::MAX);
        let max = max.clamp(1, MAX_QUERY_RESULTS);
        let store = self.broker.node.store();
        let found = if opt(req, "_UNIQUE_KEY_QUERY", None) == Some("true") {
            store.query_by_message_id(&topic.name, key, begin, end, max)?
        } else {
            store.query_by_key(&topic.name, key, begin, end, max)?
        };
        if found.is_empty() {
            return Ok(RemotingCommand::response_to(
                req,
                response::QUERY_NOT_FOUND,
                Some("can not find message, maybe time range not correct".into()),
            ));
        }
        let (body, _) = pull_body(&found, self.advertised, self.broker.settings.max_body_bytes);
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        let newest = found
            .iter()
            .map(|m| m.view().store_timestamp_ms())
            .max()
            .unwrap_or(0);
        r.ext_fields
            .insert("indexLastUpdateTimestamp".into(), newest.to_string());
        r.ext_fields
            .insert("indexLastUpdatePhyoffset".into(), "0".into());
        r.body = body;
        Ok(r)
    }
}
