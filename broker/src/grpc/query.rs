//! `QueryMessage` of the admin service (`mqadmin queryMsgByKey`,
//! `queryMsgByUniqueKey`): messages of a topic by message id or key, found
//! through this node's IndexFiles (`MessageStore::query_by_key`, which drops hash
//! collisions by reading each candidate).

use ledgermq_store::record::PROPERTY_UNIQ_KEY;
use ledgermq_store::MessageStore;

use crate::admin_pb::{FoundMessage, QueryMessageRequest, QueryMessageResponse};
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::{check_topic, MAX_TAG_OR_KEY_BYTES};

/// Messages returned when the request names no number.
pub const DEFAULT_RESULTS: u32 = 32;
/// Most messages one query returns.
pub const MAX_RESULTS: u32 = 256;
/// Most body bytes returned per message (the rest is counted in `body_bytes`).
pub const BODY_PREVIEW_BYTES: usize = 4096;

/// Answers a query from `store` (this node's applied messages); `node_id` names
/// the node in the answer. Errors, in the answer: ILLEGAL_TOPIC, BAD_REQUEST for
/// an empty or too long key, a time range that ends before it begins or too many
/// results asked; a store read's.
pub fn query_message(
    store: &MessageStore,
    node_id: u64,
    r: &QueryMessageRequest,
) -> QueryMessageResponse {
    let (error, messages) = match found(store, r) {
        Ok(m) => (String::new(), m),
        Err(e) => (e.to_string(), Vec::new()),
    };
    QueryMessageResponse {
        error,
        node_id,
        messages,
    }
}

fn found(store: &MessageStore, r: &QueryMessageRequest) -> Result<Vec<FoundMessage>, BrokerError> {
    check_topic(&r.topic)?;
    if r.key.is_empty() || r.key.len() > MAX_TAG_OR_KEY_BYTES {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!("the key must have 1 to {MAX_TAG_OR_KEY_BYTES} bytes"),
        ));
    }
    let end_ms = if r.end_ms == 0 { i64::MAX } else { r.end_ms };
    if end_ms < r.begin_ms {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!(
                "the time range ends ({end_ms}) before it begins ({})",
                r.begin_ms
            ),
        ));
    }
    let max = match r.max_results {
        0 => DEFAULT_RESULTS,
        n if n > MAX_RESULTS => {
            return Err(refuse(
                ErrorKind::BadRequest,
                format!("at most {MAX_RESULTS} results per query, not {n}"),
            ))
        }
        n => n,
    };
    let stored = if r.unique_key_only {
        store.query_by_message_id(&r.topic, &r.key, r.begin_ms, end_ms, max as usize)?
    } else {
        store.query_by_key(&r.topic, &r.key, r.begin_ms, end_ms, max as usize)?
    };
    Ok(stored
        .iter()
        .map(|m| {
            let mut rec = m.view().to_record();
            let body_bytes = rec.body.len() as u32;
            rec.body.truncate(BODY_PREVIEW_BYTES);
            let id = rec
                .properties
                .get(PROPERTY_UNIQ_KEY)
                .cloned()
                .unwrap_or_default();
            FoundMessage {
                message_id: id,
                topic: rec.topic,
                queue_id: rec.queue_id,
                queue_offset: m.queue_offset,
                physical_offset: m.physical_offset,
                born_timestamp_ms: rec.born_timestamp_ms,
                store_timestamp_ms: rec.store_timestamp_ms,
                born_host: rec.born_host.to_string(),
                store_host: rec.store_host.to_string(),
                reconsume_times: rec.reconsume_times,
                properties: rec.properties.into_iter().collect(),
                body_bytes,
                body: rec.body,
            }
        })
        .collect())
}
