//! The 4.x ACL request signature, as the 4.x clients' `AclClientRPCHook` (Java;
//! `ClientRPCHook` in rocketmq-client-cpp) makes it and the broker checks it
//! (Apache RocketMQ 5.3: `AclClientRPCHook`, `AclUtils.combineRequestContent`,
//! `AclSigner`, `DefaultAuthenticationContextBuilder.build(ctx, RemotingCommand)`).
//!
//! The client adds ext fields `AccessKey` (and `SecurityToken`, the C++
//! client also `OnsChannel`), then signs: every ext field's *value* but
//! `Signature`'s, in the order of their keys, concatenated as UTF-8, then the
//! body's bytes; `Signature` = base64(HMAC-SHA1(secret key, those bytes)). A
//! request of version 4.9.3 or older leaves `_UNIQUE_KEY_QUERY` out (its
//! clients add that field after signing). There is no date: a signed request
//! can be replayed by anyone who sees it, which TLS does not prevent on a
//! plain-text port. No I/O.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;

use crate::RemotingCommand;

/// Ext field with the access key.
pub const ACCESS_KEY: &str = "AccessKey";
/// Ext field with the signature.
pub const SIGNATURE: &str = "Signature";
/// Ext field a pre-4.9.4 client adds to a query after signing.
const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";
/// `MQVersion.Version.V4_9_3.ordinal()`.
const V4_9_3: i32 = 399;
/// The longest signature read, in base64 characters (HMAC-SHA1: 28).
const MAX_SIGNATURE_BASE64: usize = 128;

/// The bytes `cmd`'s signature covers.
pub fn signed_content(cmd: &RemotingCommand) -> Vec<u8> {
    let mut content = Vec::with_capacity(256 + cmd.body.len());
    // `ext_fields` is a BTreeMap: its order is the keys' (byte order, which is
    // Java's `String.compareTo` order for the ASCII names used).
    for (k, v) in &cmd.ext_fields {
        if k == SIGNATURE || (cmd.version <= V4_9_3 && k == UNIQUE_MSG_QUERY_FLAG) {
            continue;
        }
        content.extend_from_slice(v.as_bytes());
    }
    content.extend_from_slice(&cmd.body);
    content
}

fn mac(secret_key: &str, content: &[u8]) -> Hmac<Sha1> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let mut m = <Hmac<Sha1> as Mac>::new_from_slice(secret_key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    m.update(content);
    m
}

/// base64(HMAC-SHA1(`secret_key`, `content`)): `AclSigner.calSignature`.
pub fn sign(content: &[u8], secret_key: &str) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(mac(secret_key, content).finalize().into_bytes())
}

/// Signs `cmd` as a 4.x client with ACL does: adds `AccessKey`, then
/// `Signature` over the result.
pub fn sign_command(cmd: &mut RemotingCommand, access_key: &str, secret_key: &str) {
    cmd.ext_fields
        .insert(ACCESS_KEY.to_owned(), access_key.to_owned());
    cmd.ext_fields.remove(SIGNATURE);
    let signature = sign(&signed_content(cmd), secret_key);
    cmd.ext_fields.insert(SIGNATURE.to_owned(), signature);
}

/// The access key `cmd` is signed as, if any (`AccessKey`, not empty).
pub fn access_key(cmd: &RemotingCommand) -> Option<&str> {
    cmd.ext_fields
        .get(ACCESS_KEY)
        .map(String::as_str)
        .filter(|k| !k.is_empty())
}

/// True when `cmd`'s `Signature` is the one `secret_key` makes over
/// [`signed_content`] (compared in constant time); false when it is missing,
/// too long or not base64.
pub fn verify(cmd: &RemotingCommand, secret_key: &str) -> bool {
    let Some(signature) = cmd.ext_fields.get(SIGNATURE) else {
        return false;
    };
    if signature.len() > MAX_SIGNATURE_BASE64 {
        return false;
    }
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(signature) else {
        return false;
    };
    mac(secret_key, &signed_content(cmd))
        .verify_slice(&bytes)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signer_matches_rocketmqs_test_vector() {
        // AclSignerTest.calSignatureTest.
        assert_eq!(
            sign(b"RocketMQ", "12345678"),
            "IUc8rrO/0gDch8CjObLQsW2rsiA="
        );
    }

    #[test]
    fn field_values_in_key_order_then_the_body_are_signed() {
        let mut cmd = RemotingCommand::request(10, [("topic", "T"), ("a", "G"), ("b", "x")]);
        cmd.body = b"body".to_vec();
        cmd.version = 500;
        sign_command(&mut cmd, "ak", "sk");
        // Keys in order: AccessKey, a, b, topic (upper case sorts first).
        assert_eq!(signed_content(&cmd), b"akGxTbody");
        assert_eq!(cmd.ext_fields[SIGNATURE], sign(b"akGxTbody", "sk"));
        assert_eq!(access_key(&cmd), Some("ak"));
        assert!(verify(&cmd, "sk"));
        assert!(!verify(&cmd, "other"));
        // Any change to a field or the body breaks it.
        let mut changed = cmd.clone();
        changed.ext_fields.insert("topic".into(), "U".into());
        assert!(!verify(&changed, "sk"));
        let mut changed = cmd.clone();
        changed.body.push(b'!');
        assert!(!verify(&changed, "sk"));
        let mut unsigned = cmd.clone();
        unsigned.ext_fields.remove(SIGNATURE);
        assert!(!verify(&unsigned, "sk"));
        let mut junk = cmd;
        junk.ext_fields.insert(SIGNATURE.into(), "%%%".into());
        assert!(!verify(&junk, "sk"));
    }

    #[test]
    fn an_old_clients_unique_key_query_flag_is_not_signed() {
        let mut cmd = RemotingCommand::request(12, [("topic", "T")]);
        cmd.version = V4_9_3;
        sign_command(&mut cmd, "ak", "sk");
        cmd.ext_fields
            .insert(UNIQUE_MSG_QUERY_FLAG.into(), "true".into());
        assert!(verify(&cmd, "sk"));
        cmd.version = V4_9_3 + 1;
        assert!(!verify(&cmd, "sk"));
    }
}
