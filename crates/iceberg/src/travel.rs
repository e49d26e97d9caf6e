//! Time travel and metadata table names.
//!
//! DataFusion's SQL parser (generic dialect) has no time travel clause, so the clause is
//! rewritten before parsing into a table name the catalog resolves:
//!
//! ```text
//!  FROM t FOR VERSION AS OF 123        (Trino)        ─▶ FROM "t@version=123" AS t
//!  FROM t VERSION AS OF 'audit'        (Spark; a ref) ─▶ FROM "t@ref=audit" AS t
//!  FROM t FOR TIMESTAMP AS OF TIMESTAMP '2024-01-01 00:00:00'
//!  FROM t TIMESTAMP AS OF '2024-01-01' (Spark)        ─▶ FROM "t@timestamp_ms=1704067200000" AS t
//!  FROM t FOR SYSTEM_TIME AS OF '…'    (SQL:2011)
//! ```
//!
//! Metadata tables are named like Trino's: `"t$snapshots"`, `"t$history"`,
//! `"t$manifests"`, `"t$files"`, `"t$partitions"`, `"t$refs"`.

use std::borrow::Cow;

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Whitespace, Word};

use crate::provider::AsOf;

/// A metadata table of an Iceberg table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTable {
    /// `$snapshots`: every snapshot with its operation and summary.
    Snapshots,
    /// `$history`: when each snapshot became current.
    History,
    /// `$manifests`: the current snapshot's manifests.
    Manifests,
    /// `$files`: the current snapshot's data and delete files.
    Files,
    /// `$partitions`: files and rows per partition.
    Partitions,
    /// `$refs`: branches and tags.
    Refs,
}

impl MetadataTable {
    /// The suffix naming it (`files` for `"t$files"`).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("", |(s, _)| s)
    }

    /// Every metadata table, with its suffix.
    pub const ALL: [(&'static str, MetadataTable); 6] = [
        ("snapshots", Self::Snapshots),
        ("history", Self::History),
        ("manifests", Self::Manifests),
        ("files", Self::Files),
        ("partitions", Self::Partitions),
        ("refs", Self::Refs),
    ];
}

/// What a table name asks for besides the table itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameSuffix {
    /// The table.
    None,
    /// The table as of a snapshot.
    AsOf(AsOf),
    /// One of its metadata tables.
    Metadata(MetadataTable),
    /// One of its metadata tables, as of a snapshot (`$files`, `$partitions` and
    /// `$manifests` list that snapshot's files).
    MetadataAsOf(MetadataTable, AsOf),
}

impl NameSuffix {
    /// The metadata table asked for, if any.
    pub fn metadata(&self) -> Option<MetadataTable> {
        match self {
            Self::Metadata(m) | Self::MetadataAsOf(m, _) => Some(*m),
            _ => None,
        }
    }

    /// The snapshot asked for, if any.
    pub fn as_of(&self) -> Option<&AsOf> {
        match self {
            Self::AsOf(a) | Self::MetadataAsOf(_, a) => Some(a),
            _ => None,
        }
    }
}

fn metadata_of(name: &str) -> Option<(&str, MetadataTable)> {
    let (base, suffix) = name.rsplit_once('$')?;
    let (_, kind) = MetadataTable::ALL.iter().find(|(s, _)| *s == suffix)?;
    Some((base, *kind))
}

fn as_of_of(suffix: &str) -> Option<AsOf> {
    match suffix.split_once('=') {
        Some(("version", v)) => v.parse().ok().map(AsOf::Version),
        Some(("timestamp_ms", v)) => v.parse().ok().map(AsOf::Timestamp),
        Some(("ref", r)) if !r.is_empty() => Some(AsOf::Ref(r.to_owned())),
        _ => None,
    }
}

/// Splits `t@version=1`, `t$files` and `t$files@version=1` into the table name and what
/// it asks for. A name whose suffix is not one of ours is taken as a plain table name.
pub fn split_name(name: &str) -> (&str, NameSuffix) {
    if let Some((left, right)) = name.split_once('@')
        && let Some(as_of) = as_of_of(right)
    {
        return match metadata_of(left) {
            Some((base, kind)) => (base, NameSuffix::MetadataAsOf(kind, as_of)),
            None => (left, NameSuffix::AsOf(as_of)),
        };
    }
    match metadata_of(name) {
        Some((base, kind)) => (base, NameSuffix::Metadata(kind)),
        None => (name, NameSuffix::None),
    }
}

/// Rewrites time travel clauses into table names (see the module docs). SQL without
/// one is returned as is; SQL the tokenizer rejects is left to the parser's message.
pub fn rewrite_sql(sql: &str) -> Result<Cow<'_, str>> {
    // `PARTITIONED BY` of CREATE TABLE, then time travel clauses.
    match crate::ddl::rewrite_create(sql)? {
        Cow::Borrowed(_) => rewrite_time_travel(sql),
        Cow::Owned(s) => Ok(Cow::Owned(rewrite_time_travel(&s)?.into_owned())),
    }
}

