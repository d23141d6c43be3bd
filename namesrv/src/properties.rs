//! Java `.properties` files as `java.util.Properties.load(InputStream)` reads
//! them: ISO 8859-1 bytes (every byte one character), `\uXXXX` escapes, `#`
//! and `!` comments, line continuations; parsed with the `java-properties`
//! crate, whose own default decoding (Windows-1252) differs for bytes
//! 0x80-0x9F. Used for RocketMQ configuration files by `mqnamesrv` and
//! `mqbroker`.

use std::collections::BTreeMap;

/// The keys and values of the properties file `bytes`, a later key replacing
/// an earlier one. Error: a malformed file (a bad `\u` escape), with its line.
pub fn read(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let text: String = bytes.iter().map(|&b| char::from(b)).collect();
    let mut out = BTreeMap::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, v| {
            out.insert(k, v);
        })
        .map_err(|e| format!("not a properties file: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_iso_8859_1_and_escapes_are_read() {
        let p = super::read(b"a=caf\xe9\nb=\x80\nc=\\u00e9t\\u00e9\n# x=1\nd = 1 \\\n  2").unwrap();
        assert_eq!(p["a"], "caf\u{e9}");
        // 0x80 is U+0080 in ISO 8859-1 (Windows-1252 would read the euro sign).
        assert_eq!(p["b"], "\u{80}");
        assert_eq!(p["c"], "\u{e9}t\u{e9}");
        assert_eq!(p["d"], "1 2");
        assert!(!p.contains_key("x"));
        assert!(super::read(b"a=\\u12").is_err());
    }
}
