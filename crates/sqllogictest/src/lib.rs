//! sqllogictest runner for ClearIce: runs `.slt` files against an [`Engine`], each file
//! in fresh sessions. A `connection NAME` record runs what follows as principal `NAME`
//! (its own session); the default connection runs as the runner's default principal.
//! Principals are never settable from SQL.
//!
//! Values are rendered as DataFusion's own runner does: NULL as `NULL`, the empty
//! string as `(empty)`, everything else with Arrow's display. Column type letters are
//! not checked.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clearice_engine::{Engine, Session};
use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use sqllogictest::{
    Connection, DBOutput, DefaultColumnType, Record, Runner, default_column_validator,
    default_normalizer, default_validator, update_record_with_output,
};

/// An error from a statement, as the `.slt` file sees it (one line).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SqlError(String);

/// One ClearIce session as a sqllogictest database.
pub struct ClearIceDb {
    session: Session,
}

impl ClearIceDb {
    /// Wraps a session.
    pub fn new(session: Session) -> Self {
        Self { session }
    }
}

fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn column_type(dt: &DataType) -> DefaultColumnType {
    match dt {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            DefaultColumnType::Integer
        }
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            DefaultColumnType::Integer
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            DefaultColumnType::FloatingPoint
        }
        DataType::Decimal128(..) | DataType::Decimal256(..) => DefaultColumnType::FloatingPoint,
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => DefaultColumnType::Text,
        _ => DefaultColumnType::Any,
    }
}

