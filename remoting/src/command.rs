//! `RemotingCommand`: one request or response (Apache RocketMQ's
//! `remoting/protocol/RemotingCommand.java`, its binary header
//! `RocketMQSerializable.java`, `LanguageCode.java`).
//!
//! After the frame's length field: `[serialize type: u8][header length: u24
//! BE][header][body]`. A JSON header is fastjson's object of `code`,
//! `language` (a [`LanguageCode`] name), `version`, `opaque`, `flag`, `remark`
//! (only when set), `extFields` (string values) and `serializeTypeCurrentRPC`.
//! A ROCKETMQ header is `code: i16, language: u8, version: i16, opaque: i32,
//! flag: i32, remark length: i32, remark, ext length: i32, then per field key
//! length: i16, key, value length: i32, value`, big-endian, UTF-8.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::RemotingError;

/// `flag` bit 0: the command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// `flag` bit 1: a request that gets no response.
pub const FLAG_ONEWAY: i32 = 1 << 1;
/// The largest header the 24-bit length can say, bytes.
pub const MAX_HEADER_BYTES: usize = (1 << 24) - 1;
/// Most ext fields one header may carry (real headers carry about 15): a
/// header of many tiny fields would otherwise cost ten times its size.
pub const MAX_EXT_FIELDS: usize = 1024;

/// How a command's header is serialized (`SerializeType`); a server answers in
/// the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SerializeType {
    /// fastjson (0), the clients' default.
    Json,
    /// `RocketMQSerializable`'s binary layout (1).
    RocketMq,
}

impl SerializeType {
    fn code(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

/// The sender's language (`LanguageCode`, by byte code and by name). Codes and
/// names no release defines read as [`LanguageCode::Other`]: the field only
/// informs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
#[repr(u8)]
pub enum LanguageCode {
    Java,
    Cpp,
    Dotnet,
    Python,
    Delphi,
    Erlang,
    Ruby,
    Other,
    Http,
    Go,
    Php,
    Oms,
    Rust,
    NodeJs,
}

impl LanguageCode {
    /// Every language, in byte code order (0 = JAVA ... 13 = NODE_JS).
    pub const ALL: [LanguageCode; 14] = [
        LanguageCode::Java,
        LanguageCode::Cpp,
        LanguageCode::Dotnet,
        LanguageCode::Python,
        LanguageCode::Delphi,
        LanguageCode::Erlang,
        LanguageCode::Ruby,
        LanguageCode::Other,
        LanguageCode::Http,
        LanguageCode::Go,
        LanguageCode::Php,
        LanguageCode::Oms,
        LanguageCode::Rust,
        LanguageCode::NodeJs,
    ];
    const NAMES: [&'static str; 14] = [
        "JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO",
        "PHP", "OMS", "RUST", "NODE_JS",
    ];

    /// The byte code of the binary header.
    pub fn code(self) -> u8 {
        // The variants are declared in byte code order.
        self as u8
    }

    /// The name of the JSON header.
    pub fn name(self) -> &'static str {
        Self::NAMES[self.code() as usize]
    }

    /// The language of a byte code ([`LanguageCode::Other`] if unknown).
    pub fn from_code(code: u8) -> Self {
        Self::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(LanguageCode::Other)
    }

    /// The language of a name ([`LanguageCode::Other`] if unknown).
    pub fn from_name(name: &str) -> Self {
        Self::NAMES
            .iter()
            .position(|&n| n == name)
            .map_or(LanguageCode::Other, |i| Self::ALL[i])
    }
}

/// One request or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotingCommand {
    /// Request code (`RequestCode`) or response code (`ResponseCode`).
    pub code: i32,
    /// The sender's language.
    pub language: LanguageCode,
    /// The sender's release (`MQVersion` ordinal, e.g. 479 for 5.3.3).
    pub version: i32,
    /// Request id on its connection; a response echoes its request's.
    pub opaque: i32,
    /// [`FLAG_RESPONSE`], [`FLAG_ONEWAY`].
    pub flag: i32,
    /// Free text, mostly a response's error message.
    pub remark: Option<String>,
    /// The request's or response's header fields, as strings.
    pub ext_fields: BTreeMap<String, String>,
    /// The body (a message, a JSON document, ...).
    pub body: Vec<u8>,
    /// How the header was or is to be serialized.
    pub serialize_type: SerializeType,
}

