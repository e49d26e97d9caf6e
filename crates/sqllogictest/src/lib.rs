//! sqllogictest runner for ClearIce: runs `.slt` files against an [`Engine`], each file
//! in fresh sessions. A `connection NAME` record runs what follows as principal `NAME`
//! (its own session); the default connection runs as the runner's default principal.
//! Principals are never settable from SQL.
//!
//! ```text
//!  file.slt ─▶ records ─▶ connection NAME ─▶ Session of principal NAME (fresh per file)
//!                       ─▶ statement / query ─▶ Session::sql ─▶ DataFusion-formatted rows
//!                          compared with the expected block (or the error, whole)
//! ```
//!
//! Files follow DataFusion's sqllogictest conventions ([`conventions`]), so `.slt` files
//! written for DataFusion's runner run unchanged: its value formatting, column type
//! letters, `DataFusion error: ` messages (multi-line errors compared whole), EXPLAIN plans
//! as numbered rows, `WORKSPACE_ROOT` path normalization, a fresh `scratch/<file stem>/`
//! directory per file, and the labels `Datafusion` and `clearice` for `skipif`/`onlyif`.
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

pub mod conventions;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clearice_engine::{CpuExecutor, Engine, Session, one_line};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Fields;
use futures::StreamExt;
use sqllogictest::{Connection, DBOutput, Record, Runner, update_record_with_output};

use crate::conventions::ColumnType;

/// An error from a statement, as the `.slt` file sees it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SqlError(String);

impl SqlError {
    fn datafusion(e: &datafusion::error::DataFusionError) -> Self {
        Self(format!("DataFusion error: {}", e.strip_backtrace()))
    }
}

/// One ClearIce session as a sqllogictest database.
pub struct ClearIceDb {
    session: Session,
    workspace_root: Option<String>,
}

impl ClearIceDb {
    /// Wraps a session; paths under `workspace_root` print as `WORKSPACE_ROOT`.
    pub fn new(session: Session, workspace_root: Option<String>) -> Self {
        Self {
            session,
            workspace_root,
        }
    }
}

