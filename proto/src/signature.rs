//! The request signature of the RocketMQ 5.x clients (`MQv2-HMAC-SHA1`), as
//! the official clients send it when given credentials and as the reference
//! proxy checks it (Apache RocketMQ 5.3, `DefaultAuthenticationContextBuilder`
//! and `DefaultAuthenticationHandler`). LedgerMQ's own processes sign their
//! calls to each other the same way: a member passing a call on to the leader,
//! `mqadmin`, and a broker node registering at the name servers.
//!
//! A signed request carries two headers:
//! - `x-mq-date-time`: `yyyyMMdd'T'HHmmss'Z'` (the Python client writes its
//!   local time there, so a client off UTC needs `TZ=UTC`, or the skew check
//!   off);
//! - `authorization`: `MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
//!   Signature=<hex of HMAC-SHA1(SK, the x-mq-date-time value)>`.
//!
//! Pure functions: the caller gives the clock and looks the secret key up.

use hmac::{Hmac, Mac};
use sha1::Sha1;

/// The header with the signature.
pub const AUTHORIZATION_HEADER: &str = "authorization";
/// The header with the signed date and time.
pub const DATE_TIME_HEADER: &str = "x-mq-date-time";
/// The signature scheme of the 5.x clients.
pub const SCHEME: &str = "MQv2-HMAC-SHA1";
/// The longest signature accepted, in hex characters (SHA-1: 40).
const MAX_SIGNATURE_HEX: usize = 128;

/// Why a request's signature headers are refused; the message says which
/// header and why, for the caller's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing or not in the scheme's form.
    #[error("{0}")]
    Malformed(String),
    /// `x-mq-date-time` is further from the receiver's clock than it accepts.
    #[error("{DATE_TIME_HEADER} {date_time} is {skew_ms} ms from this node's clock (at most {max_skew_ms} ms accepted)")]
    Skewed {
        /// The header's value.
        date_time: String,
        /// How far from the receiver's clock, ms.
        skew_ms: u64,
        /// The most accepted, ms.
        max_skew_ms: u64,
    },
    /// The signature is not the one the access key's secret makes.
    #[error("check signature failed for user {0}")]
    Mismatch(String),
}

/// An access key and its secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key (username).
    pub access_key: String,
    /// The secret key.
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <redacted>)", self.access_key)
    }
}

/// hex(HMAC-SHA1(`secret_key`, `date_time`)), lowercase: the signature a
/// 5.x client sends.
pub fn sign(secret_key: &str, date_time: &str) -> String {
    hex::encode(
        mac(secret_key, date_time.as_bytes())
            .finalize()
            .into_bytes(),
    )
}

fn mac(secret_key: &str, content: &[u8]) -> Hmac<Sha1> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let mut m = <Hmac<Sha1> as Mac>::new_from_slice(secret_key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    m.update(content);
    m
}

/// Checks `signature` (bytes, as [`parse_authorization`] gives them) against
/// `secret_key` over `date_time`, in constant time. Error: `Mismatch` naming
/// `access_key`.
pub fn verify(
    access_key: &str,
    secret_key: &str,
    date_time: &str,
    signature: &[u8],
) -> Result<(), SignatureError> {
    mac(secret_key, date_time.as_bytes())
        .verify_slice(signature)
        .map_err(|_| SignatureError::Mismatch(access_key.to_owned()))
}

/// Now as a 5.x client writes `x-mq-date-time` (UTC).
pub fn date_time_now() -> String {
    chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string()
}

/// The two signature headers for `creds`, signed now: (`authorization`,
/// `x-mq-date-time`) values.
pub fn signed_headers(creds: &Credentials) -> (String, String) {
    signed_headers_bound(creds, "")
}