/// The JSON header as written.
#[derive(Serialize)]
struct JsonHeaderOut<'a> {
    code: i32,
    language: &'a str,
    version: i32,
    opaque: i32,
    flag: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    remark: Option<&'a str>,
    #[serde(rename = "extFields")]
    ext_fields: &'a BTreeMap<String, String>,
    #[serde(rename = "serializeTypeCurrentRPC")]
    serialize_type_current_rpc: &'a str,
}

/// The JSON header as read, as leniently as fastjson: missing or null numbers
/// are 0, a language that is not a known name is OTHER, and
/// `serializeTypeCurrentRPC` is not read (the type byte says it).
#[derive(Deserialize)]
struct JsonHeaderIn {
    code: i32,
    #[serde(default)]
    language: Option<Language>,
    #[serde(default)]
    version: Option<i32>,
    #[serde(default)]
    opaque: Option<i32>,
    #[serde(default)]
    flag: Option<i32>,
    #[serde(default)]
    remark: Option<String>,
    #[serde(rename = "extFields", default)]
    ext_fields: Option<ExtFields>,
}

/// `extFields` as read: scalar values as text (a client may write a number or
/// a boolean; null is absent), at most [`MAX_EXT_FIELDS`] of them; an array or
/// object value is refused as soon as it begins, before it is built.
struct ExtFields(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for ExtFields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ExtFields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an object of at most {MAX_EXT_FIELDS} scalar fields")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<ExtFields, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = m.next_entry::<String, Scalar>()? {
                    if let Some(v) = v.0 {
                        out.insert(k, v);
                    }
                    if out.len() > MAX_EXT_FIELDS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_EXT_FIELDS} ext fields"
                        )));
                    }
                }
                Ok(ExtFields(out))
            }
            fn visit_unit<E>(self) -> Result<ExtFields, E> {
                Ok(ExtFields(BTreeMap::new()))
            }
        }
        d.deserialize_any(Fields)
    }
}

/// `language` as read: a name or a byte code; anything else (skipped without
/// being built) is OTHER.
struct Language(LanguageCode);

