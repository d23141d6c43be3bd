//! A request's header fields (`extFields`, all strings), read by their long
//! name or, for SEND_MESSAGE_V2's header, by their one-letter name only (as
//! RocketMQ decodes `SendMessageRequestHeaderV2`: a long name beside it is
//! ignored, so what the ACL check reads is what the send uses). Errors are
//! BAD_REQUEST naming the field.

use std::str::FromStr;

use ledgermq_remoting::RemotingCommand;

use crate::error::{refuse, BrokerError, ErrorKind};

/// The field `short` when given (a V2 header), else `name`, if present.
pub(crate) fn opt<'a>(
    req: &'a RemotingCommand,
    name: &str,
    short: Option<&str>,
) -> Option<&'a str> {
    req.ext_fields
        .get(short.unwrap_or(name))
        .map(String::as_str)
}

/// The field `name` (or `short`). Error: BAD_REQUEST when it is missing.
pub(crate) fn req_str<'a>(
    req: &'a RemotingCommand,
    name: &str,
    short: Option<&str>,
) -> Result<&'a str, BrokerError> {
    opt(req, name, short).ok_or_else(|| {
        refuse(
            ErrorKind::BadRequest,
            format!("the header field {name} is missing"),
        )
    })
}

/// The field `name` (or `short`) parsed. Errors: BAD_REQUEST when it is
/// missing or does not parse.
pub(crate) fn req_num<T: FromStr>(
    req: &RemotingCommand,
    name: &str,
    short: Option<&str>,
) -> Result<T, BrokerError> {
    let s = req_str(req, name, short)?;
    s.trim().parse().map_err(|_| {
        refuse(
            ErrorKind::BadRequest,
            format!("the header field {name} is not a number: {s:?}"),
        )
    })
}

/// The field `name` (or `short`) parsed, if present. Error: BAD_REQUEST when
/// it does not parse.
pub(crate) fn opt_num<T: FromStr>(
    req: &RemotingCommand,
    name: &str,
    short: Option<&str>,
) -> Result<Option<T>, BrokerError> {
    match opt(req, name, short) {
        None => Ok(None),
        Some(s) if s.trim().is_empty() => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            refuse(
                ErrorKind::BadRequest,
                format!("the header field {name} is not a number: {s:?}"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_remoting::{LanguageCode, SerializeType};

    #[test]
    fn fields_are_read_by_long_or_short_name() {
        let req = RemotingCommand {
            code: 310,
            language: LanguageCode::Java,
            version: 0,
            opaque: 1,
            flag: 0,
            remark: None,
            ext_fields: [("b", "T"), ("e", "3"), ("x", "nan")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            body: vec![],
            serialize_type: SerializeType::Json,
        };
        assert_eq!(req_str(&req, "topic", Some("b")).unwrap(), "T");
        assert_eq!(req_num::<i32>(&req, "queueId", Some("e")).unwrap(), 3);
        assert_eq!(opt_num::<i32>(&req, "flag", Some("h")).unwrap(), None);
        let e = req_num::<i32>(&req, "x", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest);
        assert!(req_str(&req, "producerGroup", Some("a")).is_err());
        // A V2 header's long name is not read beside its short one.
        let mut both = req.clone();
        both.ext_fields.insert("topic".into(), "Other".into());
        assert_eq!(req_str(&both, "topic", Some("b")).unwrap(), "T");
        assert_eq!(req_str(&both, "topic", None).unwrap(), "Other");
    }
}
