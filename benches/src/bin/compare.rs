//! Query runner of the comparison harness (`benches/compare/run.py`): one long-lived
//! process per engine, so every statement is timed warm, in the same process, as a user's
//! repeated query would run.
//!
//! ```text
//! compare clearice   --config clearice.toml --user admin [--distributed]   # coordinator of [cluster]
//!                    [--namespace CATALOG.SCHEMA]   # where unqualified names resolve
//! compare datafusion --keyring keyring.json --table NAME=PATH[:encrypted] ...
//! compare server-users admin ...     # prints [server.users.*] (password = name)
//! ```
//!
//! Reads commands on stdin, one per line, tab-separated, and answers one line each:
//! - `RUN <sql>`: runs the statement to the end (batches drained, not kept);
//!   answers `<seconds> <rows>`.
//! - `DUMP <path> <sql>`: runs it and writes the result as an Arrow IPC file; answers `ok`.
//! - `KMS`: answers the number of KMS unwraps so far.
//!
//! Errors answer `error <message>` and the runner goes on.
//!
//! `datafusion` is DataFusion 53 as a user would set it up (defaults, no ClearIce code
//! on the read path) with parquet-rs's own PME decryption; keys come from the same
//! keyring through an `EncryptionFactory` that resolves PKMT1 key material.
//!
//! Both engines run on mimalloc, the allocator of the `clearice` binary and of datafusion-cli.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::config::EncryptionFactoryOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::parquet_encryption::EncryptionFactory;
use datafusion::parquet::encryption::decrypt::FileDecryptionProperties;
use datafusion::parquet::encryption::encrypt::FileEncryptionProperties;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use clearice_crypto::{KeyResolver, KeyringKms, Kms};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[expect(
    clippy::large_enum_variant,
    reason = "one runner per process, never moved after it is built"
)]
enum Runner {
    ClearIce {
        engine: Arc<clearice_engine::Engine>,
        session: clearice_engine::Session,
    },
    DataFusion {
        ctx: SessionContext,
        resolver: Arc<KeyResolver>,
    },
}

impl Runner {
    async fn stream(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        match self {
            Runner::ClearIce { session, .. } => session
                .sql_stream(sql)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e))),
            Runner::DataFusion { ctx, .. } => ctx.sql(sql).await?.execute_stream().await,
        }
    }

    fn kms_unwraps(&self) -> u64 {
        match self {
            Runner::ClearIce { engine, .. } => engine.key_resolver().kms_unwrap_count(),
            Runner::DataFusion { resolver, .. } => resolver.kms_unwrap_count(),
        }
    }
}

/// PKMT1 key material → keys, through the keyring KMS (KEKs cached by the resolver, one
/// retriever per file as a user's factory would keep).
#[derive(Debug)]
struct KeyringFactory {
    resolver: Arc<KeyResolver>,
    files: Mutex<HashMap<String, Arc<FileDecryptionProperties>>>,
}

#[async_trait::async_trait]
impl EncryptionFactory for KeyringFactory {
    async fn get_file_encryption_properties(
        &self,
        _config: &EncryptionFactoryOptions,
        _schema: &SchemaRef,
        _file_path: &object_store::path::Path,
    ) -> Result<Option<Arc<FileEncryptionProperties>>> {
        Err(DataFusionError::NotImplemented(
            "the comparison runner only reads".into(),
        ))
    }