/// Renders batches as sqllogictest rows.
pub fn batches_to_rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, SqlError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let fmts: Vec<ArrayFormatter<'_>> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<_, _>>()
            .map_err(|e| SqlError(one_line(e)))?;
        for r in 0..b.num_rows() {
            rows.push(
                fmts.iter()
                    .zip(b.columns())
                    .map(|(f, c)| {
                        let s = f.value(r).to_string();
                        if s.is_empty() && !c.is_null(r) {
                            "(empty)".to_string()
                        } else {
                            s
                        }
                    })
                    .collect(),
            );
        }
    }
    Ok(rows)
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for ClearIceDb {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        let out = self
            .session
            .sql(sql)
            .await
            .map_err(|e| SqlError(one_line(e)))?;
        let types: Vec<_> = out
            .schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        if types.is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        Ok(DBOutput::Rows {
            types,
            rows: batches_to_rows(&out.batches)?,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "clearice"
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
            .map_err(|e| SqlError(one_line(e)))?
            .connect()
            .await
            .map_err(|e| SqlError(one_line(e)))?;
        let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
        let password =
            std::env::var("CLEARICE_SLT_PASSWORD").unwrap_or_else(|_| principal.to_owned());
        let login_error = client
            .handshake(principal, &password)
            .await
            .err()
            .map(one_line);
        Ok(Self {
            client,
            login_error,
        })
    }
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for FlightDb {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        use futures::TryStreamExt;
        if let Some(e) = &self.login_error {
            return Err(SqlError(e.clone()));
        }
        let err = |e: arrow_flight::error::FlightError| SqlError(one_line(e));
        let info = self
            .client
            .execute(sql.to_owned(), None)
            .await
            .map_err(err)?;
        let schema = info
            .clone()
            .try_decode_schema()
            .map_err(|e| SqlError(one_line(e)))?;
        let mut batches = Vec::new();
        for ep in info.endpoint {
            let Some(ticket) = ep.ticket else { continue };
            let stream = self.client.do_get(ticket).await.map_err(err)?;
            batches.extend(stream.try_collect::<Vec<_>>().await.map_err(err)?);
        }
        let types: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        if types.is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        Ok(DBOutput::Rows {
            types,
            rows: batches_to_rows(&batches)?,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "flight"
    }
}

/// Runs one file over Flight SQL at `url`, one login per connection name.
pub async fn run_file_flight(
    url: &str,
    path: &Path,
    default_principal: &str,
    vars: &[(String, String)],
) -> FileResult {
    let principal = Arc::new(Mutex::new(default_principal.to_owned()));
    let p = Arc::clone(&principal);
    let url = url.to_owned();
    let mut runner = Runner::new(move || {
        let (url, who) = (url.clone(), p.lock().expect("principal").clone());
        async move { FlightDb::connect(&url, &who).await }
    });
    drive(
        &mut runner,
        &principal,
        path,
        default_principal,
        vars,
        false,
    )
    .await
}

/// Outcome of one file.
#[derive(Debug)]
pub struct FileResult {
    /// The file.
    pub path: PathBuf,
    /// Failed records, each as the runner's message.
    pub failures: Vec<String>,
    /// Records run.
    pub records: usize,
}

/// Runs one file with a fresh session per connection. With `complete`, rewrites the
/// file with the actual results instead of checking them. `vars` are available to
/// `control substitution on` blocks as `$NAME`.
pub async fn run_file(
    engine: Arc<Engine>,
    path: &Path,
    default_principal: &str,
    vars: &[(String, String)],
    complete: bool,
) -> FileResult {
    let principal = Arc::new(Mutex::new(default_principal.to_owned()));
    let p = Arc::clone(&principal);
    let e = Arc::clone(&engine);
    let mut runner = Runner::new(move || {
        let ctx = e.session_for(&p.lock().expect("principal"), "slt");
        async move { Ok::<_, SqlError>(ClearIceDb::new(ctx)) }
    });
    drive(
        &mut runner,
        &principal,
        path,
        default_principal,
        vars,
        complete,
    )
    .await
}

/// Runs (or, with `complete`, rewrites) one file's records on `runner`, setting
/// `principal` to each record's connection name before it runs: the runner makes a
/// connection on a name's first use, as that principal.
async fn drive<D, M>(
    runner: &mut Runner<D, M>,
    principal: &Mutex<String>,
    path: &Path,
    default_principal: &str,
    vars: &[(String, String)],
    complete: bool,
) -> FileResult
where
    D: sqllogictest::AsyncDB<ColumnType = DefaultColumnType>,
    M: sqllogictest::MakeConnection<Conn = D>,
{
    for (k, v) in vars {
        runner.set_var(k.clone(), v.clone());
    }
    let mut result = FileResult {
        path: path.to_owned(),
        failures: vec![],
        records: 0,
    };
    let records = match sqllogictest::parse_file::<DefaultColumnType>(path) {
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
                Connection::Default => default_principal.to_owned(),
            };
        }
        if complete {
            let out = runner.apply_record(record.clone()).await;
            let updated = update_record_with_output(
                &record,
                &out,
                " ",
                default_validator,
                default_normalizer,
                default_column_validator,
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
    if complete && let Err(e) = std::fs::write(path, completed) {
        result
            .failures
            .push(format!("cannot rewrite {}: {e}", path.display()));
    }
    result
}

/// Runs files in order, printing one line per file and a closing `N passed, N failed`.
/// Returns the number of failed files.
pub async fn run_files(
    engine: Arc<Engine>,
    files: &[PathBuf],
    default_principal: &str,
    complete: bool,
) -> usize {
    let mut summary = Summary::default();
    for f in files {
        let start = Instant::now();
        let r = run_file(Arc::clone(&engine), f, default_principal, &[], complete).await;
        summary.report(&r, start);
    }
    summary.finish()
}

/// Per-file reporting and the closing line.
#[derive(Debug, Default)]
pub struct Summary {
    passed: usize,
    failed: usize,
}

impl Summary {
    /// Prints one file's outcome.
    pub fn report(&mut self, r: &FileResult, start: Instant) {
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
                r.failures.len(),
                r.records
            );
            for msg in &r.failures {
                println!("{msg}\n");
            }
        }
    }

    /// Prints `N passed, N failed`; returns the failed count.
    pub fn finish(&self) -> usize {
        println!("{} passed, {} failed", self.passed, self.failed);
        self.failed
    }
}

/// `.slt` files under `path` (itself if a file), sorted.
pub fn collect_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let p = entry?.path();
        if p.is_dir() {
            out.extend(collect_files(&p)?);
        } else if p.extension().is_some_and(|e| e == "slt") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}
