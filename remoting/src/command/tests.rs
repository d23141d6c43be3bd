//! Round trips, a Java client's header, and bad input (never a panic).

use proptest::prelude::*;

use super::*;
use crate::frame::{split_frame, DEFAULT_MAX_FRAME_BYTES};

fn sample(serialize_type: SerializeType) -> RemotingCommand {
    RemotingCommand {
        code: 310,
        language: LanguageCode::Java,
        version: 479,
        opaque: 42,
        flag: 0,
        remark: None,
        ext_fields: [("a", "ProducerGroup"), ("b", "TopicTest"), ("e", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        body: b"hello".to_vec(),
        serialize_type,
    }
}

fn round_trip(c: &RemotingCommand) -> RemotingCommand {
    let bytes = c.encode().unwrap();
    let (frame, used) = split_frame(&bytes, DEFAULT_MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(used, bytes.len());
    RemotingCommand::decode(frame).unwrap()
}

#[test]
fn both_serializations_round_trip() {
    for t in [SerializeType::Json, SerializeType::RocketMq] {
        let c = sample(t);
        assert_eq!(round_trip(&c), c);
        let mut r = RemotingCommand::response_to(&c, 17, Some("topic not exist".into()));
        r.ext_fields.insert("msgId".into(), "0A".into());
        let back = round_trip(&r);
        assert_eq!(back, r);
        assert!(back.is_response() && !back.is_oneway());
        assert_eq!((back.opaque, back.serialize_type), (42, t));
    }
}

#[test]
fn a_java_clients_json_header_decodes() {
    let header = br#"{"code":105,"extFields":{"topic":"TopicTest","n":1,"k":true,"x":null},"flag":2,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479,"unknownField":1}"#;
    let mut frame = (header.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(header);
    let c = RemotingCommand::decode(&frame).unwrap();
    assert_eq!((c.code, c.opaque, c.version), (105, 7, 479));
    assert_eq!(c.language, LanguageCode::Java);
    assert!(c.is_oneway());
    assert_eq!(c.ext_fields["topic"], "TopicTest");
    assert_eq!(c.ext_fields["n"], "1");
    assert_eq!(c.ext_fields["k"], "true");
    assert!(!c.ext_fields.contains_key("x"));
    assert!(c.body.is_empty());
}

#[test]
fn language_codes_and_names_follow_rocketmq() {
    assert_eq!(LanguageCode::Java.code(), 0);
    assert_eq!(LanguageCode::Cpp.code(), 1);
    assert_eq!(LanguageCode::Python.code(), 3);
    assert_eq!(LanguageCode::Rust.code(), 12);
    assert_eq!(LanguageCode::NodeJs.name(), "NODE_JS");
    for l in LanguageCode::ALL {
        assert_eq!(LanguageCode::from_code(l.code()), l);
        assert_eq!(LanguageCode::from_name(l.name()), l);
    }
    assert_eq!(LanguageCode::from_code(200), LanguageCode::Other);
    assert_eq!(LanguageCode::from_name("COBOL"), LanguageCode::Other);
}

fn frame_of(word: u32, header: &[u8]) -> Vec<u8> {
    let mut f = word.to_be_bytes().to_vec();
    f.extend_from_slice(header);
    f
}

#[test]
fn bad_frames_and_headers_are_errors() {
    // A header longer than the frame.
    assert!(matches!(
        RemotingCommand::decode(&frame_of(100, b"{}")),
        Err(RemotingError::HeaderLength {
            header_bytes: 100,
            frame_bytes: 6
        })
    ));
    assert!(matches!(
        RemotingCommand::decode(&[0, 0]),
        Err(RemotingError::HeaderLength { .. })
    ));
    // Invalid JSON, and JSON that is not a command.
    for bad in [
        &b"{\"code\":"[..],
        b"[1,2]",
        b"{\"code\":\"x\"}",
        b"{\"code\":1,\"extFields\":{\"a\":[1]}}",
    ] {
        assert!(matches!(
            RemotingCommand::decode(&frame_of(bad.len() as u32, bad)),
            Err(RemotingError::Json(_))
        ));
    }
    // An unknown serialize type.
    assert_eq!(
        RemotingCommand::decode(&frame_of(2 << 24, b"")),
        Err(RemotingError::SerializeType(2))
    );
    // Binary headers whose lengths overrun them, or are negative, or not UTF-8.
    let good = sample(SerializeType::RocketMq).binary_header().unwrap();
    for cut in 0..good.len() {
        assert!(RemotingCommand::decode(&frame_of((1 << 24) | cut as u32, &good[..cut])).is_err());
    }
    let mut huge_ext = good[..13].to_vec();
    huge_ext.extend_from_slice(&0i32.to_be_bytes());
    huge_ext.extend_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(
        RemotingCommand::decode(&frame_of((1 << 24) | huge_ext.len() as u32, &huge_ext)),
        Err(RemotingError::Binary("a length overruns the header"))
    );
    // As Java reads them: a negative length is an absent field, bytes that
    // are not UTF-8 are replacement characters.
    let mut negative = good[..13].to_vec();
    negative.extend_from_slice(&(-5i32).to_be_bytes());
    negative.extend_from_slice(&(-1i32).to_be_bytes());
    let c =
        RemotingCommand::decode(&frame_of((1 << 24) | negative.len() as u32, &negative)).unwrap();
    assert_eq!((c.remark, c.ext_fields.len()), (None, 0));
    let mut not_utf8 = good[..13].to_vec();
    not_utf8.extend_from_slice(&2i32.to_be_bytes());
    not_utf8.extend_from_slice(&[0xff, 0xfe]);
    not_utf8.extend_from_slice(&0i32.to_be_bytes());
    let c =
        RemotingCommand::decode(&frame_of((1 << 24) | not_utf8.len() as u32, &not_utf8)).unwrap();
    assert_eq!(c.remark.as_deref(), Some("\u{fffd}\u{fffd}"));
}

#[test]
fn huge_or_nested_ext_fields_are_refused_before_they_are_built() {
    // An array value is refused as it begins (not built, then refused).
    let mut array = br#"{"code":0,"extFields":{"a":["#.to_vec();
    array.extend(std::iter::repeat_n(&b"0,"[..], 100_000).flatten());
    array.extend_from_slice(b"0]}}");
    assert!(matches!(
        RemotingCommand::decode(&frame_of(array.len() as u32, &array)),
        Err(RemotingError::Json(e)) if e.contains("a string, number, boolean or null")
    ));
    // More than MAX_EXT_FIELDS fields, in JSON and in a binary header.
    let fields: Vec<String> = (0..=MAX_EXT_FIELDS)
        .map(|i| format!("\"k{i}\":\"v\""))
        .collect();
    let json = format!("{{\"code\":0,\"extFields\":{{{}}}}}", fields.join(","));
    assert!(matches!(
        RemotingCommand::decode(&frame_of(json.len() as u32, json.as_bytes())),
        Err(RemotingError::Json(e)) if e.contains("more than 1024 ext fields")
    ));
    let mut c = sample(SerializeType::RocketMq);
    c.ext_fields = (0..=MAX_EXT_FIELDS)
        .map(|i| (format!("k{i}"), "v".into()))
        .collect();
    let bytes = c.encode().unwrap();
    assert_eq!(
        RemotingCommand::decode(&bytes[4..]),
        Err(RemotingError::Binary("more than 1,024 ext fields"))
    );
    c.ext_fields.pop_first();
    assert_eq!(round_trip(&c).ext_fields.len(), MAX_EXT_FIELDS);
}

#[test]
fn json_headers_are_read_as_leniently_as_fastjson_reads_them() {
    let header = br#"{"code":11,"language":3,"version":null,"flag":null,"serializeTypeCurrentRPC":0,"extFields":null}"#;
    let c = RemotingCommand::decode(&frame_of(header.len() as u32, header)).unwrap();
    assert_eq!((c.code, c.version, c.opaque, c.flag), (11, 0, 0, 0));
    assert_eq!(c.language, LanguageCode::Python);
    assert!(c.ext_fields.is_empty());
    for header in [
        &br#"{"code":11,"language":{"x":[1,2]}}"#[..],
        br#"{"code":11,"language":["JAVA",[2]]}"#,
    ] {
        let c = RemotingCommand::decode(&frame_of(header.len() as u32, header)).unwrap();
        assert_eq!(c.language, LanguageCode::Other);
    }
    // A string with escapes, which the JSON reader hands over as an owned copy.
    let header = br#"{"code":11,"extFields":{"k":"a\"b"}}"#;
    let c = RemotingCommand::decode(&frame_of(header.len() as u32, header)).unwrap();
    assert_eq!(c.ext_fields["k"], "a\"b");
}

#[test]
fn a_json_response_carries_string_fields_as_clients_read_them() {
    let request = sample(SerializeType::Json);
    let mut r = RemotingCommand::response_to(&request, 0, None);
    r.ext_fields.insert("queueId".into(), "3".into());
    r.ext_fields.insert("queueOffset".into(), "17".into());
    let bytes = r.encode().unwrap();
    assert_eq!(&bytes[4..8], &((bytes.len() - 8) as u32).to_be_bytes());
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..]).unwrap();
    assert_eq!(
        header,
        serde_json::json!({
            "code": 0, "language": "JAVA", "version": 479, "opaque": 42, "flag": 1,
            "extFields": {"queueId": "3", "queueOffset": "17"},
            "serializeTypeCurrentRPC": "JSON"
        })
    );
}

#[test]
fn a_binary_header_has_rocketmq_serializables_layout() {
    let mut c =
        RemotingCommand::response_to(&sample(SerializeType::RocketMq), 17, Some("no".into()));
    c.ext_fields.insert("k".into(), "vv".into());
    let bytes = c.encode().unwrap();
    let expected_header: Vec<u8> = [
        &[0x00, 0x11][..], // code 17
        &[0x00],           // JAVA
        &[0x01, 0xdf],     // version 479
        &[0, 0, 0, 42],    // opaque
        &[0, 0, 0, 1],     // flag: response
        &[0, 0, 0, 2],
        b"no",         // remark
        &[0, 0, 0, 9], // ext length
        &[0, 1],
        b"k",
        &[0, 0, 0, 2],
        b"vv",
    ]
    .concat();
    assert_eq!(&bytes[4..8], &[1, 0, 0, expected_header.len() as u8]);
    assert_eq!(&bytes[8..], &expected_header[..]);
    assert_eq!(
        &bytes[..4],
        &((4 + expected_header.len()) as u32).to_be_bytes()
    );
}

#[test]
fn frames_over_the_clients_limit_and_long_keys_are_not_encoded() {
    let mut c = sample(SerializeType::Json);
    c.body = vec![0; DEFAULT_MAX_FRAME_BYTES];
    assert_eq!(
        c.encode(),
        Err(RemotingError::TooLarge("a frame over 16 MiB"))
    );
    let mut c = sample(SerializeType::RocketMq);
    c.ext_fields.insert("k".repeat(40_000), "v".into());
    assert_eq!(
        c.encode(),
        Err(RemotingError::TooLarge("a key over 32 KiB"))
    );
}

#[test]
fn what_a_rocketmq_header_cannot_hold_is_refused_when_encoding() {
    let mut c = sample(SerializeType::RocketMq);
    c.code = 200_050;
    assert!(matches!(c.encode(), Err(RemotingError::TooLarge(_))));
    c.serialize_type = SerializeType::Json;
    assert_eq!(round_trip(&c).code, 200_050);
}

fn any_command() -> impl Strategy<Value = RemotingCommand> {
    (
        any::<i16>(),
        0u8..14,
        any::<i16>(),
        any::<i32>(),
        any::<i32>(),
        proptest::option::of("[^\u{0}]{1,20}"),
        proptest::collection::btree_map("[a-zA-Z]{1,8}", ".{0,20}", 0..6),
        proptest::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
    )
        .prop_map(
            |(code, lang, version, opaque, flag, remark, ext, body, json)| RemotingCommand {
                code: code.into(),
                language: LanguageCode::from_code(lang),
                version: version.into(),
                opaque,
                flag,
                remark,
                ext_fields: ext,
                body,
                serialize_type: if json {
                    SerializeType::Json
                } else {
                    SerializeType::RocketMq
                },
            },
        )
}

proptest! {
    #[test]
    fn every_command_round_trips(c in any_command()) {
        prop_assert_eq!(round_trip(&c), c);
    }

    /// The decoder's fuzz test: any bytes give a command or an error, never a
    /// panic, whatever the serialize type byte says.
    #[test]
    fn arbitrary_bytes_never_panic(
        ser in 0u8..3,
        header in proptest::collection::vec(any::<u8>(), 0..96),
        declared in 0u32..128,
        body in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut frame = frame_of((u32::from(ser) << 24) | declared, &header);
        frame.extend_from_slice(&body);
        let _ = RemotingCommand::decode(&frame);
        let mut stream = ((frame.len()) as i32).to_be_bytes().to_vec();
        stream.extend_from_slice(&frame);
        if let Ok(Some((f, _))) = split_frame(&stream, 64) {
            let _ = RemotingCommand::decode(f);
        }
    }

    /// Mutating one byte of a valid binary frame never panics the decoder.
    #[test]
    fn a_damaged_binary_header_never_panics(c in any_command(), at in any::<usize>(), byte in any::<u8>()) {
        let mut c = c;
        c.serialize_type = SerializeType::RocketMq;
        let mut bytes = c.encode().unwrap();
        let i = 4 + at % (bytes.len() - 4);
        bytes[i] = byte;
        let _ = RemotingCommand::decode(&bytes[4..]);
    }
}
