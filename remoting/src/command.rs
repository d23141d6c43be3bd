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
        Self::ALL.iter().position(|&l| l == self).expect("listed") as u8
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

#[derive(Serialize, Deserialize)]
struct JsonHeader {
    code: i32,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    version: i32,
    #[serde(default)]
    opaque: i32,
    #[serde(default)]
    flag: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remark: Option<String>,
    #[serde(rename = "extFields", default)]
    ext_fields: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "serializeTypeCurrentRPC", default)]
    serialize_type_current_rpc: Option<String>,
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
    /// `SerializeType`, `Json`, `Binary`, `Utf8`. Reads no more than `frame`
    /// holds and allocates no more than it.
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
    /// [`MAX_HEADER_BYTES`], a frame over `i32::MAX`; in a ROCKETMQ header a
    /// code or version outside i16, a key over `i16::MAX` bytes).
    pub fn encode(&self) -> Result<Vec<u8>, RemotingError> {
        let header = match self.serialize_type {
            SerializeType::Json => self.json_header()?,
            SerializeType::RocketMq => self.binary_header()?,
        };
        if header.len() > MAX_HEADER_BYTES {
            return Err(RemotingError::TooLarge("a header over 16 MiB"));
        }
        let length = i32::try_from(4 + header.len() + self.body.len())
            .map_err(|_| RemotingError::TooLarge("a frame over 2 GiB"))?;
        let mut out = Vec::with_capacity(8 + header.len() + self.body.len());
        out.extend_from_slice(&length.to_be_bytes());
        let word = (u32::from(self.serialize_type.code()) << 24) | header.len() as u32;
        out.extend_from_slice(&word.to_be_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    fn json_header(&self) -> Result<Vec<u8>, RemotingError> {
        let h = JsonHeader {
            code: self.code,
            language: Some(self.language.name().into()),
            version: self.version,
            opaque: self.opaque,
            flag: self.flag,
            remark: self.remark.clone(),
            ext_fields: Some(
                self.ext_fields
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect(),
            ),
            serialize_type_current_rpc: Some(self.serialize_type.name().into()),
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
    let h: JsonHeader =
        serde_json::from_slice(header).map_err(|e| RemotingError::Json(e.to_string()))?;
    let mut ext_fields = BTreeMap::new();
    for (k, v) in h.ext_fields.unwrap_or_default() {
        // Values are strings; a client that writes a number or a boolean is
        // read as its text, a null as absent (fastjson skips null fields).
        let v = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Null => continue,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(RemotingError::Json(format!(
                    "extFields value of {k:?} is not a string"
                )))
            }
        };
        ext_fields.insert(k, v);
    }
    Ok(RemotingCommand {
        code: h.code,
        language: h
            .language
            .as_deref()
            .map_or(LanguageCode::Other, LanguageCode::from_name),
        version: h.version,
        opaque: h.opaque,
        flag: h.flag,
        remark: h.remark,
        ext_fields,
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

    /// A length field, which must not be negative.
    fn len_i32(&mut self) -> Result<usize, RemotingError> {
        usize::try_from(i32::from_be_bytes(self.array()?))
            .map_err(|_| RemotingError::Binary("a negative length"))
    }

    fn string(&mut self, n: usize) -> Result<String, RemotingError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| RemotingError::Utf8)
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
