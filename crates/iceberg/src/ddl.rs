//! The Iceberg side of catalog changes through SQL: `PARTITIONED BY` terms, Iceberg-
//! compatible column types, `ALTER TABLE` column operations. The policy's write rules
//! over them live in `clearice-access`.
//!
//! DataFusion's parser has no `PARTITIONED BY` with transforms (Spark's and Trino's
//! syntax), so the clause is rewritten into the table name before parsing, as time
//! travel is:
//!
//! ```text
//!  CREATE TABLE t PARTITIONED BY (region, days(ts)) AS SELECT …
//!      ─▶ CREATE TABLE "t@partitioned_by=region, days(ts)" AS SELECT …
//! ```

use std::borrow::Cow;

use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, TimeUnit};
use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Word};
use iceberg::spec::Transform;

/// The table-name suffix carrying a `PARTITIONED BY` clause.
const PARTITIONED_BY: &str = "@partitioned_by=";

/// Splits `t@partitioned_by=…` into the table name and the clause's terms.
pub fn split_partitioned(name: &str) -> (&str, Option<&str>) {
    match name.split_once(PARTITIONED_BY) {
        Some((t, terms)) => (t, Some(terms)),
        None => (name, None),
    }
}

fn is_kw(t: &Token, k: Keyword) -> bool {
    matches!(t, Token::Word(w) if w.keyword == k && w.quote_style.is_none())
}

fn significant(tokens: &[Token]) -> Vec<usize> {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t, Token::Whitespace(_)))
        .map(|(i, _)| i)
        .collect()
}

/// Rewrites `CREATE TABLE name … [USING iceberg] PARTITIONED BY (terms) …` into
/// `CREATE TABLE "name@partitioned_by=terms" …` (see the module docs); `USING iceberg`
/// (Spark) is dropped. Other SQL is returned as is.
pub fn rewrite_create(sql: &str) -> Result<Cow<'_, str>> {
    let upper = sql.to_ascii_uppercase();
    if !upper.contains("CREATE") || !(upper.contains("PARTITIONED") || upper.contains("USING")) {
        return Ok(Cow::Borrowed(sql));
    }
    let Ok(all) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(Cow::Borrowed(sql));
    };
    // Statement by statement (a script has several).
    let mut out = String::with_capacity(sql.len() + 32);
    let mut changed = false;
    for stmt in all.split_inclusive(|t| matches!(t, Token::SemiColon)) {
        match rewrite_statement(stmt)? {
            Some(s) => {
                out.push_str(&s);
                changed = true;
            }
            None => out.extend(stmt.iter().map(|t| t.to_string())),
        }
    }
    Ok(if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(sql)
    })
}

