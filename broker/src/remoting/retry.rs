//! CONSUMER_SEND_MSG_BACK (36): a push consumer's failed message goes to its
//! group's retry topic `%RETRY%<group>` after a delay, or to `%DLQ%<group>`
//! once it has been consumed `maxReconsumeTimes` times (16 by default), as
//! RocketMQ's `AbstractSendMessageProcessor` does; only a message of a
//! readable topic (not the broker's own timer or half-message topics) is
//! copied
//! (`../shared/docs/rocketmq-remoting.md` §1.3): delay level 0 means
//! `3 + reconsumeTimes` (10 s, 30 s, 1 min, ...), a negative one the DLQ at
//! once. The copy keeps the message id (`UNIQ_KEY`) and properties, counts
//! one more reconsume, and names the original topic in `RETRY_TOPIC` and the
//! original id in `ORIGIN_MESSAGE_ID`. A send-back whose `originMsgId` is not
//! the message at its offset is refused ([`is_message_sent_back`]).

use ledgermq_remoting::codes::response;
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::MessageRecord;

use super::clients::retry_topic;
use super::fields::{opt, opt_num, req_num, req_str};
use super::send::DELAY_LEVELS_MS;
use super::Remoting;
use crate::consume::dlq_topic;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::{check_group, dead_letter_copy, Incoming};
use ledgermq_remoting::message::offset_message_id;

/// RocketMQ's default `maxReconsumeTimes`.
pub const DEFAULT_MAX_RECONSUME_TIMES: i32 = 16;
/// Property naming a retried message's original topic (`MessageConst.PROPERTY_RETRY_TOPIC`).
pub const PROPERTY_RETRY_TOPIC: &str = "RETRY_TOPIC";
/// Property naming the original message id (`PROPERTY_ORIGIN_MESSAGE_ID`).
pub const PROPERTY_ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";

/// Where a message consumed `reconsume_times` times goes when sent back with
/// `delay_level`: `None` for the dead-letter queue, else the delay in ms.
pub fn retry_delay_ms(
    reconsume_times: i32,
    delay_level: i32,
    max_reconsume_times: i32,
) -> Option<i64> {
    if delay_level < 0 || reconsume_times >= max_reconsume_times {
        return None;
    }
    let level = if delay_level == 0 {
        reconsume_times.saturating_add(3)
    } else {
        delay_level
    };
    let i = (level.clamp(1, DELAY_LEVELS_MS.len() as i32) - 1) as usize;
    Some(DELAY_LEVELS_MS[i])
}