/// [`signed_headers`] with the signature made over the date followed by
/// `bound` (what else the receiver knows the request says, so a signature
/// seen on the wire cannot be reused for another request); `""` makes the
/// 5.x clients' signature.
pub fn signed_headers_bound(creds: &Credentials, bound: &str) -> (String, String) {
    let date_time = date_time_now();
    let authorization = format!(
        "{SCHEME} Credential={}, SignedHeaders={DATE_TIME_HEADER}, Signature={}",
        creds.access_key,
        sign(&creds.secret_key, &format!("{date_time}{bound}"))
    );
    (authorization, date_time)
}

/// Sets both signature headers for `creds` on `request`, signed now.
pub fn sign_request<T>(request: &mut tonic::Request<T>, creds: &Credentials) {
    sign_request_bound(request, creds, "");
}

/// [`sign_request`] over the date and `bound` ([`signed_headers_bound`]).
pub fn sign_request_bound<T>(request: &mut tonic::Request<T>, creds: &Credentials, bound: &str) {
    let (authorization, date_time) = signed_headers_bound(creds, bound);
    for (name, value) in [
        (AUTHORIZATION_HEADER, authorization),
        (DATE_TIME_HEADER, date_time),
    ] {
        // Access keys are checked printable ASCII where they are configured;
        // one that is not leaves the call unsigned, and the receiver refuses it.
        if let Ok(v) = value.parse() {
            request.metadata_mut().insert(name, v);
        }
    }
}

