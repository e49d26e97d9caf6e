//! Running SQL text and backslash commands in a session.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use clearice_engine::{QueryOutput, Session};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::sql::parser::{DFParser, Statement};

use crate::output::{Format, render};

/// Result of one statement.
#[derive(Debug)]
pub struct StatementResult {
    /// Result schema.
    pub schema: SchemaRef,
    /// Result batches.
    pub batches: Vec<RecordBatch>,
    /// Wall time.
    pub elapsed: Duration,
}

impl StatementResult {
    /// Row count.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Splits SQL text into statements with DataFusion's parser (`;`-separated).
pub fn split_statements(sql: &str) -> Result<Vec<Statement>> {
    Ok(DFParser::parse_sql(sql).map_err(|e| anyhow!("{e}"))?.into())
}

/// Runs one SQL statement to completion (audited).
pub async fn run_statement(session: &Session, sql: &str) -> Result<StatementResult> {
    let start = Instant::now();
    Ok(result(session.sql(sql).await?, start))
}

/// Runs one parsed statement to completion (audited; no round trip through SQL text).
pub async fn run_parsed(session: &Session, stmt: Statement) -> Result<StatementResult> {
    let start = Instant::now();
    Ok(result(session.execute(stmt).await?, start))
}

fn result(out: QueryOutput, start: Instant) -> StatementResult {
    StatementResult {
        schema: out.schema,
        batches: out.batches,
        elapsed: start.elapsed(),
    }
}

/// Expands a backslash command into SQL, or `None` if `line` is not one.
pub fn backslash_sql(line: &str) -> Option<Result<String>> {
    let line = line.trim().trim_end_matches(';');
    let rest = line.strip_prefix('\\')?;
    let mut parts = rest.split_whitespace();
    Some(match (parts.next(), parts.next()) {
        (Some("d"), None) => Ok(
            "SELECT table_catalog, table_schema, table_name, table_type \
             FROM information_schema.tables WHERE table_schema <> 'information_schema' \
             ORDER BY table_catalog, table_schema, table_name"
                .into(),
        ),
        (Some("d"), Some(t)) => Ok(format!("DESCRIBE {t}")),
        (Some(other), _) => Err(anyhow!(
            "unknown command '\\{other}'; \\? lists the commands"
        )),
        (None, _) => Err(anyhow!("empty command; \\? lists the commands")),
    })
}

/// Help for backslash commands.
pub const HELP: &str = "\
\\d            list tables
\\d TABLE      describe a table (columns and types)
\\?            this help
\\q            quit
Statements end with ';' and may span lines. Ctrl-C cancels a running query.";

/// Prints a result in `format`; the summary line goes to stderr unless `quiet`.
pub fn print_result(r: &StatementResult, format: Format, quiet: bool) -> Result<()> {
    if r.schema.fields().is_empty() {
        // DDL and SET: nothing to show
        if !quiet {
            eprintln!("OK in {:.3}s", r.elapsed.as_secs_f64());
        }
        return Ok(());
    }
    print!("{}", render(&r.schema, &r.batches, format)?);
    if !quiet {
        let n = r.rows();
        eprintln!(
            "{n} row{} in {:.3}s",
            if n == 1 { "" } else { "s" },
            r.elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// Runs a script (statements and backslash commands) in order; stops at the first error.
pub async fn run_script(ctx: &Session, text: &str, format: Format, quiet: bool) -> Result<()> {
    let mut sql = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('\\') {
            run_sql_text(ctx, &std::mem::take(&mut sql), format, quiet).await?;
            let stmt = backslash_sql(line).expect("starts with a backslash")?;
            print_result(&run_statement(ctx, &stmt).await?, format, quiet)?;
            continue;
        }
        sql.push_str(line);
        sql.push('\n');
    }
    run_sql_text(ctx, &sql, format, quiet).await
}

async fn run_sql_text(ctx: &Session, sql: &str, format: Format, quiet: bool) -> Result<()> {
    if sql.trim().is_empty() {
        return Ok(());
    }
    for stmt in split_statements(sql)? {
        print_result(&run_parsed(ctx, stmt).await?, format, quiet)?;
    }
    Ok(())
}