fn rewrite_time_travel(sql: &str) -> Result<Cow<'_, str>> {
    // Fast path: no time travel clause without the word OF.
    if !sql.to_ascii_uppercase().contains("OF") {
        return Ok(Cow::Borrowed(sql));
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(Cow::Borrowed(sql));
    };
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len() + 4);
    let mut i = 0;
    let mut changed = false;
    while i < tokens.len() {
        if let Some((spec, end)) = clause_at(&tokens, i)?
            && let Some(ident_at) = last_significant(&out)
            && let Token::Word(w) = &out[ident_at]
            && w.keyword != Keyword::AS
        {
            let original = w.clone();
            let base = if original.quote_style.is_some() {
                original.value.clone()
            } else {
                original.value.to_lowercase()
            };
            out[ident_at] = Token::Word(Word {
                value: format!("{base}@{spec}"),
                quote_style: Some('"'),
                keyword: Keyword::NoKeyword,
            });
            // Drop the whitespace before the clause, then the clause.
            while matches!(out.last(), Some(Token::Whitespace(_))) {
                out.pop();
            }
            if !has_alias(&tokens, end) {
                out.push(Token::Whitespace(Whitespace::Space));
                out.push(Token::make_keyword("AS"));
                out.push(Token::Whitespace(Whitespace::Space));
                out.push(Token::Word(Word {
                    value: base,
                    quote_style: Some('"'),
                    keyword: Keyword::NoKeyword,
                }));
            }
            changed = true;
            i = end;
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    if !changed {
        return Ok(Cow::Borrowed(sql));
    }
    Ok(Cow::Owned(out.iter().map(|t| t.to_string()).collect()))
}

fn last_significant(tokens: &[Token]) -> Option<usize> {
    tokens
        .iter()
        .rposition(|t| !matches!(t, Token::Whitespace(_)))
}

/// Index of the next significant token at or after `i`.
fn next_significant(tokens: &[Token], mut i: usize) -> Option<usize> {
    while i < tokens.len() {
        if !matches!(tokens[i], Token::Whitespace(_)) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn is_kw(t: &Token, k: Keyword) -> bool {
    matches!(t, Token::Word(w) if w.keyword == k && w.quote_style.is_none())
}

/// A time travel clause starting at token `i`: the name suffix and the index after it.
fn clause_at(tokens: &[Token], i: usize) -> Result<Option<(String, usize)>> {
    let mut words = Vec::new();
    let mut at = i;
    // Up to four keywords: [FOR] VERSION|TIMESTAMP|SYSTEM_TIME AS OF.
    while words.len() < 4 {
        let Some(j) = next_significant(tokens, at) else {
            break;
        };
        if j != at && words.is_empty() {
            return Ok(None);
        }
        match &tokens[j] {
            Token::Word(w) if w.quote_style.is_none() => words.push((w.keyword, j)),
            _ => break,
        }
        at = j + 1;
        if words.len() >= 3
            && words[words.len() - 2].0 == Keyword::AS
            && words[words.len() - 1].0 == Keyword::OF
        {
            break;
        }
    }
    let kinds: Vec<Keyword> = words.iter().map(|w| w.0).collect();
    let timestamp = match kinds.as_slice() {
        [Keyword::FOR, Keyword::VERSION, Keyword::AS, Keyword::OF]
        | [Keyword::VERSION, Keyword::AS, Keyword::OF] => false,
        [
            Keyword::FOR,
            Keyword::TIMESTAMP | Keyword::SYSTEM_TIME,
            Keyword::AS,
            Keyword::OF,
        ]
        | [Keyword::TIMESTAMP, Keyword::AS, Keyword::OF] => true,
        _ => return Ok(None),
    };
    let after_of = words.last().expect("matched").1 + 1;
    let Some(v) = next_significant(tokens, after_of) else {
        return Err(plan("a time travel clause needs a value after AS OF"));
    };
    let (value, end) = match &tokens[v] {
        // TIMESTAMP '...' literal.
        t if is_kw(t, Keyword::TIMESTAMP) => {
            match next_significant(tokens, v + 1).map(|j| (&tokens[j], j)) {
                Some((Token::SingleQuotedString(s), j)) => (Value::Text(s.clone()), j + 1),
                _ => {
                    return Err(plan(
                        "TIMESTAMP AS OF needs a literal such as TIMESTAMP '2024-01-01 00:00:00'",
                    ));
                }
            }
        }
        Token::SingleQuotedString(s) => (Value::Text(s.clone()), v + 1),
        Token::Number(n, _) => (Value::Number(n.clone()), v + 1),
        other => {
            return Err(plan(&format!(
                "time travel needs a literal snapshot id, ref name or timestamp after AS OF, not '{other}'"
            )));
        }
    };
    let spec = match (timestamp, value) {
        (false, Value::Number(n)) => {
            let id: i64 = n
                .parse()
                .map_err(|_| plan(&format!("'{n}' is not a snapshot id")))?;
            format!("version={id}")
        }
        (false, Value::Text(r)) => format!("ref={r}"),
        (true, Value::Number(n)) => {
            let secs: i64 = n
                .parse()
                .map_err(|_| plan(&format!("'{n}' is not a number of seconds since the epoch")))?;
            format!("timestamp_ms={}", secs.saturating_mul(1000))
        }
        (true, Value::Text(t)) => format!("timestamp_ms={}", parse_timestamp_ms(&t)?),
    };
    Ok(Some((spec, end)))
}

enum Value {
    Number(String),
    Text(String),
}

fn plan(msg: &str) -> DataFusionError {
    DataFusionError::Plan(msg.to_owned())
}

/// Whether the table reference ending before token `i` is followed by an alias.
fn has_alias(tokens: &[Token], i: usize) -> bool {
    match next_significant(tokens, i).map(|j| &tokens[j]) {
        Some(Token::Word(w)) => {
            w.keyword == Keyword::AS || w.keyword == Keyword::NoKeyword || w.quote_style.is_some()
        }
        _ => false,
    }
}

/// Milliseconds since the epoch of a timestamp literal: RFC 3339, or
/// `YYYY-MM-DD[ HH:MM:SS[.fff]]` taken as UTC.
pub fn parse_timestamp_ms(text: &str) -> Result<i64> {
    let t = text.trim();
    if let Ok(dt) = chrono::DateTime::parse_from_rfc3339(t) {
        return Ok(dt.timestamp_millis());
    }
    for f in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(dt) = chrono::NaiveDateTime::parse_from_str(t, f) {
            return Ok(dt.and_utc().timestamp_millis());
        }
    }
    for f in ["%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%d %H:%M:%S%.f %Z"] {
        if let Ok(dt) = chrono::DateTime::parse_from_str(t, f) {
            return Ok(dt.timestamp_millis());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp_millis());
    }
    Err(plan(&format!(
        "cannot read time travel timestamp '{text}' (use 'YYYY-MM-DD HH:MM:SS[.fff]' in UTC, or RFC 3339)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(sql: &str) -> String {
        rewrite_sql(sql).unwrap().into_owned()
    }

    #[test]
    fn trino_and_spark_forms() {
        assert_eq!(
            rw("SELECT * FROM lake.db.t FOR VERSION AS OF 123 WHERE id = 1"),
            "SELECT * FROM lake.db.\"t@version=123\" AS \"t\" WHERE id = 1"
        );
        assert_eq!(
            rw("select * from t version as of 'audit' x"),
            "select * from \"t@ref=audit\" x"
        );
        assert_eq!(
            rw("SELECT 1 FROM t FOR TIMESTAMP AS OF TIMESTAMP '2024-01-01 00:00:01.5'"),
            "SELECT 1 FROM \"t@timestamp_ms=1704067201500\" AS \"t\""
        );
        assert_eq!(
            rw("SELECT 1 FROM T TIMESTAMP AS OF '2024-01-01' AS o JOIN u ON true"),
            "SELECT 1 FROM \"t@timestamp_ms=1704067200000\" AS o JOIN u ON true"
        );
        assert_eq!(
            rw("SELECT 1 FROM t\n\tFOR  VERSION\tAS OF 7"),
            "SELECT 1 FROM \"t@version=7\" AS \"t\""
        );
        assert_eq!(
            rw("SELECT 1 FROM t FOR SYSTEM_TIME AS OF 1704067200"),
            "SELECT 1 FROM \"t@timestamp_ms=1704067200000\" AS \"t\""
        );
    }

    #[test]
    fn other_sql_is_untouched() {
        for sql in [
            "SELECT CAST(x AS TIMESTAMP) AS of FROM t",
            "SELECT 'VERSION AS OF 1' FROM t",
            "SELECT * FROM t",
        ] {
            assert!(
                matches!(rewrite_sql(sql).unwrap(), Cow::Borrowed(_)),
                "{sql}"
            );
        }
    }

    #[test]
    fn bad_values_are_plan_errors() {
        let e = rewrite_sql("SELECT * FROM t FOR TIMESTAMP AS OF 'yesterday'").unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot read time travel timestamp 'yesterday'"),
            "{e}"
        );
        let e = rewrite_sql("SELECT * FROM t FOR VERSION AS OF now()").unwrap_err();
        assert!(e.to_string().contains("needs a literal"), "{e}");
    }

    #[test]
    fn names_split() {
        assert_eq!(
            split_name("t@version=5"),
            ("t", NameSuffix::AsOf(AsOf::Version(5)))
        );
        assert_eq!(
            split_name("t@ref=a@b"),
            ("t", NameSuffix::AsOf(AsOf::Ref("a@b".into())))
        );
        assert_eq!(
            split_name("t$files"),
            ("t", NameSuffix::Metadata(MetadataTable::Files))
        );
        assert_eq!(split_name("t$other"), ("t$other", NameSuffix::None));
        assert_eq!(
            split_name("t$files@version=3"),
            (
                "t",
                NameSuffix::MetadataAsOf(MetadataTable::Files, AsOf::Version(3))
            )
        );
        assert_eq!(split_name("plain"), ("plain", NameSuffix::None));
    }
}
