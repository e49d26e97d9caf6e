//! The interactive shell: history, multi-line statements, backslash commands, tab
//! completion, Ctrl-C cancellation and a progress indicator.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clearice_engine::Session;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Context, Editor, Helper, Highlighter, Hinter, Validator};
use std::sync::Arc;

use datafusion::sql::parser::Statement;

use crate::exec::{
    HELP, backslash_sql, print_result, run_parsed_limited, run_statement, split_statements,
};
use crate::output::Format;

const KEYWORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "ORDER",
    "LIMIT",
    "HAVING",
    "JOIN",
    "LEFT",
    "RIGHT",
    "INNER",
    "OUTER",
    "ON",
    "AS",
    "AND",
    "OR",
    "NOT",
    "NULL",
    "IS",
    "IN",
    "LIKE",
    "BETWEEN",
    "DISTINCT",
    "COUNT",
    "SUM",
    "AVG",
    "MIN",
    "MAX",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "WITH",
    "UNION",
    "ALL",
    "DESCRIBE",
    "SHOW",
    "TABLES",
    "EXPLAIN",
    "ANALYZE",
    "CREATE",
    "EXTERNAL",
    "TABLE",
    "STORED",
    "PARQUET",
    "LOCATION",
    "SET",
    "DESC",
    "ASC",
    "NULLS",
    "FIRST",
    "LAST",
    "CAST",
    "information_schema",
];

#[derive(Helper, Hinter, Highlighter, Validator)]
struct ReplHelper {
    words: Vec<String>,
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let start = line[..pos]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .map(|i| i + 1)
            .unwrap_or(0);
        let word = &line[start..pos];
        if word.is_empty() {
            return Ok((pos, vec![]));
        }
        let lower = word.to_lowercase();
        let mut out: Vec<Pair> = self
            .words
            .iter()
            .filter(|w| w.to_lowercase().starts_with(&lower))
            .map(|w| {
                // keep the user's case for keywords
                let text = if w.chars().all(|c| c.is_ascii_uppercase())
                    && word.chars().any(|c| c.is_lowercase())
                {
                    w.to_lowercase()
                } else {
                    w.clone()
                };
                Pair {
                    display: text.clone(),
                    replacement: text,
                }
            })
            .collect();
        out.dedup_by(|a, b| a.replacement == b.replacement);
        Ok((start, out))
    }
}

async fn completion_words(ctx: &Session) -> Vec<String> {
    let mut words: Vec<String> = KEYWORDS.iter().map(|s| s.to_string()).collect();
    let sql = "SELECT table_catalog, table_schema, table_name, column_name FROM information_schema.columns \
               WHERE table_schema <> 'information_schema'";
    if let Ok(r) = run_statement(ctx, sql).await {
        for b in &r.batches {
            let col = |i: usize| {
                datafusion::arrow::compute::cast(
                    b.column(i),
                    &datafusion::arrow::datatypes::DataType::Utf8,
                )
            };
            let (Ok(c), Ok(s), Ok(t), Ok(n)) = (col(0), col(1), col(2), col(3)) else {
                continue;
            };
            let get = |a: &datafusion::arrow::array::ArrayRef, i: usize| {
                a.as_any()
                    .downcast_ref::<datafusion::arrow::array::StringArray>()
                    .map(|a| a.value(i).to_owned())
            };
            for i in 0..b.num_rows() {
                if let (Some(c), Some(s), Some(t), Some(n)) =
                    (get(&c, i), get(&s, i), get(&t, i), get(&n, i))
                {
                    words.push(format!("{c}.{s}.{t}"));
                    words.push(format!("{s}.{t}"));
                    words.push(t);
                    words.push(n);
                }
            }
        }
    }
    words.sort();
    words.dedup();
    words
}

#[expect(
    clippy::disallowed_methods,
    reason = "once when the REPL starts, before any query"
)]
fn history_path() -> Option<PathBuf> {
    let dir = dirs::state_dir().or_else(dirs::data_dir)?.join("clearice");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("history"))
}