fn output(
    fields: &Fields,
    batches: &[RecordBatch],
    workspace_root: Option<&str>,
) -> Result<DBOutput<ColumnType>, SqlError> {
    let types = conventions::column_types(fields);
    let rows = conventions::rows(batches, workspace_root)
        .map_err(|e| SqlError(format!("Arrow error: {e}")))?;
    if rows.is_empty() && types.is_empty() {
        return Ok(DBOutput::StatementComplete(0));
    }
    Ok(DBOutput::Rows { types, rows })
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for ClearIceDb {
    type Error = SqlError;
    type ColumnType = ColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        let out = self
            .session
            .sql(sql)
            .await
            .map_err(|e| SqlError::datafusion(&e))?;
        output(
            out.schema.fields(),
            &out.batches,
            self.workspace_root.as_deref(),
        )
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "clearice"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

/// A Flight SQL connection as a sqllogictest database: the same `.slt` files run over
/// the wire, logged in as the connection's principal (password: `CLEARICE_SLT_PASSWORD`,
/// else the principal's name, as for the demo users). Its engine name is `flight`, so
/// records can say `skipif flight`.
pub struct FlightDb {
    client: arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>,
    /// A failed login is reported by the first statement (so `skipif flight` still applies).
    login_error: Option<String>,
}

impl FlightDb {
    /// Connects to `url` (`grpc://host:port`) and logs in as `principal`.
    pub async fn connect(url: &str, principal: &str) -> Result<Self, SqlError> {
        let endpoint = url
            .replacen("grpc://", "http://", 1)
            .replacen("grpc+tls://", "https://", 1);
        let channel = tonic::transport::Channel::from_shared(endpoint)
            .map_err(|e| SqlError(one_line(&e)))?
            .connect()
            .await
            .map_err(|e| SqlError(one_line(&e)))?;
        let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
        let password =
            std::env::var("CLEARICE_SLT_PASSWORD").unwrap_or_else(|_| principal.to_owned());
        let login_error = client
            .handshake(principal, &password)
            .await
            .err()
            .map(|e| one_line(&e));
        Ok(Self {
            client,
            login_error,
        })
    }
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for FlightDb {
    type Error = SqlError;
    type ColumnType = ColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        use futures::TryStreamExt;
        if let Some(e) = &self.login_error {
            return Err(SqlError(e.clone()));
        }
        let err = |e: arrow_flight::error::FlightError| SqlError(one_line(&e));
        let info = self
            .client
            .execute(sql.to_owned(), None)
            .await
            .map_err(err)?;
        let schema = info
            .clone()
            .try_decode_schema()
            .map_err(|e| SqlError(one_line(&e)))?;
        let mut batches = Vec::new();
        for ep in info.endpoint {
            let Some(ticket) = ep.ticket else { continue };
            let stream = self.client.do_get(ticket).await.map_err(err)?;
            batches.extend(stream.try_collect::<Vec<_>>().await.map_err(err)?);
        }
        output(schema.fields(), &batches, None)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "flight"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

/// How files run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Principal of the default connection.
    pub principal: String,
    /// Rewrite files with the actual results instead of checking them.
    pub complete: bool,
    /// Paths under this directory print as `WORKSPACE_ROOT` (as object store paths
    /// print, without the leading `/`, like DataFusion's runner).
    pub workspace_root: Option<String>,
    /// Sessions start with DataFusion's stock options, as DataFusion's runner sets them
    /// (`target_partitions = 4`, no information_schema, no ClearIce tuning), instead of
    /// ClearIce's.
    pub datafusion_session: bool,
    /// Variables for `control substitution on` blocks (`$NAME`).
    pub vars: Vec<(String, String)>,
    /// The engine coordinates cluster workers: records run with the label `distributed`
    /// (`skipif distributed` for plans that differ, e.g. `EXPLAIN`).
    pub distributed: bool,
    /// Files run at once.
    pub jobs: usize,
    /// A file still running after this fails (its records count as failed).
    pub file_timeout: Option<Duration>,
    /// The runtime files execute on (DataFusion's CPU work); default: the caller's. With
    /// a separate one, the caller's runtime keeps the timeouts even while a query that
    /// never yields holds every thread of the executing runtime.
    pub executor: Option<tokio::runtime::Handle>,
}

impl RunOptions {
    /// Defaults: one job per core, no timeout, ClearIce sessions.
    pub fn new(principal: &str) -> Self {
        Self {
            principal: principal.to_owned(),
            jobs: std::thread::available_parallelism().map_or(4, |n| n.get()),
            ..Self::default()
        }
    }
}

/// Runs one file over Flight SQL at `url`, one login per connection name.
pub async fn run_file_flight(url: &str, path: &Path, options: &RunOptions) -> FileResult {
    let principal = Arc::new(Mutex::new(options.principal.clone()));
    let p = Arc::clone(&principal);
    let url = url.to_owned();
    let mut runner = Runner::new(move || {
        let (url, who) = (url.clone(), p.lock().expect("principal").clone());
        async move { FlightDb::connect(&url, &who).await }
    });
    let options = RunOptions {
        complete: false,
        ..options.clone()
    };
    drive(&mut runner, &principal, path, &options).await
}

/// Outcome of one file.
#[derive(Debug)]
pub struct FileResult {
    /// The file.
    pub path: PathBuf,
    /// Failed records, each as the runner's message.
    pub failures: Vec<String>,
    /// Statement and query records in the file.
    pub records: usize,
    /// The file did not finish within the timeout: every record counts as failed.
    pub timed_out: bool,
}

impl FileResult {
    /// Records that failed (all of them when the file timed out or did not parse).
    pub fn failed_records(&self) -> usize {
        if self.timed_out {
            self.records.max(1)
        } else {
            self.failures.len()
        }
    }
}

/// `scratch/<file stem>` under `root`, emptied, for files that write there (DataFusion's
/// runner does the same under `test_files/`). Blocking: run on a blocking thread.
#[expect(
    clippy::disallowed_methods,
    reason = "run_files calls it on a blocking thread"
)]
fn setup_scratch(root: &Path, path: &Path) -> std::io::Result<()> {
    let Some(stem) = path.file_stem() else {
        return Ok(());
    };
    let text = std::fs::read_to_string(path)?;
    if !text.contains("scratch/") {
        return Ok(());
    }
    let dir = root.join("scratch").join(stem);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(dir)
}

/// Runs one file with a fresh session per connection. With `complete`, rewrites the
/// file with the actual results instead of checking them.
pub async fn run_file(engine: Arc<Engine>, path: &Path, options: &RunOptions) -> FileResult {
    let principal = Arc::new(Mutex::new(options.principal.clone()));
    let p = Arc::clone(&principal);
    let e = Arc::clone(&engine);
    let root = options
        .workspace_root
        .as_deref()
        .map(|r| r.trim_start_matches('/').trim_end_matches('/').to_owned());
    let stock = options.datafusion_session;
    let mut runner = Runner::new(move || {
        let who = p.lock().expect("principal").clone();
        let session = if stock {
            let config = datafusion::prelude::SessionConfig::new().with_target_partitions(4);
            e.session_with_config(&who, "slt", config)
        } else {
            e.session_for(&who, "slt")
        };
        let root = root.clone();
        async move { Ok::<_, SqlError>(ClearIceDb::new(session, root)) }
    });
    drive(&mut runner, &principal, path, options).await
}

/// Runs (or, with `complete`, rewrites) one file's records on `runner`, setting
/// `principal` to each record's connection name before it runs: the runner makes a
/// connection on a name's first use, as that principal.
async fn drive<D, M>(
    runner: &mut Runner<D, M>,
    principal: &Mutex<String>,
    path: &Path,
    options: &RunOptions,
) -> FileResult
where
    D: sqllogictest::AsyncDB<ColumnType = ColumnType>,
    M: sqllogictest::MakeConnection<Conn = D>,
{
    runner.add_label("Datafusion");
    runner.add_label("clearice");
    if options.distributed {
        runner.add_label("distributed");
    }
    runner.with_normalizer(conventions::normalizer);
    runner.with_validator(conventions::validator);
    runner.with_column_validator(sqllogictest::strict_column_validator);
    for (k, v) in &options.vars {
        runner.set_var(k.clone(), v.clone());
    }
    let mut result = FileResult {
        path: path.to_owned(),
        failures: vec![],
        records: 0,
        timed_out: false,
    };
    let records = match sqllogictest::parse_file::<ColumnType>(path) {
        Ok(r) => r,
        Err(e) => {
            result.failures.push(format!("parse error: {e}"));
            return result;
        }
    };
    let mut completed = String::new();
    for record in records {
        let conn = match &record {
            Record::Halt { .. } => break,
            Record::Statement { connection, .. } | Record::Query { connection, .. } => {
                result.records += 1;
                Some(connection.clone())
            }
            _ => None,
        };
        if let Some(c) = conn {
            *principal.lock().expect("principal") = match c {
                Connection::Named(name) => name,
                Connection::Default => options.principal.clone(),
            };
        }
        if options.complete {
            let out = runner.apply_record(record.clone()).await;
            let updated = update_record_with_output(
                &record,
                &out,
                " ",
                conventions::validator,
                conventions::normalizer,
                sqllogictest::strict_column_validator,
            )
            .unwrap_or(record);
            completed.push_str(&updated.to_string());
            completed.push('\n');
            continue;
        }
        if let Err(e) = runner.run_async(record).await {
            result.failures.push(e.display(true).to_string());
        }
    }
    if options.complete
        && let Err(e) = tokio::fs::write(path, completed).await
    {
        result
            .failures
            .push(format!("cannot rewrite {}: {e}", path.display()));
    }
    result
}

/// Records in a file that count toward the pass rate (statements and queries).
fn count_records(path: &Path) -> usize {
    sqllogictest::parse_file::<ColumnType>(path)
        .map(|records| {
            records
                .iter()
                .take_while(|r| !matches!(r, Record::Halt { .. }))
                .filter(|r| matches!(r, Record::Statement { .. } | Record::Query { .. }))
                .count()
        })
        .unwrap_or(0)
}

/// Runs files `options.jobs` at a time (each on its own task, with the per-file
/// timeout), printing one line per file as it ends and a closing summary with the
/// record pass rate. `root` is the directory that holds `scratch/`. Returns the summary.
pub async fn run_files(
    engine: Arc<Engine>,
    files: &[(PathBuf, PathBuf)],
    options: &RunOptions,
) -> Summary {
    let mut summary = Summary::default();
    let jobs = futures::stream::iter(files.iter().cloned().map(|(root, f)| {
        let (engine, options) = (Arc::clone(&engine), options.clone());
        async move {
            let start = Instant::now();
            let scratch = {
                let (root, f) = (root.clone(), f.clone());
                tokio::task::spawn_blocking(move || setup_scratch(&root, &f))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            };
            if let Err(e) = scratch {
                let msg = format!("cannot prepare scratch directory: {e}");
                return (unfinished(f, msg), start);
            }
            let cpu = CpuExecutor::new(
                options
                    .executor
                    .clone()
                    .unwrap_or_else(tokio::runtime::Handle::current),
            );
            let timeout = options.file_timeout;
            // Dropping the run (timeout) aborts the file's task.
            let run = cpu.run({
                let f = f.clone();
                async move { run_file(engine, &f, &options).await }
            });
            let result = match timeout {
                Some(limit) => match tokio::time::timeout(limit, run).await {
                    Ok(r) => r,
                    Err(_) => {
                        let msg = format!("timed out after {} s", limit.as_secs_f64());
                        return (unfinished(f, msg), start);
                    }
                },
                None => run.await,
            };
            let result = result.unwrap_or_else(|e| unfinished(f, format!("runner failed: {e}")));
            (result, start)
        }
    }))
    .buffer_unordered(options.jobs.max(1));
    futures::pin_mut!(jobs);
    while let Some((r, start)) = jobs.next().await {
        summary.report(&r, start);
    }
    summary
}

/// A file that did not run to its end: every record counts as failed.
fn unfinished(path: PathBuf, reason: String) -> FileResult {
    FileResult {
        records: count_records(&path),
        failures: vec![reason],
        path,
        timed_out: true,
    }
}

/// Per-file reporting and the closing line.
#[derive(Debug, Default)]
pub struct Summary {
    passed: usize,
    failed: usize,
    records: usize,
    failed_records: usize,
}

impl Summary {
    /// Prints one file's outcome.
    pub fn report(&mut self, r: &FileResult, start: Instant) {
        self.records += r.records;
        self.failed_records += r.failed_records().min(r.records.max(1));
        if r.failures.is_empty() {
            self.passed += 1;
            println!(
                "ok    {} ({} records, {:.2}s)",
                r.path.display(),
                r.records,
                start.elapsed().as_secs_f64()
            );
        } else {
            self.failed += 1;
            println!(
                "FAIL  {} ({} of {} records failed)",
                r.path.display(),
                r.failed_records(),
                r.records
            );
            for msg in &r.failures {
                println!("{msg}\n");
            }
        }
    }

    /// Files that failed.
    pub fn failed_files(&self) -> usize {
        self.failed
    }

    /// Share of records that passed, in percent (100 when there were none).
    pub fn pass_rate(&self) -> f64 {
        if self.records == 0 {
            return 100.0;
        }
        let passed = self.records.saturating_sub(self.failed_records);
        100.0 * passed as f64 / self.records as f64
    }

    /// Prints `N passed, N failed; R of M records passed (P %)`; returns the failed count.
    pub fn finish(&self) -> usize {
        println!(
            "{} passed, {} failed; {} of {} records passed ({:.1} %)",
            self.passed,
            self.failed,
            self.records.saturating_sub(self.failed_records),
            self.records,
            self.pass_rate()
        );
        self.failed
    }
}

/// `.slt` files under `path` (itself if a file), sorted, each with the directory that
/// holds its `scratch/` (`path` itself, or a file's parent).
pub fn collect_files(path: &Path) -> std::io::Result<Vec<(PathBuf, PathBuf)>> {
    let root = if path.is_file() {
        path.parent().unwrap_or(Path::new(".")).to_owned()
    } else {
        path.to_owned()
    };
    let mut out = Vec::new();
    collect_into(path, &mut out)?;
    out.sort();
    Ok(out.into_iter().map(|f| (root.clone(), f)).collect())
}

#[expect(
    clippy::disallowed_methods,
    reason = "lists files before any runs, from synchronous callers"
)]
fn collect_into(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_file() {
        out.push(path.to_owned());
        return Ok(());
    }
    for entry in std::fs::read_dir(path)? {
        let p = entry?.path();
        if p.is_dir() {
            // A previous run's output, not tests.
            if p.file_name().is_some_and(|n| n == "scratch") {
                continue;
            }
            collect_into(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "slt") {
            out.push(p);
        }
    }
    Ok(())
}
