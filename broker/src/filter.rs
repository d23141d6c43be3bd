//! Tag filter expressions of a subscription (RocketMQ's `SubscriptionData`): `*` or
//! empty for every message, or tags joined by `||`. A ConsumeQueue entry is first
//! checked by its tag hash, then the record's tag exactly (hashes collide). No I/O.

use std::collections::BTreeSet;

use ledgermq_store::record::tag_hash;

use crate::error::{refuse, BrokerError, ErrorKind};

/// A subscription's filter expression as a client sends it (5.x
/// `FilterExpression`, 4.x `expressionType` and `subString`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterExpr {
    /// A TAG expression: `*`, empty, or `a||b||c`.
    Tag(String),
    /// An SQL92 expression over properties (not supported).
    Sql92(String),
}

/// A parsed tag filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    /// Every message.
    All,
    /// Messages whose tag is one of these (with their ConsumeQueue tag hashes).
    Tags {
        /// The tags.
        tags: BTreeSet<String>,
        /// Their tag hashes.
        hashes: BTreeSet<i64>,
    },
}

impl TagFilter {
    /// Parses a TAG expression (`*`, empty, or `a||b||c`; blanks around tags are
    /// trimmed). Errors: `ILLEGAL_FILTER_EXPRESSION` for empty alternatives,
    /// `UNSUPPORTED` for SQL92 filters (not built).
    pub fn parse(expr: Option<&FilterExpr>) -> Result<Self, BrokerError> {
        let s = match expr {
            None => return Ok(TagFilter::All),
            Some(FilterExpr::Sql92(_)) => {
                return Err(refuse(
                    ErrorKind::Unsupported,
                    "SQL92 filters are not supported",
                ))
            }
            Some(FilterExpr::Tag(e)) => e.trim(),
        };
        if s.is_empty() || s == "*" {
            return Ok(TagFilter::All);
        }
        let mut tags = BTreeSet::new();
        for t in s.split("||").map(str::trim) {
            if t.is_empty() || t.contains('|') {
                return Err(refuse(
                    ErrorKind::IllegalFilterExpression,
                    format!("tag expression {s:?} is illegal: use * or tagA||tagB"),
                ));
            }
            if t == "*" {
                return Ok(TagFilter::All);
            }
            tags.insert(t.to_owned());
        }
        let hashes = tags.iter().map(|t| tag_hash(Some(t))).collect();
        Ok(TagFilter::Tags { tags, hashes })
    }

    /// First check, on a ConsumeQueue entry's tag hash.
    pub fn accepts_hash(&self, hash: i64) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags { hashes, .. } => hashes.contains(&hash),
        }
    }

    /// Exact check on the record's tag.
    pub fn accepts_tag(&self, tag: Option<&str>) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags { tags, .. } => tag.is_some_and(|t| tags.contains(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(s: &str) -> FilterExpr {
        FilterExpr::Tag(s.into())
    }

    #[test]
    fn expressions_parse_and_match() {
        assert_eq!(TagFilter::parse(None).unwrap(), TagFilter::All);
        assert_eq!(TagFilter::parse(Some(&tag("*"))).unwrap(), TagFilter::All);
        assert_eq!(TagFilter::parse(Some(&tag(""))).unwrap(), TagFilter::All);
        let f = TagFilter::parse(Some(&tag("a || b"))).unwrap();
        assert!(f.accepts_hash(tag_hash(Some("a"))));
        assert!(f.accepts_hash(tag_hash(Some("b"))));
        assert!(!f.accepts_hash(tag_hash(Some("c"))));
        assert!(!f.accepts_hash(0));
        assert!(f.accepts_tag(Some("a")));
        assert!(!f.accepts_tag(Some("c")));
        assert!(!f.accepts_tag(None));
        // "Aa" and "BB" share a Java hash code: the exact check tells them apart.
        let f = TagFilter::parse(Some(&tag("Aa"))).unwrap();
        assert!(f.accepts_hash(tag_hash(Some("BB"))));
        assert!(!f.accepts_tag(Some("BB")));
    }

    #[test]
    fn bad_expressions_are_refused() {
        for bad in ["a||", "||a", "a|||b", "a|b"] {
            let e = TagFilter::parse(Some(&tag(bad))).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::IllegalFilterExpression, "{bad}");
        }
        let sql = FilterExpr::Sql92("a > 1".into());
        assert_eq!(
            TagFilter::parse(Some(&sql)).unwrap_err().kind(),
            ErrorKind::Unsupported
        );
    }
}
