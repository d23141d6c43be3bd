//! The signature checks and the ACL decisions alone.

use super::*;
use ledgermq_meta::{AclResource, Perm};

const NOW_MS: i64 = 1_765_000_000_000;

fn settings() -> AuthSettings {
    AuthSettings {
        enabled: true,
        max_clock_skew_ms: 900_000,
        inner: Some(Credentials {
            access_key: "inner".into(),
            secret_key: "inner-secret".into(),
        }),
        bootstrap_users: vec![],
    }
}

fn users() -> BTreeMap<String, AclUser> {
    let mut demo = AclUser::new("demo", "demo-secret", false);
    demo.set_perm(
        &AclResource::Topic("SecureTopic".into()),
        Some(Perm::PubSub),
    );
    demo.set_perm(&AclResource::Group("SecureGroup".into()), Some(Perm::Sub));
    let root = AclUser::new("root", "root-secret", true);
    [("demo".into(), demo), ("root".into(), root)].into()
}

fn date(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .format("%Y%m%dT%H%M%SZ")
        .to_string()
}

fn header(ak: &str, sk: &str, date_time: &str) -> String {
    format!(
        "MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={}",
        sign(sk, date_time)
    )
}

fn check(h: &str, d: &str) -> Result<Principal, BrokerError> {
    settings().authenticate(&users(), Some(h), Some(d), NOW_MS)
}

#[test]
fn the_signature_is_rfc_2202_hmac_sha1_in_hex() {
    assert_eq!(
        sign("Jefe", "what do ya want for nothing?"),
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
    );
}

#[test]
fn a_right_signature_passes_and_names_the_user() {
    let d = date(NOW_MS);
    match check(&header("demo", "demo-secret", &d), &d) {
        Ok(Principal::User(u)) => assert_eq!(u.username, "demo"),
        other => panic!("{other:?}"),
    }
    // Upper-case hex (Java clients) is the same signature.
    let upper = header("demo", "demo-secret", &d).replace(
        &sign("demo-secret", &d),
        &sign("demo-secret", &d).to_uppercase(),
    );
    assert!(check(&upper, &d).is_ok());
    assert!(matches!(
        check(&header("inner", "inner-secret", &d), &d),
        Ok(Principal::Inner)
    ));
}

#[test]
fn a_wrong_secret_an_unknown_user_a_stale_date_or_no_header_are_unauthorized() {
    let d = date(NOW_MS);
    let cases = [
        (
            header("demo", "wrong", &d),
            d.clone(),
            "check signature failed",
        ),
        (header("nobody", "x", &d), d.clone(), "not found"),
        // Signed over another date than the header sent.
        (
            header("demo", "demo-secret", &date(NOW_MS - 1000)),
            d.clone(),
            "check signature",
        ),
        (
            header("demo", "demo-secret", &date(NOW_MS - 901_000)),
            date(NOW_MS - 901_000),
            "ms from this node's clock",
        ),
        (
            header("demo", "demo-secret", &date(NOW_MS + 901_000)),
            date(NOW_MS + 901_000),
            "ms from this node's clock",
        ),
        ("Basic abc".into(), d.clone(), "scheme"),
        (
            "MQv2-HMAC-SHA1 Credential=demo".into(),
            d.clone(),
            "no Signature",
        ),
        (
            "MQv2-HMAC-SHA1 Signature=00".into(),
            d.clone(),
            "no access key",
        ),
        (
            "MQv2-HMAC-SHA1 Credential=demo, Signature=zz".into(),
            d.clone(),
            "not hex",
        ),
        (
            header("demo", "demo-secret", "yesterday"),
            "yesterday".into(),
            "is not yyyyMMdd",
        ),
    ];
    for (h, d, why) in cases {
        match check(&h, &d) {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unauthorized, "{h}");
                assert!(e.to_string().contains(why), "{h}: {e}");
            }
            Ok(p) => panic!("{h} passed as {p:?}"),
        }
    }
    let s = settings();
    for (h, d) in [
        (None, Some(d.as_str())),
        (Some(""), Some(d.as_str())),
        (Some("x y"), None),
    ] {
        let e = s.authenticate(&users(), h, d, NOW_MS).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
    }
    // A huge signature is refused before it is decoded.
    let long = format!(
        "MQv2-HMAC-SHA1 Credential=demo, Signature={}",
        "0".repeat(1 << 20)
    );
    assert!(check(&long, &date(NOW_MS)).is_err());
}