impl<'de> Deserialize<'de> for Language {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::IgnoredAny;
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Language;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a language name or code")
            }
            fn visit_str<E>(self, v: &str) -> Result<Language, E> {
                Ok(Language(LanguageCode::from_name(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Language, E> {
                Ok(Language(
                    u8::try_from(v).map_or(LanguageCode::Other, LanguageCode::from_code),
                ))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Language, E> {
                Ok(Language(LanguageCode::Other))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Language, E> {
                Ok(Language(LanguageCode::Other))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Language, E> {
                Ok(Language(LanguageCode::Other))
            }
            fn visit_unit<E>(self) -> Result<Language, E> {
                Ok(Language(LanguageCode::Other))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Language, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Language(LanguageCode::Other))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Language, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Language(LanguageCode::Other))
            }
        }
        d.deserialize_any(V)
    }
}

/// One ext value: a string, number or boolean as text, None for null; any
/// other JSON value is an error before it is read.
struct Scalar(Option<String>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, number, boolean or null")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_owned())))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(Some(v.to_string())))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl RemotingCommand {
    /// True for a response ([`FLAG_RESPONSE`]).
    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    /// True for a oneway request ([`FLAG_ONEWAY`]): it gets no response.
    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// A request with `code` and the header `fields` (JSON header, Java,
    /// version 479: RocketMQ 5.3.3), opaque 0 (a client sets its own), no body.
    pub fn request<K: Into<String>, V: Into<String>>(
        code: i32,
        fields: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            code,
            language: LanguageCode::Java,
            version: 479,
            opaque: 0,
            flag: 0,
            remark: None,
            ext_fields: fields
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            body: Vec::new(),
            serialize_type: SerializeType::Json,
        }
    }

    /// The response to `request` with `code` and `remark`, in the request's
    /// serialization, echoing its opaque, no fields and no body.
    pub fn response_to(request: &RemotingCommand, code: i32, remark: Option<String>) -> Self {
        Self {
            code,
            language: LanguageCode::Java,
            version: request.version,
            opaque: request.opaque,
            flag: FLAG_RESPONSE,
            remark,
            ext_fields: BTreeMap::new(),
            body: Vec::new(),
            serialize_type: request.serialize_type,
        }
    }

    /// Decodes a frame's bytes after its length field
    /// ([`crate::frame::split_frame`]). Errors: `HeaderLength`,
    /// `SerializeType`, `Json`, `Binary` (among them more than
    /// [`MAX_EXT_FIELDS`] ext fields, a JSON ext value that is an array or an
    /// object). Reads no more than `frame` holds; what it allocates is bounded
    /// by the frame's size (a few times it for the ext fields' map). Lenient
    /// where Java is: a non-positive remark or ext length in a binary header
    /// is absent, and strings that are not UTF-8 are read with replacement
    /// characters.
    pub fn decode(frame: &[u8]) -> Result<Self, RemotingError> {
        let word = frame.get(..4).ok_or(RemotingError::HeaderLength {
            header_bytes: 4,
            frame_bytes: frame.len(),
        })?;
        let word = u32::from_be_bytes(word.try_into().expect("4 bytes"));
        let header_bytes = (word & 0x00ff_ffff) as usize;
        let header = frame
            .get(4..4 + header_bytes)
            .ok_or(RemotingError::HeaderLength {
                header_bytes,
                frame_bytes: frame.len(),
            })?;
        let body = frame[4 + header_bytes..].to_vec();
        match (word >> 24) as u8 {
            0 => decode_json(header, body),
            1 => decode_binary(header, body),
            other => Err(RemotingError::SerializeType(other)),
        }
    }

    /// The whole frame, length field first, header in
    /// [`RemotingCommand::serialize_type`]. Error: `TooLarge` (a header over
    /// [`MAX_HEADER_BYTES`], a frame over [`crate::DEFAULT_MAX_FRAME_BYTES`]
    /// with its length field, which clients refuse; in a ROCKETMQ header a code
    /// or version outside i16, a key over `i16::MAX` bytes).
    pub fn encode(&self) -> Result<Vec<u8>, RemotingError> {
        let header = match self.serialize_type {
            SerializeType::Json => self.json_header()?,
            SerializeType::RocketMq => self.binary_header()?,
        };
        if header.len() > MAX_HEADER_BYTES {
            return Err(RemotingError::TooLarge("a header over 16 MiB"));
        }
        let total = 8 + header.len() + self.body.len();
        if total > crate::DEFAULT_MAX_FRAME_BYTES {
            return Err(RemotingError::TooLarge("a frame over 16 MiB"));
        }
        let length = (total - 4) as i32;
        let mut out = Vec::with_capacity(8 + header.len() + self.body.len());
        out.extend_from_slice(&length.to_be_bytes());
        let word = (u32::from(self.serialize_type.code()) << 24) | header.len() as u32;
        out.extend_from_slice(&word.to_be_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    fn json_header(&self) -> Result<Vec<u8>, RemotingError> {
        let h = JsonHeaderOut {
            code: self.code,
            language: self.language.name(),
            version: self.version,
            opaque: self.opaque,
            flag: self.flag,
            remark: self.remark.as_deref(),
            ext_fields: &self.ext_fields,
            serialize_type_current_rpc: self.serialize_type.name(),
        };
        serde_json::to_vec(&h).map_err(|e| RemotingError::Json(e.to_string()))
    }

    fn binary_header(&self) -> Result<Vec<u8>, RemotingError> {
        let code =
            i16::try_from(self.code).map_err(|_| RemotingError::TooLarge("a code outside i16"))?;
        let version = i16::try_from(self.version)
            .map_err(|_| RemotingError::TooLarge("a version outside i16"))?;
        let mut ext = Vec::new();
        for (k, v) in &self.ext_fields {
            let klen =
                i16::try_from(k.len()).map_err(|_| RemotingError::TooLarge("a key over 32 KiB"))?;
            ext.extend_from_slice(&klen.to_be_bytes());
            ext.extend_from_slice(k.as_bytes());
            ext.extend_from_slice(&len_i32(v.len())?.to_be_bytes());
            ext.extend_from_slice(v.as_bytes());
        }
        let remark = self.remark.as_deref().unwrap_or("");
        let mut h = Vec::with_capacity(21 + remark.len() + ext.len());
        h.extend_from_slice(&code.to_be_bytes());
        h.push(self.language.code());
        h.extend_from_slice(&version.to_be_bytes());
        h.extend_from_slice(&self.opaque.to_be_bytes());
        h.extend_from_slice(&self.flag.to_be_bytes());
        h.extend_from_slice(&len_i32(remark.len())?.to_be_bytes());
        h.extend_from_slice(remark.as_bytes());
        h.extend_from_slice(&len_i32(ext.len())?.to_be_bytes());
        h.extend_from_slice(&ext);
        Ok(h)
    }
}

fn len_i32(n: usize) -> Result<i32, RemotingError> {
    i32::try_from(n).map_err(|_| RemotingError::TooLarge("a field over 2 GiB"))
}

fn decode_json(header: &[u8], body: Vec<u8>) -> Result<RemotingCommand, RemotingError> {
    // serde would also read a struct from an array; fastjson reads an object.
    if header.trim_ascii_start().first() != Some(&b'{') {
        return Err(RemotingError::Json(
            "the header is not a JSON object".into(),
        ));
    }
    let h: JsonHeaderIn =
        serde_json::from_slice(header).map_err(|e| RemotingError::Json(e.to_string()))?;
    Ok(RemotingCommand {
        code: h.code,
        language: h.language.map_or(LanguageCode::Other, |l| l.0),
        version: h.version.unwrap_or(0),
        opaque: h.opaque.unwrap_or(0),
        flag: h.flag.unwrap_or(0),
        remark: h.remark,
        ext_fields: h.ext_fields.map(|e| e.0).unwrap_or_default(),
        body,
        serialize_type: SerializeType::Json,
    })
}

/// A cursor over a binary header that fails instead of reading past it.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RemotingError> {
        if n > self.buf.len() {
            return Err(RemotingError::Binary("a length overruns the header"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RemotingError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A length field; a negative one reads as 0 (Java reads a length of at
    /// most 0 as an absent field).
    fn len_i32(&mut self) -> Result<usize, RemotingError> {
        Ok(usize::try_from(i32::from_be_bytes(self.array()?)).unwrap_or(0))
    }

    /// `n` bytes as a string, with replacement characters where they are not
    /// UTF-8 (as Java's decoder reads them).
    fn string(&mut self, n: usize) -> Result<String, RemotingError> {
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

fn decode_binary(header: &[u8], body: Vec<u8>) -> Result<RemotingCommand, RemotingError> {
    let mut r = Reader { buf: header };
    let code = i16::from_be_bytes(r.array()?).into();
    let language = LanguageCode::from_code(r.array::<1>()?[0]);
    let version = i16::from_be_bytes(r.array()?).into();
    let opaque = i32::from_be_bytes(r.array()?);
    let flag = i32::from_be_bytes(r.array()?);
    let remark_len = r.len_i32()?;
    let remark = if remark_len > 0 {
        Some(r.string(remark_len)?)
    } else {
        None
    };
    let ext_len = r.len_i32()?;
    let mut ext = Reader {
        buf: r.take(ext_len)?,
    };
    let mut ext_fields = BTreeMap::new();
    while !ext.buf.is_empty() {
        let klen = usize::try_from(i16::from_be_bytes(ext.array()?))
            .map_err(|_| RemotingError::Binary("a negative key length"))?;
        let key = ext.string(klen)?;
        let vlen = ext.len_i32()?;
        ext_fields.insert(key, ext.string(vlen)?);
        if ext_fields.len() > MAX_EXT_FIELDS {
            return Err(RemotingError::Binary("more than 1,024 ext fields"));
        }
    }
    Ok(RemotingCommand {
        code,
        language,
        version,
        opaque,
        flag,
        remark,
        ext_fields,
        body,
        serialize_type: SerializeType::RocketMq,
    })
}

#[cfg(test)]
mod tests;