    async fn get_file_decryption_properties(
        &self,
        _config: &EncryptionFactoryOptions,
        file_path: &object_store::path::Path,
    ) -> Result<Option<Arc<FileDecryptionProperties>>> {
        let mut files = self.files.lock().expect("not poisoned");
        if let Some(p) = files.get(file_path.as_ref()) {
            return Ok(Some(Arc::clone(p)));
        }
        let retriever = self
            .resolver
            .retriever_for_file(file_path.as_ref().to_owned(), None);
        let props = FileDecryptionProperties::with_key_retriever(retriever).build()?;
        files.insert(file_path.as_ref().to_owned(), Arc::clone(&props));
        Ok(Some(props))
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn open(args: &[String]) -> anyhow::Result<Runner> {
    match args.first().map(String::as_str) {
        Some("clearice") => {
            let config = arg(args, "--config").ok_or_else(|| anyhow::anyhow!("--config"))?;
            let user = arg(args, "--user").unwrap_or_else(|| "admin".into());
            let mut engine =
                clearice_engine::Engine::open(clearice_engine::Config::load(config.as_ref())?)
                    .await?;
            if args.iter().any(|a| a == "--distributed") {
                engine = engine.distribute()?;
            }
            let engine = Arc::new(engine);
            let session = engine.session_for(&user, "bench");
            if let Some(ns) = arg(args, "--namespace") {
                let (catalog, schema) = ns
                    .split_once('.')
                    .ok_or_else(|| anyhow::anyhow!("--namespace CATALOG.SCHEMA"))?;
                session.use_namespace(Some(catalog), Some(schema))?;
            }
            Ok(Runner::ClearIce { engine, session })
        }
        Some("datafusion") => {
            let keyring = arg(args, "--keyring").ok_or_else(|| anyhow::anyhow!("--keyring"))?;
            let kms: Arc<dyn Kms> = Arc::new(KeyringKms::from_file(keyring.as_ref())?);
            let resolver = Arc::new(KeyResolver::new(
                Some(kms),
                HashMap::new(),
                clearice_crypto::DEFAULT_KEY_CACHE_TTL,
            ));
            // `--memory-limit MB`: DataFusion's FairSpillPool, as `datafusion-cli
            // --memory-limit` makes it.
            let ctx = match arg(args, "--memory-limit") {
                Some(mb) => {
                    let bytes = mb.parse::<usize>()?.saturating_mul(1 << 20);
                    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
                        .with_memory_pool(Arc::new(
                            datafusion::execution::memory_pool::FairSpillPool::new(bytes),
                        ))
                        .build_arc()?;
                    SessionContext::new_with_config_rt(Default::default(), runtime)
                }
                None => SessionContext::new(),
            };
            ctx.runtime_env().register_parquet_encryption_factory(
                "keyring",
                Arc::new(KeyringFactory {
                    resolver: Arc::clone(&resolver),
                    files: Mutex::default(),
                }),
            );
            for (i, a) in args.iter().enumerate() {
                if a != "--table" {
                    continue;
                }
                let spec = args.get(i + 1).ok_or_else(|| anyhow::anyhow!("--table"))?;
                let (name, rest) = spec
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--table NAME=PATH"))?;
                let (path, encrypted) = match rest.strip_suffix(":encrypted") {
                    Some(p) => (p, true),
                    None => (rest, false),
                };
                let options = if encrypted {
                    " OPTIONS ('format.crypto.factory_id' 'keyring')"
                } else {
                    ""
                };
                ctx.sql(&format!(
                    "CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{path}'{options}"
                ))
                .await?
                .collect()
                .await?;
            }
            Ok(Runner::DataFusion { ctx, resolver })
        }
        _ => anyhow::bail!("usage: compare clearice|datafusion ..."),
    }
}

async fn run(runner: &Runner, sql: &str) -> Result<(f64, usize)> {
    let start = Instant::now();
    let mut stream = runner.stream(sql).await?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    Ok((start.elapsed().as_secs_f64(), rows))
}

async fn collect(runner: &Runner, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let mut stream = runner.stream(sql).await?;
    let schema = stream.schema();
    let mut batches = vec![];
    while let Some(batch) = stream.next().await {
        batches.push(batch?);
    }
    Ok((schema, batches))
}

#[expect(
    clippy::disallowed_methods,
    reason = "called on the runner's main thread, outside the runtime"
)]
fn write_ipc(path: &str, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let mut writer = FileWriter::try_new(std::fs::File::create(path)?, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("server-users") {
        // `[server.users.NAME]` sections whose password is the name (bench configs only).
        let users: Vec<&str> = args[1..].iter().map(String::as_str).collect();
        print!(
            "{}",
            clearice_demo::server_users(&users).map_err(|e| anyhow::anyhow!("{e}"))?
        );
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let runner = rt.block_on(open(&args))?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        let mut parts = line.splitn(3, '\t');
        let answer = match (parts.next(), parts.next(), parts.next()) {
            (Some("RUN"), Some(sql), None) => match rt.block_on(run(&runner, sql)) {
                Ok((s, rows)) => format!("{s:.6} {rows}"),
                Err(e) => format!("error {}", one_line(&e)),
            },
            (Some("DUMP"), Some(path), Some(sql)) => match rt
                .block_on(collect(&runner, sql))
                .and_then(|(schema, batches)| write_ipc(path, &schema, &batches))
            {
                Ok(()) => "ok".into(),
                Err(e) => format!("error {}", one_line(&e)),
            },
            (Some("KMS"), None, None) => runner.kms_unwraps().to_string(),
            _ => format!("error unknown command: {line}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string().replace('\n', " ")
}