/// [`rewrite_create`] of one statement's tokens; `None` if unchanged.
fn rewrite_statement(tokens: &[Token]) -> Result<Option<String>> {
    let sig = significant(tokens);
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    // CREATE [OR REPLACE] TABLE [IF NOT EXISTS] name
    let mut k = 0;
    if !at(k).is_some_and(|t| is_kw(t, Keyword::CREATE)) {
        return Ok(None);
    }
    k += 1;
    if at(k).is_some_and(|t| is_kw(t, Keyword::OR)) {
        k += 2;
    }
    if !at(k).is_some_and(|t| is_kw(t, Keyword::TABLE)) {
        return Ok(None);
    }
    k += 1;
    if at(k).is_some_and(|t| is_kw(t, Keyword::IF)) {
        k += 3;
    }
    // The name: words joined by periods; its last word gets the suffix.
    let mut name_last = None;
    while let Some(Token::Word(_)) = at(k) {
        name_last = Some(sig[k]);
        if matches!(at(k + 1), Some(Token::Period)) {
            k += 2;
        } else {
            k += 1;
            break;
        }
    }
    let Some(name_last) = name_last else {
        return Ok(None);
    };
    // Find the clauses at parenthesis depth 0.
    let mut depth = 0i32;
    let mut remove: Vec<(usize, usize)> = Vec::new();
    let mut terms: Option<String> = None;
    let mut j = k;
    while j < sig.len() {
        let t = &tokens[sig[j]];
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ if depth == 0 && is_kw(t, Keyword::AS) => break,
            _ if depth == 0
                && is_kw(t, Keyword::USING)
                && matches!(at(j + 1), Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("iceberg")) =>
            {
                remove.push((sig[j], sig[j + 1]));
                j += 2;
                continue;
            }
            _ if depth == 0
                && is_kw(t, Keyword::PARTITIONED)
                && at(j + 1).is_some_and(|t| is_kw(t, Keyword::BY))
                && matches!(at(j + 2), Some(Token::LParen)) =>
            {
                // The balanced parentheses after BY.
                let open = j + 2;
                let mut d = 0i32;
                let mut close = None;
                for (m, &i) in sig.iter().enumerate().skip(open) {
                    match tokens[i] {
                        Token::LParen => d += 1,
                        Token::RParen => {
                            d -= 1;
                            if d == 0 {
                                close = Some(m);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let Some(close) = close else {
                    return Err(DataFusionError::Plan(
                        "PARTITIONED BY: unbalanced parentheses".into(),
                    ));
                };
                let text: String = tokens[sig[open] + 1..sig[close]]
                    .iter()
                    .map(|t| t.to_string())
                    .collect();
                if text.contains('"') {
                    return Err(DataFusionError::Plan(
                        "PARTITIONED BY: quoted column names are not supported here; name the columns without quotes".into(),
                    ));
                }
                terms = Some(text.trim().to_owned());
                remove.push((sig[j], sig[close]));
                j = close + 1;
                continue;
            }
            _ => {}
        }
        j += 1;
    }
    if remove.is_empty() {
        return Ok(None);
    }
    let mut out = String::new();
    for (i, t) in tokens.iter().enumerate() {
        if remove.iter().any(|(a, b)| (*a..=*b).contains(&i)) {
            continue;
        }
        if i == name_last
            && let Some(terms) = &terms
            && let Token::Word(w) = t
        {
            let base = if w.quote_style.is_some() {
                w.value.clone()
            } else {
                w.value.to_lowercase()
            };
            out.push_str(
                &Token::Word(Word {
                    value: format!("{base}{PARTITIONED_BY}{terms}"),
                    quote_style: Some('"'),
                    keyword: Keyword::NoKeyword,
                })
                .to_string(),
            );
            continue;
        }
        out.push_str(&t.to_string());
    }
    Ok(Some(out))
}

/// One change of `ALTER TABLE`.
#[derive(Debug, Clone)]
pub enum AlterColumn {
    /// `ADD COLUMN name type`.
    Add {
        /// Column name.
        name: String,
        /// Its type.
        data_type: DataType,
        /// `NULL` allowed (new columns must be).
        nullable: bool,
    },
    /// `DROP COLUMN [IF EXISTS] name`.
    Drop {
        /// Column name.
        name: String,
        /// No error if absent.
        if_exists: bool,
    },
    /// `RENAME COLUMN from TO to`.
    Rename {
        /// Current name.
        from: String,
        /// New name.
        to: String,
    },
}

/// One `PARTITIONED BY` term: a source column and a transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTerm {
    /// Source column.
    pub column: String,
    /// Iceberg transform.
    pub transform: Transform,
}

/// Parses `region, days(ts), bucket(16, id), truncate(id, 4)` (Spark's and Trino's
/// names: `year`/`years`, `month`/`months`, `day`/`days`, `hour`/`hours`, `bucket`,
/// `truncate`, with the number first or last).
pub fn parse_partitioning(text: &str) -> Result<Vec<PartitionTerm>, String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    for p in parts {
        let p = p.trim();
        if p.is_empty() {
            return Err("PARTITIONED BY has an empty term".into());
        }
        let Some((func, rest)) = p.split_once('(') else {
            out.push(PartitionTerm {
                column: p.to_lowercase(),
                transform: Transform::Identity,
            });
            continue;
        };
        let args: Vec<&str> = rest
            .trim_end()
            .strip_suffix(')')
            .ok_or_else(|| format!("PARTITIONED BY term '{p}' is not closed"))?
            .split(',')
            .map(str::trim)
            .collect();
        let func = func.trim().to_lowercase();
        let one = |t: Transform| -> Result<PartitionTerm, String> {
            match args.as_slice() {
                [c] => Ok(PartitionTerm {
                    column: c.to_lowercase(),
                    transform: t,
                }),
                _ => Err(format!("PARTITIONED BY {func}(column) takes one column")),
            }
        };
        let with_n = |make: fn(u32) -> Transform| -> Result<PartitionTerm, String> {
            let (n, c) = match args.as_slice() {
                [a, b] if a.parse::<u32>().is_ok() => (a.parse::<u32>().expect("number"), b),
                [a, b] if b.parse::<u32>().is_ok() => (b.parse::<u32>().expect("number"), a),
                _ => {
                    return Err(format!(
                        "PARTITIONED BY {func}(n, column) takes a number and a column"
                    ));
                }
            };
            if n == 0 {
                return Err(format!(
                    "PARTITIONED BY {func}: the number must be positive"
                ));
            }
            Ok(PartitionTerm {
                column: c.to_lowercase(),
                transform: make(n),
            })
        };
        out.push(match func.as_str() {
            "identity" => one(Transform::Identity)?,
            "year" | "years" => one(Transform::Year)?,
            "month" | "months" => one(Transform::Month)?,
            "day" | "days" | "date" => one(Transform::Day)?,
            "hour" | "hours" | "date_hour" => one(Transform::Hour)?,
            "bucket" => with_n(Transform::Bucket)?,
            "truncate" => with_n(Transform::Truncate)?,
            other => {
                return Err(format!(
                    "PARTITIONED BY: unknown transform '{other}' (identity, year, month, day, hour, bucket, truncate)"
                ));
            }
        });
    }
    Ok(out)
}

/// An Arrow type Iceberg can hold (see [`iceberg_compatible`]).
pub fn iceberg_compatible_type(t: &DataType) -> DataType {
    iceberg_compatible(&ArrowSchema::new(vec![Field::new("c", t.clone(), true)]))
        .field(0)
        .data_type()
        .clone()
}

/// An Arrow schema Iceberg can hold: the types DataFusion produces mapped to Iceberg's
/// (views and large types to plain, small integers to int, timestamps to microseconds).
pub fn iceberg_compatible(schema: &ArrowSchema) -> ArrowSchema {
    fn ty(t: &DataType) -> DataType {
        match t {
            DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
            DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
            DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => {
                DataType::Int32
            }
            DataType::UInt32 => DataType::Int64,
            DataType::Float16 => DataType::Float32,
            DataType::Date64 => DataType::Date32,
            DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, tz) => {
                DataType::Timestamp(TimeUnit::Microsecond, tz.clone())
            }
            DataType::Dictionary(_, v) => ty(v),
            other => other.clone(),
        }
    }
    ArrowSchema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), ty(f.data_type()), f.is_nullable()))
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioned_by_moves_into_the_name() {
        let sql = "CREATE TABLE lake.s.t PARTITIONED BY (region, days(ts)) AS SELECT 1";
        assert_eq!(
            rewrite_create(sql).unwrap(),
            "CREATE TABLE lake.s.\"t@partitioned_by=region, days(ts)\"  AS SELECT 1"
        );
        let spark = "create table if not exists t (id bigint, ts timestamp) using iceberg partitioned by (bucket(16, id))";
        let out = rewrite_create(spark).unwrap();
        assert!(out.contains("\"t@partitioned_by=bucket(16, id)\""), "{out}");
        assert!(!out.to_lowercase().contains("iceberg"), "{out}");
        // untouched: no clause, or the words inside the query
        let q = "CREATE TABLE t AS SELECT 'PARTITIONED BY (x)' AS c";
        assert_eq!(rewrite_create(q).unwrap(), q);
        assert_eq!(rewrite_create("SELECT 1").unwrap(), "SELECT 1");
    }

    #[test]
    fn partition_terms_parse_spark_and_trino_forms() {
        let t = parse_partitioning("region, days(ts), bucket(16, id), truncate(name, 4), year(d)")
            .unwrap();
        assert_eq!(
            t.iter().map(|t| t.transform).collect::<Vec<_>>(),
            vec![
                Transform::Identity,
                Transform::Day,
                Transform::Bucket(16),
                Transform::Truncate(4),
                Transform::Year
            ]
        );
        assert_eq!(t[3].column, "name");
        assert!(
            parse_partitioning("zorder(a)")
                .unwrap_err()
                .contains("unknown transform")
        );
        assert!(parse_partitioning("bucket(id)").is_err());
    }
}
