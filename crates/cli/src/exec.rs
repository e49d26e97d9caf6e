//! Running SQL text and backslash commands in a session.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use clearice_engine::{QueryOutput, Session};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::sql::parser::Statement;

use crate::output::{BatchWriter, Format, render};

/// Result of one statement.
#[derive(Debug)]
pub struct StatementResult {
    /// Result schema.
    pub schema: SchemaRef,
    /// Result batches.
    pub batches: Vec<RecordBatch>,
    /// Wall time.
    pub elapsed: Duration,
    /// Rows the statement returned (more than `batches` hold when a row limit applied).
    pub total: usize,
}

impl StatementResult {
    /// Row count.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Splits SQL text into statements with DataFusion's parser (`;`-separated).
pub fn split_statements(sql: &str) -> Result<Vec<Statement>> {
    // Kept typed (DataFusionError::SQL): the exit code is decided by it.
    // ClearIce's parser: time travel and PARTITIONED BY become typed AST nodes.
    Ok(clearice_engine::parse_statements(
        sql,
        &datafusion::sql::sqlparser::dialect::GenericDialect {},
        50,
    )?)
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
    let total = out.rows();
    StatementResult {
        schema: out.schema,
        batches: out.batches,
        elapsed: start.elapsed(),
        total,
    }
}

/// Runs one parsed statement as a stream, keeping at most `max_rows` rows (the shell's
/// table limit) and counting the rest, so memory stays bounded for any result size.
pub async fn run_parsed_limited(
    session: &Session,
    stmt: Statement,
    max_rows: usize,
) -> Result<StatementResult> {
    use futures::StreamExt;
    let start = Instant::now();
    let mut stream = session.execute_stream(stmt).await?;
    let schema = stream.schema();
    let (mut batches, mut kept, mut total) = (Vec::new(), 0usize, 0usize);
    while let Some(b) = stream.next().await {
        let b = b?;
        total += b.num_rows();
        let room = max_rows.saturating_sub(kept);
        if room > 0 && b.num_rows() > 0 {
            let b = b.slice(0, room.min(b.num_rows()));
            kept += b.num_rows();
            batches.push(b);
        }
    }
    Ok(StatementResult {
        schema,
        batches,
        elapsed: start.elapsed(),
        total,
    })
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use datafusion::arrow::error::ArrowError;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || matches!(c.downcast_ref::<ArrowError>(), Some(ArrowError::IoError(_, io)) if io.kind() == std::io::ErrorKind::BrokenPipe)
    })
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
    if r.total > r.rows() {
        let more = r.total - r.rows();
        println!(
            "({more} more row{} not shown; --format csv or a LIMIT shows them)",
            if more == 1 { "" } else { "s" }
        );
    }
    if !quiet {
        let n = r.total;
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
        stream_parsed(ctx, stmt, format, quiet, usize::MAX).await?;
    }
    Ok(())
}

/// Runs one parsed statement and writes its result to stdout batch by batch (bounded
/// memory for the streaming formats; the table format shows at most `max_rows` rows).
pub async fn stream_parsed(
    session: &Session,
    stmt: Statement,
    format: Format,
    quiet: bool,
    max_rows: usize,
) -> Result<()> {
    use futures::StreamExt;
    let start = Instant::now();
    let mut stream = session.execute_stream(stmt).await?;
    let schema = stream.schema();
    if schema.fields().is_empty() {
        // DDL and SET: nothing to show
        while let Some(b) = stream.next().await {
            b?;
        }
        if !quiet {
            eprintln!("OK in {:.3}s", start.elapsed().as_secs_f64());
        }
        return Ok(());
    }
    let mut w = BatchWriter::new(
        std::io::BufWriter::with_capacity(1 << 16, std::io::stdout()),
        schema,
        format,
        max_rows,
    );
    while let Some(b) = stream.next().await {
        let b = b?;
        if let Err(e) = w.write(&b) {
            // `clearice -c ... | head`: the reader is gone; stop quietly like other CLIs.
            return if is_broken_pipe(&e) { Ok(()) } else { Err(e) };
        }
    }
    let n = match w.finish() {
        Ok(n) => n,
        Err(e) if is_broken_pipe(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    if !quiet {
        eprintln!(
            "{n} row{} in {:.3}s",
            if n == 1 { "" } else { "s" },
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