/// Reads `x-mq-date-time` as UTC: ms since the Unix epoch, or None when it is
/// not `yyyyMMdd'T'HHmmss'Z'`.
pub fn parse_date_time(s: &str) -> Option<i64> {
    chrono::NaiveDateTime::parse_from_str(s, "%Y%m%dT%H%M%SZ")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// Checks that `date_time` is within `max_skew_ms` of `now_ms` (the
/// receiver's wall clock, ms since the Unix epoch); 0 checks nothing.
/// Errors: `Malformed` when it is not `yyyyMMdd'T'HHmmss'Z'`, `Skewed`.
pub fn check_skew(date_time: &str, now_ms: i64, max_skew_ms: u64) -> Result<(), SignatureError> {
    if max_skew_ms == 0 {
        return Ok(());
    }
    let at = parse_date_time(date_time).ok_or_else(|| {
        SignatureError::Malformed(format!(
            "{DATE_TIME_HEADER} {date_time:?} is not yyyyMMdd'T'HHmmss'Z'"
        ))
    })?;
    let skew_ms = now_ms.abs_diff(at);
    if skew_ms > max_skew_ms {
        return Err(SignatureError::Skewed {
            date_time: date_time.to_owned(),
            skew_ms,
            max_skew_ms,
        });
    }
    Ok(())
}

/// The access key and the signature's bytes of an `authorization` header.
/// Errors: `Malformed` when the header is not the 5.x scheme's.
pub fn parse_authorization(header: &str) -> Result<(&str, Vec<u8>), SignatureError> {
    let bad = |why: &str| SignatureError::Malformed(format!("authorization header {why}"));
    let (scheme, rest) = header.split_once(' ').ok_or_else(|| bad("is incorrect"))?;
    if scheme != SCHEME {
        return Err(bad(&format!("has scheme {scheme:?}, not {SCHEME}")));
    }
    let (mut access_key, mut signature) = (None, None);
    for item in rest.split(',') {
        let (k, v) = item
            .trim()
            .split_once('=')
            .ok_or_else(|| bad("has an item without '='"))?;
        match k {
            // RocketMQ takes what comes before a '/' (an AK/scope form).
            "Credential" => access_key = v.split('/').next(),
            "Signature" => signature = Some(v),
            _ => {}
        }
    }
    let access_key = access_key
        .filter(|a| !a.is_empty())
        .ok_or_else(|| bad("has no access key (Credential)"))?;
    let signature = signature.ok_or_else(|| bad("has no Signature"))?;
    if signature.len() > MAX_SIGNATURE_HEX {
        return Err(bad("has a signature too long"));
    }
    let signature = hex::decode(signature).map_err(|_| bad("has a signature that is not hex"))?;
    Ok((access_key, signature))
}

/// The signature headers of a request (`authorization`, `x-mq-date-time`),
/// each None when absent, empty or not text.
pub fn headers_of(metadata: &tonic::metadata::MetadataMap) -> (Option<&str>, Option<&str>) {
    let get = |name: &str| {
        metadata
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
    };
    (get(AUTHORIZATION_HEADER), get(DATE_TIME_HEADER))
}

/// Checks a request signed by the one access key `creds` names (a process's
/// own credentials, as a name server checks broker nodes): both headers
/// present, the date within `max_skew_ms` of `now_ms`, and the signature
/// made with `creds`' secret over the date and `bound`
/// ([`signed_headers_bound`]). Errors: `Malformed` (missing header, other
/// access key), `Skewed`, `Mismatch`.
pub fn check_signed_by(
    creds: &Credentials,
    headers: (Option<&str>, Option<&str>),
    now_ms: i64,
    max_skew_ms: u64,
    bound: &str,
) -> Result<(), SignatureError> {
    let (Some(authorization), Some(date_time)) = headers else {
        return Err(SignatureError::Malformed(format!(
            "authentication is required: {AUTHORIZATION_HEADER} and {DATE_TIME_HEADER} headers"
        )));
    };
    let (access_key, signature) = parse_authorization(authorization)?;
    check_skew(date_time, now_ms, max_skew_ms)?;
    if access_key != creds.access_key {
        return Err(SignatureError::Malformed(format!(
            "user {access_key} is not found"
        )));
    }
    verify(
        access_key,
        &creds.secret_key,
        &format!("{date_time}{bound}"),
        &signature,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials {
            access_key: "ledgermq-inner".into(),
            secret_key: "s3cret".into(),
        }
    }

    #[test]
    fn a_signature_made_now_is_checked_and_a_changed_one_is_refused() {
        let (authorization, date_time) = signed_headers(&creds());
        let now = parse_date_time(&date_time).unwrap();
        let ok = (Some(authorization.as_str()), Some(date_time.as_str()));
        assert_eq!(check_signed_by(&creds(), ok, now, 900_000, ""), Ok(()));
        let other = Credentials {
            secret_key: "other".into(),
            ..creds()
        };
        assert_eq!(
            check_signed_by(&other, ok, now, 900_000, ""),
            Err(SignatureError::Mismatch("ledgermq-inner".into()))
        );
        let stranger = Credentials {
            access_key: "someone".into(),
            ..creds()
        };
        assert!(matches!(
            check_signed_by(&stranger, ok, now, 900_000, ""),
            Err(SignatureError::Malformed(_))
        ));
        assert!(matches!(
            check_signed_by(&creds(), ok, now + 900_001, 900_000, ""),
            Err(SignatureError::Skewed { .. })
        ));
        // 0: no skew check.
        assert_eq!(
            check_signed_by(&creds(), ok, now + 10_000_000, 0, ""),
            Ok(())
        );
        assert!(matches!(
            check_signed_by(&creds(), (None, Some(&date_time)), now, 0, ""),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn a_bound_signature_holds_only_for_what_it_was_bound_to() {
        let (authorization, date_time) = signed_headers_bound(&creds(), "\nnode-a");
        let now = parse_date_time(&date_time).unwrap();
        let h = (Some(authorization.as_str()), Some(date_time.as_str()));
        assert_eq!(
            check_signed_by(&creds(), h, now, 900_000, "\nnode-a"),
            Ok(())
        );
        assert_eq!(
            check_signed_by(&creds(), h, now, 900_000, "\nnode-b"),
            Err(SignatureError::Mismatch("ledgermq-inner".into()))
        );
        assert!(check_signed_by(&creds(), h, now, 900_000, "").is_err());
    }

    #[test]
    fn sign_request_sets_both_headers() {
        let mut r = tonic::Request::new(());
        sign_request(&mut r, &creds());
        let (a, d) = headers_of(r.metadata());
        assert!(a
            .unwrap()
            .starts_with("MQv2-HMAC-SHA1 Credential=ledgermq-inner, "));
        assert!(parse_date_time(d.unwrap()).is_some());
    }
}
