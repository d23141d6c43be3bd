//! `mqadmin` commands about a group's messages and consumers' place in them:
//! `resetOffsetByTime`, `queryMsgByKey`, `queryMsgByUniqueKey`.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use ledgermq_broker::admin_pb::{
    FoundMessage, QueryMessageRequest, QueryMessageResponse, ResetOffsetRequest,
};

/// Broker groups by name, each with its members' client addresses, leader first.
pub type Groups = BTreeMap<String, Vec<String>>;

/// The admin service of the first member of `members` that accepts a
/// connection, in order.
async fn first_member(members: &[String]) -> Result<(String, crate::cluster::AdminClient)> {
    for addr in members {
        if let Ok(c) = crate::cluster::channel(addr, None)
            .await
            .map(crate::cluster::admin_client)
        {
            // Query answers carry message bodies (4 KiB each at most).
            return Ok((addr.clone(), c.max_decoding_message_size(64 << 20)));
        }
    }
    bail!("no member reachable")
}

/// `resetOffsetByTime`: resets `group` on `topic` in every broker group of
/// `groups` to `time` ([`parse_time`]), printing each queue's offset before and
/// after. Error: a bad time, or any broker group that did not reset.
pub async fn reset_offset_by_time(
    groups: &Groups,
    group: &str,
    topic: &str,
    time: &str,
) -> Result<()> {
    let timestamp_ms = parse_time(time, chrono::Local::now())?;
    let req = ResetOffsetRequest {
        group: group.to_owned(),
        topic: topic.to_owned(),
        timestamp_ms,
    };
    println!(
        "rollback consumer offset by specified group: {group}, topic: {topic}, \
         timestamp(ms): {timestamp_ms}"
    );
    println!(
        "{:<16} {:>8} {:>16} {:>12}",
        "#brokerName", "#queueId", "#previousOffset", "#offset"
    );
    let mut failed = 0;
    for (broker_group, members) in groups {
        // Any member passes it on to the leader; no second attempt after an
        // answer (a reset that went unanswered may have been made).
        let answer = match first_member(members).await {
            Ok((addr, mut c)) => c
                .reset_offset(req.clone())
                .await
                .map(|r| r.into_inner())
                .map_err(|s| anyhow::anyhow!("{addr}: {}", s.message())),
            Err(e) => Err(e),
        };
        match answer {
            Ok(r) if r.error.is_empty() => {
                for q in r.queues {
                    println!(
                        "{:<16} {:>8} {:>16} {:>12}",
                        broker_group, q.queue_id, q.previous_offset, q.offset
                    );
                }
            }
            Ok(r) => {
                failed += 1;
                eprintln!("broker group {broker_group}: FAILED: {}", r.error);
            }
            Err(e) => {
                failed += 1;
                eprintln!("broker group {broker_group}: FAILED: {e}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} broker group(s) did not reset the offsets");
    }
    Ok(())
}

/// A query by key, as the commands take it.
pub struct Query {
    /// Topic.
    pub topic: String,
    /// Message id or key.
    pub key: String,
    /// Stored at or after, ms since the Unix epoch.
    pub begin_ms: i64,
    /// Stored at or before, ms since the Unix epoch (0: no end).
    pub end_ms: i64,
    /// Most messages per broker group (0: the broker's default, 32).
    pub max_results: u32,
    /// Only messages whose message id is `key`.
    pub unique_key_only: bool,
}

/// Every broker group's answer (its leader's, else another member's), with the
/// group's name. Error: a group where no member answered, or one that refused.
async fn query(groups: &Groups, q: &Query) -> Result<Vec<(String, QueryMessageResponse)>> {
    let req = QueryMessageRequest {
        topic: q.topic.clone(),
        key: q.key.clone(),
        begin_ms: q.begin_ms,
        end_ms: q.end_ms,
        max_results: q.max_results,
        unique_key_only: q.unique_key_only,
    };
    let mut out = Vec::new();
    for (broker_group, members) in groups {
        let mut answer = None;
        for addr in members {
            let Ok((_, mut c)) = first_member(std::slice::from_ref(addr)).await else {
                continue;
            };
            if let Ok(r) = c.query_message(req.clone()).await {
                answer = Some(r.into_inner());
                break;
            }
        }
        let Some(r) = answer else {
            bail!("broker group {broker_group}: no member answered");
        };
        if !r.error.is_empty() {
            bail!("broker group {broker_group}: {}", r.error);
        }
        out.push((broker_group.clone(), r));
    }
    Ok(out)
}

/// `queryMsgByKey`: one line per message found (RocketMQ's columns, and the
/// broker group). Error: as [`query`].
pub async fn query_by_key(groups: &Groups, q: &Query) -> Result<()> {
    println!(
        "{:<36} {:<16} {:>5} {:>12}",
        "#Message ID", "#Broker Name", "#QID", "#Offset"
    );
    for (broker_group, r) in query(groups, q).await? {
        for m in r.messages {
            let offset = m.queue_offset.map_or("-".to_owned(), |o| o.to_string());
            println!(
                "{:<36} {:<16} {:>5} {:>12}",
                m.message_id, broker_group, m.queue_id, offset
            );
        }
    }
    Ok(())
}

/// `queryMsgByUniqueKey`: each message with that message id, in full. Error: as
/// [`query`], or no such message.
pub async fn query_by_unique_key(groups: &Groups, q: &Query) -> Result<()> {
    let mut n = 0;
    for (broker_group, r) in query(groups, q).await? {
        for m in r.messages {
            n += 1;
            print_message(&broker_group, &m);
        }
    }
    if n == 0 {
        bail!("no message of topic {} has message id {}", q.topic, q.key);
    }
    Ok(())
}

fn print_message(broker_group: &str, m: &FoundMessage) {
    let prop = |k: &str| m.properties.get(k).map_or("", String::as_str);
    let offset = m.queue_offset.map_or("-".to_owned(), |o| o.to_string());
    let rows = [
        ("Message ID", m.message_id.clone()),
        ("Topic", m.topic.clone()),
        ("Broker Name", broker_group.to_owned()),
        ("Tags", prop("TAGS").to_owned()),
        ("Keys", prop("KEYS").to_owned()),
        ("Queue ID", m.queue_id.to_string()),
        ("Queue Offset", offset),
        ("CommitLog Offset", m.physical_offset.to_string()),
        ("Reconsume Times", m.reconsume_times.to_string()),
        ("Born Timestamp", time_text(m.born_timestamp_ms)),
        ("Store Timestamp", time_text(m.store_timestamp_ms)),
        ("Born Host", m.born_host.clone()),
        ("Store Host", m.store_host.clone()),
        ("Properties", format!("{:?}", m.properties)),
        (
            "Body",
            format!(
                "{} bytes: {}{}",
                m.body_bytes,
                String::from_utf8_lossy(&m.body),
                if (m.body.len() as u32) < m.body_bytes {
                    " [...]"
                } else {
                    ""
                }
            ),
        ),
    ];
    for (k, v) in rows {
        println!("{k:<20}{v}");
    }
    println!();
}

/// `ms` as local time, RocketMQ's `yyyy-MM-dd HH:mm:ss,SSS`.
fn time_text(ms: i64) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_millis_opt(ms).single() {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S,%3f").to_string(),
        None => ms.to_string(),
    }
}

/// A time as `mqadmin resetOffsetByTime -s` takes it, in ms since the Unix
/// epoch: `now`, a number of ms, or local time as `yyyy-MM-dd#HH:mm:ss:SSS`
/// (RocketMQ's `UtilAll.YYYY_MM_DD_HH_MM_SS_SSS`). Errors: any other form, or a
/// local time that does not exist (a gap of a daylight-saving change).
pub fn parse_time(s: &str, now: chrono::DateTime<chrono::Local>) -> Result<i64> {
    use chrono::TimeZone;
    let s = s.trim();
    if s == "now" {
        return Ok(now.timestamp_millis());
    }
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d#%H:%M:%S:%3f") else {
        bail!("time {s:?} is not `now`, ms since the Unix epoch, or yyyy-MM-dd#HH:mm:ss:SSS");
    };
    match chrono::Local.from_local_datetime(&t).earliest() {
        Some(t) => Ok(t.timestamp_millis()),
        None => bail!("local time {s:?} does not exist (a daylight-saving gap)"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_take_rocketmqs_forms() {
        use chrono::TimeZone;
        let now = chrono::Local
            .timestamp_millis_opt(1_700_000_000_123)
            .unwrap();
        assert_eq!(parse_time("now", now).unwrap(), 1_700_000_000_123);
        assert_eq!(
            parse_time(" 1699999999000 ", now).unwrap(),
            1_699_999_999_000
        );
        let local = chrono::NaiveDate::from_ymd_opt(2026, 12, 4)
            .unwrap()
            .and_hms_milli_opt(15, 30, 1, 250)
            .unwrap();
        let want = chrono::Local
            .from_local_datetime(&local)
            .earliest()
            .unwrap()
            .timestamp_millis();
        assert_eq!(parse_time("2026-12-04#15:30:01:250", now).unwrap(), want);
        for bad in [
            "",
            "yesterday",
            "2026-12-04 15:30:01",
            "2026-12-04#15:30:01",
        ] {
            assert!(parse_time(bad, now).is_err(), "{bad}");
        }
    }
}