impl Remoting {
    /// Creates `topic` (a retry or dead-letter topic of `group`) unless it
    /// exists, only for a consumer group that exists. Errors:
    /// CONSUMER_GROUP_NOT_FOUND (SUBSCRIPTION_GROUP_NOT_EXIST over remoting),
    /// [`crate::broker::Broker::ensure_topic`]'s.
    pub(super) async fn existing_group_topic(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<(), BrokerError> {
        if self.broker.group_config(group).is_none() {
            return Err(refuse(
                ErrorKind::ConsumerGroupNotFound,
                format!(
                    "consumer group {group} does not exist in broker group {}",
                    self.broker.group
                ),
            ));
        }
        self.broker.ensure_topic(topic).await
    }

    /// Answers CONSUMER_SEND_MSG_BACK (see the module doc).
    pub(super) async fn send_back(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let group = req_str(req, "group", None)?;
        check_group(group)?;
        let offset: u64 = req_num(req, "offset", None)?;
        let delay_level: i32 = opt_num(req, "delayLevel", None)?.unwrap_or(0);
        let max_reconsume: i32 =
            opt_num(req, "maxReconsumeTimes", None)?.unwrap_or(DEFAULT_MAX_RECONSUME_TIMES);
        let stored = self.committed_message_at(offset)?;
        let mut rec: MessageRecord = stored.view().to_record();
        if let Some(origin) = opt(req, "originMsgId", None).filter(|o| !o.is_empty()) {
            let uniq = rec
                .properties
                .get(ledgermq_store::record::PROPERTY_UNIQ_KEY);
            if !is_message_sent_back(origin, uniq.map(String::as_str), offset) {
                return Err(refuse(
                    ErrorKind::MessageNotFound,
                    format!("the message at offset {offset} is not {origin}"),
                ));
            }
        }
        // RocketMQ keeps the first message's id through every retry: the
        // stored one's, else the offset message id of the message sent back.
        let offset_id = offset_message_id(self.advertised, stored.physical_offset);
        rec.properties
            .entry(PROPERTY_ORIGIN_MESSAGE_ID.into())
            .or_insert(offset_id);
        let origin_topic = opt(req, "originTopic", None)
            .map(str::to_owned)
            .unwrap_or_else(|| rec.topic.clone());
        rec.properties
            .entry(PROPERTY_RETRY_TOPIC.into())
            .or_insert(origin_topic);
        let message_id = rec
            .properties
            .get(ledgermq_store::record::PROPERTY_UNIQ_KEY)
            .cloned()
            .unwrap_or_else(|| super::clients::new_message_id(self.advertised));
        let delay = retry_delay_ms(rec.reconsume_times, delay_level, max_reconsume);
        rec.reconsume_times = rec.reconsume_times.saturating_add(1);
        let (rec, deliver_at) = match delay {
            None => {
                let dlq = dlq_topic(group);
                self.existing_group_topic(group, &dlq).await?;
                (dead_letter_copy(rec, dlq), None)
            }
            Some(delay_ms) => {
                let topic = retry_topic(group);
                self.existing_group_topic(group, &topic).await?;
                rec.topic = topic;
                rec.queue_id = 0;
                (rec, Some(ledgermq_store::store::now_ms() + delay_ms))
            }
        };
        let inc = Incoming {
            record: rec,
            message_id,
            message_group: None,
            client_queue_id: Some(0),
            deliver_at_ms: deliver_at,
            transaction: false,
            check_immunity_ms: None,
        };
        self.broker
            .send_checked(vec![Ok(inc)], &mut Vec::new(), false)
            .await?;
        Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
    }
}

/// True if the message a send-back names (`originMsgId`: its unique key, or
/// an offset message id) is the one stored at `offset` (whose unique key is
/// `uniq_key`): a consumer that pulled from a follower names that follower's
/// CommitLog offset, which is the same on every member unless a member's log
/// restarted from a snapshot. The Java and C++ clients send the unique key,
/// which every stored message has, so a mismatch is caught; a client that
/// sends the offset message id (crates.io `rocketmq-client-rust`) derives it
/// from the same offset, so for it the check proves nothing. No I/O.
pub fn is_message_sent_back(origin: &str, uniq_key: Option<&str>, offset: u64) -> bool {
    uniq_key.is_some_and(|k| k.eq_ignore_ascii_case(origin))
        || ledgermq_remoting::message::decode_offset_message_id(origin)
            .is_some_and(|(_, at)| at == offset)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_send_back_names_the_message_at_its_offset_by_key_or_offset_id() {
        let key = "7F0000010C8D18B4AAC2536AD1A20000";
        assert!(is_message_sent_back(key, Some(key), 5));
        let offset_id =
            ledgermq_remoting::message::offset_message_id("127.0.0.1:10912".parse().unwrap(), 4096);
        assert!(is_message_sent_back(&offset_id, Some(key), 4096));
        assert!(is_message_sent_back(&offset_id, None, 4096));
        assert!(!is_message_sent_back(&offset_id, Some(key), 4097));
        assert!(!is_message_sent_back(
            "7F0000010C8D18B4AAC2536AD1A29999",
            Some(key),
            4096
        ));
    }

    use super::*;

    #[test]
    fn retries_back_off_by_level_then_go_to_the_dead_letter_queue() {
        // First failure: level 3 (10 s); then 30 s, 1 min, ...
        assert_eq!(retry_delay_ms(0, 0, 16), Some(10_000));
        assert_eq!(retry_delay_ms(1, 0, 16), Some(30_000));
        assert_eq!(retry_delay_ms(15, 0, 16), Some(7_200_000));
        assert_eq!(retry_delay_ms(16, 0, 16), None);
        assert_eq!(retry_delay_ms(0, 1, 16), Some(1_000));
        assert_eq!(retry_delay_ms(0, -1, 16), None);
        assert_eq!(retry_delay_ms(2, 0, 2), None);
    }
}