/// Runs the REPL until `\q` or end of input. Queries run on `cpu`, so the shell's own
/// runtime stays free to show progress and to catch Ctrl-C while they compute.
pub async fn run(
    ctx: Arc<Session>,
    cpu: &tokio::runtime::Handle,
    banner: &str,
    format: Format,
    quiet: bool,
) -> Result<()> {
    let mut editor: Editor<ReplHelper, FileHistory> = Editor::new()?;
    editor.set_helper(Some(ReplHelper {
        words: completion_words(&ctx).await,
    }));
    let history = history_path();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    if !quiet {
        println!("{banner}\nType \\? for help, \\q to quit.");
    }
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "clearice> "
        } else {
            "      ..> "
        };
        let line = match editor.readline(prompt) {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let trimmed = line.trim();
        if buffer.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            match trimmed {
                "\\q" | "\\quit" => break,
                "\\?" | "\\h" | "\\help" => println!("{HELP}"),
                _ => match backslash_sql(trimmed).expect("backslash") {
                    Ok(sql) => {
                        execute(&ctx, cpu, Query::Sql(sql), format, quiet).await;
                    }
                    Err(e) => eprintln!("Error: {e}"),
                },
            }
            continue;
        }
        if trimmed.is_empty() && buffer.is_empty() {
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !buffer.trim_end().ends_with(';') {
            continue;
        }
        let text = std::mem::take(&mut buffer);
        let _ = editor.add_history_entry(text.trim());
        match split_statements(&text) {
            Ok(stmts) => {
                for s in stmts {
                    if !execute(&ctx, cpu, Query::Parsed(s), format, quiet).await {
                        break;
                    }
                }
            }
            Err(e) => eprintln!("Error: {e}"),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

enum Query {
    Sql(String),
    Parsed(Statement),
}

/// Rows the shell shows of a result in the table format (DuckDB's shell shows 40); the
/// rest are counted, and a line says how many.
pub const TABLE_MAX_ROWS: usize = 40;

/// Runs one statement with Ctrl-C cancellation and a progress indicator after 1 s.
/// Returns false when it failed or was cancelled.
async fn execute(
    ctx: &Arc<Session>,
    cpu: &tokio::runtime::Handle,
    q: Query,
    format: Format,
    quiet: bool,
) -> bool {
    let start = Instant::now();
    let ctx = Arc::clone(ctx);
    let task = cpu.spawn(async move {
        match q {
            Query::Sql(sql) => run_statement(&ctx, &sql).await,
            Query::Parsed(stmt) => {
                let max_rows = if format == Format::Table {
                    TABLE_MAX_ROWS
                } else {
                    usize::MAX
                };
                run_parsed_limited(&ctx, stmt, max_rows).await
            }
        }
    });
    // Aborting the task on Ctrl-C drops the plan's streams, which cancels its work.
    let abort = task.abort_handle();
    let query = async {
        task.await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("query task failed: {e}")))
    };
    tokio::pin!(query);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let show_progress = std::io::stderr().is_terminal();
    let mut ticker = tokio::time::interval(Duration::from_millis(200));
    let mut shown = false;
    let result = loop {
        tokio::select! {
            r = &mut query => break Some(r),
            _ = &mut ctrl_c => {
                abort.abort();
                break None;
            }
            _ = ticker.tick() => {
                if show_progress && start.elapsed() > Duration::from_secs(1) {
                    const SPIN: [char; 4] = ['|', '/', '-', '\\'];
                    let i = (start.elapsed().as_millis() / 200) as usize % 4;
                    eprint!("\r{} running {:.1}s (Ctrl-C cancels)", SPIN[i], start.elapsed().as_secs_f64());
                    let _ = std::io::stderr().flush();
                    shown = true;
                }
            }
        }
    };
    if shown {
        eprint!("\r\x1b[K");
    }
    match result {
        Some(Ok(r)) => match print_result(&r, format, quiet) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("Error: {e}");
                false
            }
        },
        Some(Err(e)) => {
            eprintln!("Error: {}", one_line(&e));
            false
        }
        None => {
            eprintln!(
                "Query cancelled after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            false
        }
    }
}

/// The error as one line (DataFusion nests causes on several lines).
pub fn one_line(e: &anyhow::Error) -> Cow<'static, str> {
    // DataFusion errors already include their sources in Display: skip repeats.
    let mut out = String::new();
    for cause in e.chain() {
        // A query error: the engine's own message (a typed ClearIce error without
        // DataFusion's and parquet-rs's wrapping labels); its sources are in it.
        let query = cause.downcast_ref::<datafusion::error::DataFusionError>();
        let msg = match query {
            Some(df) => clearice_engine::message_of(df),
            None => cause.to_string(),
        };
        let msg = msg
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if !out.contains(&msg) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&msg);
        }
        if query.is_some() {
            break;
        }
    }
    // ClearIce's own errors travel inside DataFusion's `External`; its "External error: "
    // label says nothing to a user.
    match out.strip_prefix("External error: ") {
        Some(rest) => Cow::Owned(rest.to_owned()),
        None => Cow::Owned(out),
    }
}
