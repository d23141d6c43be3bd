//! A RocketMQ 4.x remoting server that stores nothing: SEND_MESSAGE (10) and
//! SEND_MESSAGE_V2 (310) answer SUCCESS at once (with a message id, the queue
//! id asked for and a running queue offset), HEART_BEAT (34) answers SUCCESS,
//! anything else REQUEST_CODE_NOT_SUPPORTED. It serves each connection with
//! the broker's own connection loop (`ledgermq_remoting::conn::serve_connection`:
//! frame splitting, header decoding, one task per request, batched answer
//! writes; oneway sends kept in order, as the broker does), so `mqbench --protocol remoting` against it measures what the
//! remoting front end alone costs on the machine: the ceiling of a broker
//! that answers sends through it, with no storage and no replication.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::conn::serve_connection;
use ledgermq_remoting::{RemotingCommand, DEFAULT_MAX_FRAME_BYTES};

/// The answer to `req`; `offset` numbers the messages sent so far. None for a
/// oneway request.
pub fn answer(req: &RemotingCommand, offset: &AtomicU64) -> Option<RemotingCommand> {
    if req.is_oneway() {
        return None;
    }
    Some(match req.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 => {
            let short = req.code == request::SEND_MESSAGE_V2;
            let field = |long: &str, s: &str| {
                req.ext_fields
                    .get(if short { s } else { long })
                    .cloned()
                    .unwrap_or_default()
            };
            let n = offset.fetch_add(1, Ordering::Relaxed);
            let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
            r.ext_fields.insert("msgId".into(), format!("{n:032X}"));
            r.ext_fields.insert("queueId".into(), field("queueId", "e"));
            r.ext_fields.insert("queueOffset".into(), n.to_string());
            r
        }
        request::HEART_BEAT => RemotingCommand::response_to(req, response::SUCCESS, None),
        code => RemotingCommand::response_to(
            req,
            response::REQUEST_CODE_NOT_SUPPORTED,
            Some(format!(
                "request code {code}: the no-op server answers only sends and heartbeats"
            )),
        ),
    })
}

/// Serves [`answer`] on `listener` until the process ends.
pub async fn serve_on(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let offset = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let offset = offset.clone();
        tokio::spawn(serve_connection(
            stream,
            DEFAULT_MAX_FRAME_BYTES,
            move |req, _conn| {
                let a = answer(&req, &offset);
                async move { a }
            },
            |req| matches!(req.code, request::SEND_MESSAGE | request::SEND_MESSAGE_V2),
            |_| {},
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remoting::LedgerMqRemoting;
    use crate::runner::{run, LoadSpec};
    use std::time::Duration;

    #[test]
    fn sends_are_answered_and_other_requests_refused() {
        let offset = AtomicU64::new(7);
        let send = RemotingCommand::request(request::SEND_MESSAGE_V2, [("e", "3")]);
        let r = answer(&send, &offset).unwrap();
        assert_eq!(r.code, response::SUCCESS);
        assert_eq!(r.ext_fields["queueId"], "3");
        assert_eq!(r.ext_fields["queueOffset"], "7");
        let pull = RemotingCommand::request(request::PULL_MESSAGE, [("topic", "T")]);
        assert_eq!(
            answer(&pull, &offset).unwrap().code,
            response::REQUEST_CODE_NOT_SUPPORTED
        );
    }

    #[tokio::test]
    async fn the_load_tool_sends_to_the_noop_remoting_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_on(listener));
        let driver = LedgerMqRemoting {
            addrs: vec![addr.to_string()],
            topic: "T".into(),
            group: "G".into(),
            queues: 4,
            call_timeout: Duration::from_secs(5),
        };
        let spec = LoadSpec::sends_only("noop-remoting", 200);
        let s = run(Arc::new(driver), spec).await;
        assert_eq!((s.sent, s.acked), (200, 200), "errors: {:?}", s.errors);
    }
}