#[test]
fn with_authentication_off_anything_passes_and_no_skew_bound_takes_any_date() {
    let off = AuthSettings::default();
    assert!(matches!(
        off.authenticate(&users(), None, None, NOW_MS),
        Ok(Principal::Anyone)
    ));
    let no_skew = AuthSettings {
        max_clock_skew_ms: 0,
        ..settings()
    };
    let old = date(NOW_MS - 86_400_000);
    assert!(no_skew
        .authenticate(
            &users(),
            Some(&header("demo", "demo-secret", &old)),
            Some(&old),
            NOW_MS
        )
        .is_ok());
}

#[test]
fn permissions_are_checked_per_need_and_admin_calls_need_an_admin() {
    let u = users();
    let demo = Principal::User(u["demo"].clone());
    assert!(demo.authorize(&[Need::publish("SecureTopic")]).is_ok());
    assert!(demo
        .authorize(&[
            Need::consume_as("SecureGroup"),
            Need::subscribe_topic("SecureTopic")
        ])
        .is_ok());
    assert!(demo.authorize(&[Need::route("SecureTopic")]).is_ok());
    let e = demo.authorize(&[Need::publish("Other")]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert!(e.to_string().contains("Pub on Topic:Other"), "{e}");
    // SecureGroup has Sub only; another group nothing.
    assert!(demo
        .authorize(&[
            Need::consume_as("OtherGroup"),
            Need::subscribe_topic("SecureTopic")
        ])
        .is_err());
    assert!(demo.authorize_admin().is_err());
    let root = Principal::User(u["root"].clone());
    assert!(root.authorize(&[Need::publish("Other")]).is_ok());
    assert!(root.authorize_admin().is_ok());
    assert!(Principal::Inner.authorize_admin().is_ok());
}

#[test]
fn signed_headers_verify() {
    let creds = Credentials {
        access_key: "demo".into(),
        secret_key: "demo-secret".into(),
    };
    let (h, d) = signed_headers(&creds);
    let now = parse_date_time(&d).unwrap();
    assert!(settings()
        .authenticate(&users(), Some(&h), Some(&d), now)
        .is_ok());
    assert!(!format!("{creds:?}").contains("demo-secret"));
}

#[test]
fn a_principal_refreshed_gets_the_users_changes_and_loses_a_deleted_or_rekeyed_user() {
    let mut u = users();
    let demo = Principal::User(u["demo"].clone());
    u.get_mut("demo")
        .unwrap()
        .set_perm(&AclResource::Topic("Other".into()), Some(Perm::Pub));
    let now = demo.refreshed(&u).unwrap();
    assert!(now.authorize(&[Need::publish("Other")]).is_ok());
    assert!(demo.authorize(&[Need::publish("Other")]).is_err());
    u.get_mut("demo").unwrap().secret_key = "new".into();
    assert_eq!(
        demo.refreshed(&u).unwrap_err().kind(),
        ErrorKind::Unauthorized
    );
    u.remove("demo");
    assert!(demo.refreshed(&u).is_err());
    assert!(Principal::Inner.refreshed(&u).is_ok());
}

#[test]
fn access_keys_are_checked_for_the_headers_delimiters() {
    assert!(check_access_key("username", "demo-1_x.y").is_ok());
    for bad in ["", "a b", "a,b", "a=b", "a/b", "é", &"x".repeat(257)] {
        assert!(check_access_key("username", bad).is_err(), "{bad:?}");
    }
    assert!(check_secret_key("secret key", "any thing/=,").is_ok());
    assert!(check_secret_key("secret key", "").is_err());
}

#[test]
fn a_remoting_request_is_checked_by_its_acl_signature() {
    use ledgermq_remoting::{acl, RemotingCommand};
    let send = |ak: &str, sk: &str| {
        let mut cmd = RemotingCommand::request(310, [("a", "P"), ("b", "SecureTopic")]);
        cmd.body = b"hello".to_vec();
        acl::sign_command(&mut cmd, ak, sk);
        cmd
    };
    let s = settings();
    match s.authenticate_remoting(&users(), &send("demo", "demo-secret")) {
        Ok(Principal::User(u)) => assert_eq!(u.username, "demo"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.authenticate_remoting(&users(), &send("inner", "inner-secret")),
        Ok(Principal::Inner)
    ));
    for (cmd, why) in [
        (send("demo", "guess"), "check signature failed"),
        (send("nobody", "x"), "not found"),
        (
            RemotingCommand::request(310, [("b", "SecureTopic")]),
            "no AccessKey",
        ),
    ] {
        let e = s.authenticate_remoting(&users(), &cmd).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert!(e.to_string().contains(why), "{e}");
    }
    // Off: nothing is read.
    let off = AuthSettings::default();
    assert!(matches!(
        off.authenticate_remoting(&users(), &RemotingCommand::request(310, [("b", "T")])),
        Ok(Principal::Anyone)
    ));
}
