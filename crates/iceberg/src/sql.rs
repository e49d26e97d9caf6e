//! ClearIce's SQL parser: DataFusion's parser, plus the table clauses of Spark and Trino
//! that DataFusion's dialects do not parse, put into the statement's AST as typed nodes.
//!
//! ```text
//!  SQL text ─▶ tokens (the session's dialect)
//!   ├─ after a table name: FOR VERSION AS OF 123 · VERSION AS OF 'tag' (Spark; a ref)
//!   │  FOR TIMESTAMP AS OF TIMESTAMP '…' · TIMESTAMP AS OF '…' · FOR SYSTEM_TIME AS OF …
//!   │     ─▶ taken out of the tokens; becomes that table factor's `version`
//!   │        (sqlparser's TableVersion: VersionAsOf / TimestampAsOf)
//!   └─ CREATE TABLE name … [USING iceberg] PARTITIONED BY (region, days(ts)) …
//!         ─▶ taken out; becomes the CreateTable's `partition_by` expression
//!  the other tokens ─▶ DFParser ─▶ Statement (Display prints the clauses back in a form
//!                                  this parser reads again)
//! ```
//!
//! The typed nodes are planned by [`crate::travel::TravelPlanner`] (a DataFusion
//! `RelationPlanner`) and read by [`crate::ddl::partition_terms`]. A clause found where
//! no table is read (`INSERT INTO t FOR VERSION AS OF 1 …`) is an error, never dropped.

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::parser::{DFParserBuilder, Statement};
use datafusion::sql::sqlparser::ast::{
    self, Expr, TableFactor, TableVersion, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

/// Parses SQL text into statements with `dialect` (see the module docs).
pub fn parse_statements(
    sql: &str,
    dialect: &dyn Dialect,
    recursion_limit: usize,
) -> Result<Vec<Statement>> {
    let tokens = Tokenizer::new(dialect, sql)
        .tokenize_with_location()
        .map_err(ParserError::from)?;
    let mut clauses = Clauses::default();
    let tokens = clauses.take(tokens, dialect, recursion_limit)?;
    let mut statements: Vec<Statement> = DFParserBuilder::new(tokens)
        .with_dialect(dialect)
        .with_recursion_limit(recursion_limit)
        .build()?
        .parse_statements()?
        .into();
    for s in &mut statements {
        clauses.attach(s);
    }
    clauses.all_attached()?;
    for s in &statements {
        refuse_versioned_targets(s)?;
    }
    Ok(statements)
}

/// `SELECT * FROM relation`, as a statement (MERGE plans its source so).
pub fn select_star_from(relation: TableFactor) -> Result<Statement> {
    let mut query = Parser::new(&datafusion::sql::sqlparser::dialect::GenericDialect {})
        .try_with_sql("SELECT * FROM t")
        .and_then(|mut p| p.parse_query())?;
    if let ast::SetExpr::Select(s) = query.body.as_mut()
        && let Some(from) = s.from.first_mut()
    {
        from.relation = relation;
    }
    Ok(Statement::Statement(Box::new(ast::Statement::Query(query))))
}

/// The clauses taken out of the tokens, keyed by where the name they follow starts.
#[derive(Default)]
struct Clauses {
    /// A table version, by the location of the table name's last identifier.
    versions: HashMap<(u64, u64), (String, TableVersion)>,
    /// `PARTITIONED BY` terms, by the location of the created table's last identifier.
    partitions: HashMap<(u64, u64), (String, Expr)>,
}

fn key(l: Location) -> (u64, u64) {
    (l.line, l.column)
}

impl Clauses {
    /// The tokens without the clauses, which are kept typed.
    fn take(
        &mut self,
        tokens: Vec<TokenWithSpan>,
        dialect: &dyn Dialect,
        recursion_limit: usize,
    ) -> Result<Vec<TokenWithSpan>> {
        let plain: Vec<Token> = tokens.iter().map(|t| t.token.clone()).collect();
        let mut removed = vec![false; tokens.len()];
        // CREATE TABLE clauses, statement by statement.
        let mut start = 0;
        for (end, t) in plain.iter().enumerate() {
            if matches!(t, Token::SemiColon) || end + 1 == plain.len() {
                self.take_create(
                    &tokens,
                    &plain,
                    start..end + 1,
                    &mut removed,
                    dialect,
                    recursion_limit,
                )?;
                start = end + 1;
            }
        }
        // Time travel clauses after table names.
        let mut i = 0;
        while i < plain.len() {
            if removed[i] {
                i += 1;
                continue;
            }
            if let Some((version, end)) = clause_at(&plain, i)?
                && let Some(name_at) = (0..i)
                    .rev()
                    .find(|&j| !removed[j] && !matches!(plain[j], Token::Whitespace(_)))
                && let Token::Word(w) = &plain[name_at]
                && (w.keyword != Keyword::AS || w.quote_style.is_some())
            {
                self.versions
                    .insert(key(tokens[name_at].span.start), (w.value.clone(), version));
                removed[i..end].iter_mut().for_each(|r| *r = true);
                i = end;
                continue;
            }
            i += 1;
        }
        Ok(tokens
            .into_iter()
            .zip(removed)
            .filter(|(_, r)| !r)
            .map(|(t, _)| t)
            .collect())
    }

    /// `CREATE [OR REPLACE] TABLE [IF NOT EXISTS] name … [USING iceberg] PARTITIONED BY
    /// (terms) …`: marks `USING iceberg` and the clause removed, keeps the terms.
    fn take_create(
        &mut self,
        tokens: &[TokenWithSpan],
        plain: &[Token],
        range: std::ops::Range<usize>,
        removed: &mut [bool],
        dialect: &dyn Dialect,
        recursion_limit: usize,
    ) -> Result<()> {
        let sig: Vec<usize> = range
            .filter(|&i| !matches!(plain[i], Token::Whitespace(_)))
            .collect();
        let at = |k: usize| sig.get(k).map(|&i| &plain[i]);
        let mut k = 0;
        if !at(k).is_some_and(|t| is_kw(t, Keyword::CREATE)) {
            return Ok(());
        }
        k += 1;
        if at(k).is_some_and(|t| is_kw(t, Keyword::OR)) {
            k += 2;
        }
        if !at(k).is_some_and(|t| is_kw(t, Keyword::TABLE)) {
            return Ok(());
        }
        k += 1;
        if at(k).is_some_and(|t| is_kw(t, Keyword::IF)) {
            k += 3;
        }
        // The name: words joined by periods.
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
            return Ok(());
        };
        let mut depth = 0i32;
        let mut j = k;
        while j < sig.len() {
            let t = &plain[sig[j]];
            match t {
                Token::LParen => depth += 1,
                Token::RParen => depth -= 1,
                _ if depth == 0 && is_kw(t, Keyword::AS) => break,
                _ if depth == 0
                    && is_kw(t, Keyword::USING)
                    && matches!(at(j + 1), Some(Token::Word(w)) if w.value.eq_ignore_ascii_case("iceberg")) =>
                {
                    removed[sig[j]..=sig[j + 1]]
                        .iter_mut()
                        .for_each(|r| *r = true);
                    j += 2;
                    continue;
                }
                _ if depth == 0
                    && is_kw(t, Keyword::PARTITIONED)
                    && at(j + 1).is_some_and(|t| is_kw(t, Keyword::BY))
                    && matches!(at(j + 2), Some(Token::LParen)) =>
                {
                    let open = j + 2;
                    let mut d = 0i32;
                    let close = sig.iter().enumerate().skip(open).find_map(|(m, &i)| {
                        match plain[i] {
                            Token::LParen => d += 1,
                            Token::RParen => {
                                d -= 1;
                                if d == 0 {
                                    return Some(m);
                                }
                            }
                            _ => {}
                        }
                        None
                    });
                    let Some(close) = close else {
                        return Err(plan("PARTITIONED BY: unbalanced parentheses"));
                    };
                    let terms = Parser::new(dialect)
                        .with_recursion_limit(recursion_limit)
                        .with_tokens_with_locations(tokens[sig[open] + 1..sig[close]].to_vec())
                        .parse_comma_separated(Parser::parse_expr)?;
                    let Token::Word(name) = &plain[name_last] else {
                        return Ok(());
                    };
                    self.partitions.insert(
                        key(tokens[name_last].span.start),
                        (name.value.clone(), Expr::Tuple(terms)),
                    );
                    removed[sig[j]..=sig[close]]
                        .iter_mut()
                        .for_each(|r| *r = true);
                    j = close + 1;
                    continue;
                }
                _ => {}
            }
            j += 1;
        }
        Ok(())
    }

    /// Sets the kept clauses on the statement's table factors and CREATE TABLE.
    fn attach(&mut self, s: &mut Statement) {
        match s {
            Statement::Statement(s) => {
                let _ = s.visit(self);
            }
            Statement::Explain(e) => self.attach(&mut e.statement),
            Statement::CopyTo(c) => {
                if let datafusion::sql::parser::CopyToSource::Query(q) = &mut c.source {
                    let _ = q.visit(self);
                }
            }
            Statement::CreateExternalTable(_) | Statement::Reset(_) => {}
        }
    }

    /// A clause left over followed a name that is not a table read or created.
    fn all_attached(&self) -> Result<()> {
        if let Some((name, v)) = self.versions.values().next() {
            return Err(plan(&format!(
                "time travel ({v}) applies to a table read in FROM or JOIN; '{name}' is not one"
            )));
        }
        if let Some((name, _)) = self.partitions.values().next() {
            return Err(plan(&format!(
                "PARTITIONED BY applies to CREATE TABLE; '{name}' is not created here"
            )));
        }
        Ok(())
    }
}

fn last_ident_start(name: &ast::ObjectName) -> Option<(u64, u64)> {
    Some(key(name.0.last()?.as_ident()?.span.start))
}

impl VisitorMut for Clauses {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        // The clause follows the name, or its alias (`t AS x VERSION AS OF 1` is how
        // sqlparser prints a versioned table with an alias).
        if let TableFactor::Table {
            name,
            alias,
            version,
            ..
        } = factor
        {
            let at = [
                last_ident_start(name),
                alias.as_ref().map(|a| key(a.name.span.start)),
            ];
            if let Some((_, v)) = at
                .into_iter()
                .flatten()
                .find_map(|k| self.versions.remove(&k))
            {
                *version = Some(v);
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, s: &mut ast::Statement) -> ControlFlow<()> {
        if let ast::Statement::CreateTable(c) = s
            && let Some(at) = last_ident_start(&c.name)
            && let Some((_, terms)) = self.partitions.remove(&at)
        {
            c.partition_by = Some(Box::new(terms));
        }
        ControlFlow::Continue(())
    }
}

/// Time travel names a snapshot to read: the table an UPDATE, DELETE or MERGE changes
/// cannot be one (DataFusion's DML planner would ignore the clause and change the
/// current table).
fn refuse_versioned_targets(s: &Statement) -> Result<()> {
    let versioned = |f: &TableFactor| match f {
        TableFactor::Table {
            name,
            version: Some(v),
            ..
        } => Some(format!("'{name}' ({v})")),
        _ => None,
    };
    let target = match s {
        Statement::Statement(s) => match s.as_ref() {
            ast::Statement::Update(u) => versioned(&u.table.relation).map(|t| ("UPDATE", t)),
            ast::Statement::Delete(d) => {
                let from = match &d.from {
                    ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
                };
                from.iter()
                    .find_map(|t| versioned(&t.relation))
                    .map(|t| ("DELETE", t))
            }
            ast::Statement::Merge(m) => versioned(&m.table).map(|t| ("MERGE", t)),
            _ => None,
        },
        Statement::Explain(e) => return refuse_versioned_targets(&e.statement),
        _ => None,
    };
    match target {
        Some((verb, table)) => Err(plan(&format!(
            "{verb} changes the current table; its target {table} cannot be read as of a snapshot"
        ))),
        None => Ok(()),
    }
}

fn is_kw(t: &Token, k: Keyword) -> bool {
    matches!(t, Token::Word(w) if w.keyword == k && w.quote_style.is_none())
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

/// A time travel clause starting at token `i`: its typed form and the index after it.
fn clause_at(tokens: &[Token], i: usize) -> Result<Option<(TableVersion, usize)>> {
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
    let Some(&(_, of_at)) = words.last() else {
        return Ok(None);
    };
    let Some(v) = next_significant(tokens, of_at + 1) else {
        return Err(plan("a time travel clause needs a value after AS OF"));
    };
    let (value, end) = match &tokens[v] {
        // TIMESTAMP '...' literal.
        t if is_kw(t, Keyword::TIMESTAMP) => {
            match next_significant(tokens, v + 1).map(|j| (&tokens[j], j)) {
                Some((Token::SingleQuotedString(s), j)) => {
                    (Value::SingleQuotedString(s.clone()), j + 1)
                }
                _ => {
                    return Err(plan(
                        "TIMESTAMP AS OF needs a literal such as TIMESTAMP '2024-01-01 00:00:00'",
                    ));
                }
            }
        }
        Token::SingleQuotedString(s) => (Value::SingleQuotedString(s.clone()), v + 1),
        Token::Number(n, long) => (Value::Number(n.clone(), *long), v + 1),
        other => {
            return Err(plan(&format!(
                "time travel needs a literal snapshot id, ref name or timestamp after AS OF, not '{other}'"
            )));
        }
    };
    let version = if timestamp {
        TableVersion::TimestampAsOf(Expr::value(value))
    } else {
        TableVersion::VersionAsOf(Expr::value(value))
    };
    // Bad values fail here, before any planning.
    crate::travel::as_of(&version)?;
    Ok(Some((version, end)))
}

fn plan(msg: &str) -> DataFusionError {
    DataFusionError::Plan(msg.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AsOf;
    use datafusion::sql::sqlparser::dialect::GenericDialect;

    fn parse(sql: &str) -> Result<Vec<Statement>> {
        parse_statements(sql, &GenericDialect {}, 50)
    }

    /// Every table version of a statement, typed.
    fn versions(sql: &str) -> Vec<(String, AsOf)> {
        let stmts = parse(sql).unwrap();
        let mut out = Vec::new();
        for s in &stmts {
            for (name, v) in crate::travel::versioned_tables(s) {
                out.push((name.to_string(), crate::travel::as_of(&v).unwrap()));
            }
        }
        out
    }

    #[test]
    fn trino_spark_and_sql2011_forms_become_table_versions() {
        assert_eq!(
            versions("SELECT * FROM lake.db.t FOR VERSION AS OF 123 WHERE id = 1"),
            vec![("lake.db.t".into(), AsOf::Version(123))]
        );
        assert_eq!(
            versions("select * from t version as of 'audit' x"),
            vec![("t".into(), AsOf::Ref("audit".into()))]
        );
        assert_eq!(
            versions("SELECT 1 FROM t FOR TIMESTAMP AS OF TIMESTAMP '2024-01-01 00:00:01.5'"),
            vec![("t".into(), AsOf::Timestamp(1_704_067_201_500))]
        );
        assert_eq!(
            versions("SELECT 1 FROM T TIMESTAMP AS OF '2024-01-01' AS o JOIN u ON true"),
            vec![("T".into(), AsOf::Timestamp(1_704_067_200_000))]
        );
        assert_eq!(
            versions("SELECT 1 FROM t\n\tFOR  VERSION\tAS OF 7"),
            vec![("t".into(), AsOf::Version(7))]
        );
        assert_eq!(
            versions("SELECT 1 FROM t FOR SYSTEM_TIME AS OF 1704067200"),
            vec![("t".into(), AsOf::Timestamp(1_704_067_200_000))]
        );
        // Both sides of a join, and a subquery.
        assert_eq!(
            versions(
                "SELECT * FROM t FOR VERSION AS OF 1 a JOIN t FOR VERSION AS OF 2 b ON a.id = b.id \
                 WHERE a.id IN (SELECT id FROM \"u\" VERSION AS OF 'main')"
            ),
            vec![
                ("t".into(), AsOf::Version(1)),
                ("t".into(), AsOf::Version(2)),
                ("\"u\"".into(), AsOf::Ref("main".into())),
            ]
        );
    }

    #[test]
    fn the_typed_statement_prints_a_form_that_parses_back() {
        for sql in [
            "SELECT * FROM t FOR VERSION AS OF 123",
            "SELECT * FROM t FOR TIMESTAMP AS OF TIMESTAMP '2024-01-01 00:00:00' AS x",
            "SELECT * FROM t VERSION AS OF 'audit'",
        ] {
            let printed = parse(sql).unwrap()[0].to_string();
            assert_eq!(versions(&printed), versions(sql), "{printed}");
        }
    }

    #[test]
    fn other_sql_has_no_versions() {
        for sql in [
            "SELECT CAST(x AS TIMESTAMP) AS of FROM t",
            "SELECT 'VERSION AS OF 1' FROM t",
            "SELECT * FROM t",
        ] {
            assert!(versions(sql).is_empty(), "{sql}");
        }
    }

    #[test]
    fn a_clause_not_on_a_table_read_is_an_error() {
        for (sql, says) in [
            (
                "INSERT INTO t FOR VERSION AS OF 1 VALUES (1)",
                "applies to a table read",
            ),
            (
                "UPDATE t FOR VERSION AS OF 1 SET a = 1",
                "UPDATE changes the current table",
            ),
            (
                "DELETE FROM t VERSION AS OF 'x' WHERE a = 1",
                "DELETE changes the current table",
            ),
            (
                "MERGE INTO t FOR VERSION AS OF 1 USING u ON t.a = u.a WHEN MATCHED THEN DELETE",
                "MERGE changes the current table",
            ),
            (
                "SELECT * FROM t FOR TIMESTAMP AS OF 'yesterday'",
                "cannot read time travel timestamp 'yesterday'",
            ),
            ("SELECT * FROM t FOR VERSION AS OF now()", "needs a literal"),
        ] {
            let e = parse(sql).unwrap_err().to_string();
            assert!(e.contains(says), "{sql}: {e}");
        }
    }

    #[test]
    fn partitioned_by_becomes_the_create_tables_partition_expression() {
        let spark = "CREATE TABLE lake.s.t (id BIGINT, region STRING) USING iceberg \
                     PARTITIONED BY (bucket(16, id), region)";
        let stmts: [Statement; 1] = parse(spark).unwrap().try_into().unwrap();
        let [Statement::Statement(s)] = stmts else {
            panic!("one statement")
        };
        let ast::Statement::CreateTable(c) = *s else {
            panic!("CREATE TABLE")
        };
        let terms = crate::ddl::partition_terms(c.partition_by.as_deref().unwrap()).unwrap();
        assert_eq!(
            terms.iter().map(|t| t.column.as_str()).collect::<Vec<_>>(),
            ["id", "region"]
        );
        assert_eq!(c.name.to_string(), "lake.s.t");
        // CREATE TABLE AS, in a script: the clause goes to its own statement.
        let script = "SELECT 1; CREATE TABLE u PARTITIONED BY (days(ts)) AS SELECT now() AS ts";
        let stmts = parse(script).unwrap();
        assert_eq!(stmts.len(), 2);
        assert!(
            stmts[1].to_string().contains("PARTITION BY (days(ts))"),
            "{}",
            stmts[1]
        );
        // Printed, it parses back the same.
        let again = parse(&stmts[1].to_string()).unwrap();
        assert_eq!(again[0].to_string(), stmts[1].to_string());
    }
}
