//! The `clearice` binary: SQL shell (REPL, `-c`, `-f`), `demo init` and `slt`. The OS
//! principal of local sessions ([`whoami`]) lives here, above the engine.
//!
//! ```text
//!  clearice [-c SQL | -f FILE | REPL] ─▶ whoami (the OS principal) ─▶ Engine::session
//!  clearice serve ─▶ clearice-flight (Flight SQL, TLS, users)   clearice worker ─▶ cluster
//!  clearice demo init / first run ─▶ clearice-demo (owner: the OS principal)
//!  clearice slt, policy check, keys rotate, crypto-server
//! ```
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

pub mod exec;
pub mod memory;
pub mod output;
pub mod repl;
pub mod serve;
pub mod whoami;

// The binary (main.rs) sets up logging with it.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing_subscriber as _;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use clearice_engine::{Config, Engine};

use crate::output::Format;
use crate::whoami::PrincipalSource;

/// ClearIce: SQL over Iceberg tables encrypted with Parquet Modular Encryption.
#[derive(Debug, Parser)]
#[command(name = "clearice", version, about)]
pub struct Cli {
    /// Config file (TOML). Default: the demo lake in the user's data directory,
    /// created on first run.
    #[arg(long, global = true, env = "CLEARICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Run this SQL (repeatable; several statements per value are fine) and exit.
    #[arg(short = 'c', long = "command")]
    pub commands: Vec<String>,
    /// Run the SQL in this file and exit.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Output format of results.
    #[arg(long, value_enum, default_value = "table", env = "CLEARICE_FORMAT")]
    pub format: Format,
    /// Principal the policy applies to. Default: the OS user.
    #[arg(long, global = true, env = "CLEARICE_USER")]
    pub user: Option<String>,
    /// No banner and no row-count/timing lines.
    #[arg(short, long)]
    pub quiet: bool,
    /// Coordinate the config's `[cluster]` workers: catalog scans run on them (policy,
    /// masks' decisions and audit stay here). For the shell, `-c`/`-f`, `slt` and `serve`.
    #[arg(long, global = true)]
    pub distributed: bool,
    /// Log filter (tracing EnvFilter syntax), e.g. `debug` or `clearice_iceberg=debug`.
    #[arg(long, env = "CLEARICE_LOG", default_value = "warn")]
    pub log_filter: String,
    /// Subcommand.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Demo lake commands.
    Demo {
        /// What to do.
        #[command(subcommand)]
        action: DemoAction,
    },
    /// Run sqllogictest files (or directories of them) against a lake.
    Slt {
        /// Rewrite the files with the actual results instead of checking them.
        #[arg(long)]
        complete: bool,
        /// Run over Flight SQL at this URL (`grpc://host:port`) instead of in-process; each
        /// `connection NAME` logs in as NAME (password: CLEARICE_SLT_PASSWORD, else NAME).
        #[arg(long)]
        flight: Option<String>,
        /// Files run at once (default: one per core).
        #[arg(long, short = 'j')]
        jobs: Option<usize>,
        /// Seconds a file may run; a file still running then fails.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Paths under this directory print as `WORKSPACE_ROOT` (DataFusion's convention).
        #[arg(long)]
        workspace_root: Option<PathBuf>,
        /// Sessions start with DataFusion's stock options, as DataFusion's own runner sets
        /// them (target_partitions = 4, information_schema off), to run files written for
        /// DataFusion unchanged.
        #[arg(long)]
        datafusion_session: bool,
        /// Exit 0 when the record pass rate is at least this percentage, even if records
        /// failed (conformance runs of another engine's files).
        #[arg(long)]
        min_pass_rate: Option<f64>,
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Serve the lakes over Arrow Flight SQL (DBeaver, ADBC, Superset).
    Serve {
        /// Listen address; port 0 picks a free port. Default: `[server] addr`, else 127.0.0.1:50051.
        #[arg(long, env = "CLEARICE_ADDR")]
        addr: Option<String>,
        /// Write the bound address (host:port) to this file once listening.
        #[arg(long)]
        addr_file: Option<PathBuf>,
        /// The Prometheus endpoint.
        #[command(flatten)]
        metrics: serve::MetricsArgs,
    },
    /// Run a cluster worker: executes the stages coordinators of the same `[cluster]`
    /// (same secret) send, with this config's catalogs and KMS.
    Worker {
        /// Listen address; port 0 picks a free port. Default 127.0.0.1:50061.
        #[arg(long, env = "CLEARICE_WORKER_ADDR")]
        addr: Option<String>,
        /// Write the bound address (host:port) to this file once listening.
        #[arg(long)]
        addr_file: Option<PathBuf>,
        /// The Prometheus endpoint.
        #[command(flatten)]
        metrics: serve::MetricsArgs,
    },
    /// Run the reference crypto service of the `remote` provider (keys stay in it).
    CryptoServer {
        /// Listen address; port 0 picks a free port. Default: the file's `listen`, else
        /// 127.0.0.1:8443.
        #[arg(long)]
        addr: Option<String>,
        /// Write the bound address (host:port) to this file once listening.
        #[arg(long)]
        addr_file: Option<PathBuf>,
        /// The Prometheus endpoint.
        #[command(flatten)]
        metrics: serve::MetricsArgs,
    },
    /// Key management commands.
    Keys {
        /// What to do.
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Column policy commands.
    Policy {
        /// What to do.
        #[command(subcommand)]
        action: PolicyAction,
    },
}

/// `policy` actions.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Check the configured policy against the catalogs: tables, columns, mask types,
    /// and the master keys encrypted columns really use.
    Check,
    /// Import an Apache Ranger policy export (Hive or Trino service JSON) as policy TOML,
    /// merged into a base policy; what cannot be carried over exactly is listed (never
    /// imported more permissively), and a restriction ClearIce cannot express fails.
    ImportRanger {
        /// The export (JSON, as Ranger's Export button or `exportJson` writes it).
        export: PathBuf,
        /// The ClearIce catalog the Hive databases (Trino schemas) are namespaces of.
        #[arg(long)]
        catalog: String,
        /// Import only this Ranger service's policies (default: every Hive and Trino one).
        #[arg(long)]
        service: Option<String>,
        /// Policy to merge into (its users' roles decide where Ranger's precedence needs
        /// a user rule; its comments are kept).
        #[arg(long)]
        base: Option<PathBuf>,
        /// Where to write the policy (replaced whole; may be the base). Default: stdout.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
}

/// `keys` actions.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Rotate a master key without rewriting data files: a new keyring version (AWS KMS
    /// versions its keys itself), and every external key material side file under PATHS
    /// (default: the catalogs' warehouses) re-wrapped under it.
    Rotate {
        /// The master key id.
        #[arg(long)]
        master_key: String,
        /// Directories holding data files with external key material.
        paths: Vec<PathBuf>,
    },
}

/// `demo` actions.
#[derive(Debug, Subcommand)]
pub enum DemoAction {
    /// Write a demo lake (catalog, keyring, encrypted tables, clearice.toml) into DIR.
    Init {
        /// Target directory (absent or empty).
        dir: PathBuf,
        /// Who protects the PII columns: `local` (keyring in the lake) or `remote` (a
        /// `clearice crypto-server` holding the PII key, set up in DIR/crypto-server).
        #[arg(long, default_value = "local", value_parser = ["local", "remote"])]
        provider: String,
        /// Where the tables' files go: `s3://BUCKET/PREFIX` (the bucket must exist;
        /// credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile).
        /// Default DIR/warehouse.
        #[arg(long)]
        warehouse: Option<String>,
        /// S3 endpoint URL (MinIO...; default AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL,
        /// else AWS). Written to the lake's `[storage.s3]`.
        #[arg(long)]
        s3_endpoint: Option<String>,
    },
}

/// The principal of local sessions and where it came from: `--user`, `CLEARICE_USER`,
/// else the OS account of the effective uid. `None` when none can be found.
pub fn local_principal(cli: &Cli) -> Option<(String, PrincipalSource)> {
    if let Some(u) = &cli.user {
        let from_flag = std::env::args().any(|a| a == "--user" || a.starts_with("--user="));
        let source = if from_flag {
            PrincipalSource::Flag
        } else {
            PrincipalSource::Env
        };
        return Some((u.clone(), source));
    }
    whoami::default_principal()
}

/// The one-line error when no principal can be found.
/// The process exit code for an error, by its type (README, "Exit codes"): a query
/// error by its [`ErrorClass`](clearice_engine::ErrorClass), a configuration error 2,
/// anything else 1.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use clearice_engine::ErrorClass;
    if let Some(df) = e
        .chain()
        .find_map(|c| c.downcast_ref::<datafusion::error::DataFusionError>())
    {
        return match clearice_engine::classify(df) {
            ErrorClass::Internal => 1,
            ErrorClass::InvalidQuery | ErrorClass::NotFound => 3,
            ErrorClass::Denied => 4,
            ErrorClass::DataUnusable => 5,
            ErrorClass::Tampered => 6,
            ErrorClass::Timeout | ErrorClass::ResourceLimit => 7,
            ErrorClass::Unavailable => 8,
            ErrorClass::Unsupported => 9,
            ErrorClass::Cancelled => 130,
        };
    }
    if let Some(
        clearice_crypto_server::Error::Config { .. } | clearice_crypto_server::Error::Kms(_),
    ) = e
        .chain()
        .find_map(|c| c.downcast_ref::<clearice_crypto_server::Error>())
    {
        return 2;
    }
    match e
        .chain()
        .find_map(|c| c.downcast_ref::<clearice_engine::Error>())
    {
        Some(
            clearice_engine::Error::ConfigRead { .. }
            | clearice_engine::Error::ConfigParse { .. }
            | clearice_engine::Error::ConfigValue { .. }
            | clearice_engine::Error::Policy(_)
            | clearice_engine::Error::Crypto(_)
            | clearice_engine::Error::Audit(_),
        ) => 2,
        Some(clearice_engine::Error::Table(_)) => 8,
        _ => 1,
    }
}

fn no_principal() -> anyhow::Error {
    anyhow::anyhow!(
        "cannot tell who you are: the effective uid has no entry in the user database and USER is not set; pass --user NAME (or set CLEARICE_USER)"
    )
}

/// The default demo lake's directory.
pub fn default_demo_dir() -> Result<PathBuf> {
    Ok(dirs::data_dir()
        .context("no user data directory (set HOME or use --config)")?
        .join("clearice")
        .join("demo"))
}

/// The demo lake's options as `clearice demo init` writes it: the OS account that runs
/// it (not `--user`/`CLEARICE_USER`) becomes an admin, so the first query shows plaintext.
fn demo_options() -> clearice_demo::DemoOptions {
    clearice_demo::DemoOptions {
        owner: whoami::default_principal().map(|(name, _)| name),
        ..Default::default()
    }
}

async fn config_or_demo(config: Option<&Path>, quiet: bool) -> Result<Config> {
    let path = match config {
        Some(p) => p.to_owned(),
        None => {
            let dir = default_demo_dir()?;
            let path = dir.join("clearice.toml");
            if !path.exists() {
                if !quiet {
                    eprintln!("Creating the demo lake in {} (first run)...", dir.display());
                }
                clearice_demo::init_with(&dir, demo_options()).await?;
            }
            path
        }
    };
    Ok(Config::load(&path)?)
}

/// Opens the engine, as the coordinator of its `[cluster]` with `--distributed`.
async fn open_engine(cli: &Cli, config: Config) -> Result<Engine> {
    let engine = Engine::open(config).await?;
    Ok(if cli.distributed {
        engine.distribute()?
    } else {
        engine
    })
}

/// Runs the CLI; returns the process exit code. Interactive queries run on `cpu`.
pub async fn run(cli: Cli, cpu: tokio::runtime::Handle) -> Result<i32> {
    let principal = local_principal(&cli);
    let user = principal
        .as_ref()
        .map(|(u, _)| u.clone())
        .unwrap_or_default();
    match &cli.command {
        Some(Command::Demo {
            action:
                DemoAction::Init {
                    dir,
                    provider,
                    warehouse,
                    s3_endpoint,
                },
        }) => {
            let mut s3 = clearice_engine::S3Options {
                endpoint: s3_endpoint.clone(),
                ..Default::default()
            };
            if warehouse.is_some() {
                // Written to the lake's config: the endpoint the environment names too.
                s3 = s3.with_environment();
                s3.access_key_id = None;
                s3.secret_access_key = None;
                s3.session_token = None;
            }
            let options = clearice_demo::DemoOptions {
                remote: provider == "remote",
                warehouse: warehouse.clone(),
                s3,
                ..demo_options()
            };
            let path = clearice_demo::init_with(dir, options).await?;
            if provider == "remote" {
                println!(
                    "Demo lake written; its PII key is held by the demo crypto service. Start it with:\n  clearice crypto-server --config {}\nthen query with:\n  clearice --config {}",
                    dir.join("crypto-server/crypto-server.toml").display(),
                    path.display()
                );
                return Ok(0);
            }
            println!(
                "Demo lake written. Query it with:\n  clearice --config {}",
                path.display()
            );
            return Ok(0);
        }
        Some(Command::Serve {
            addr,
            addr_file,
            metrics,
        }) => {
            let config = config_or_demo(cli.config.as_deref(), cli.quiet).await?;
            let engine = Arc::new(open_engine(&cli, config).await?);
            // The network (tonic, logins, cancellation) on this runtime; planning and
            // execution on the CPU runtime.
            let cpu = clearice_engine::CpuExecutor::new(cpu);
            return serve::run(engine, addr.clone(), addr_file.clone(), metrics, cpu).await;
        }
        Some(Command::Worker {
            addr,
            addr_file,
            metrics,
        }) => {
            let path = cli.config.as_deref().ok_or_else(|| {
                anyhow::anyhow!("no config given: run clearice worker --config FILE")
            })?;
            let config = Config::load(path)?;
            let engine = Engine::open(config).await?;
            return serve::worker(engine, addr.clone(), addr_file.clone(), metrics).await;
        }
        Some(Command::CryptoServer {
            addr,
            addr_file,
            metrics,
        }) => {
            let path =
                cli.config
                    .as_deref()
                    .ok_or_else(|| clearice_crypto_server::Error::Config {
                        path: "--config".into(),
                        reason: "no file given: run clearice crypto-server --config FILE".into(),
                    })?;
            return serve::crypto_server(path, addr.clone(), addr_file.clone(), metrics).await;
        }
        Some(Command::Keys {
            action: KeysAction::Rotate { master_key, paths },
        }) => {
            let config = config_or_demo(cli.config.as_deref(), true).await?;
            let report = clearice_engine::rotate_master_key(&config, master_key, paths).await?;
            match report.keyring_version {
                Some(v) => println!("master key '{master_key}': keyring version {v} added"),
                None => println!("master key '{master_key}': versioned by the KMS"),
            }
            println!(
                "re-wrapped {} key(s) in {} side file(s); data files untouched",
                report.keys, report.side_files
            );
            return Ok(0);
        }
        Some(Command::Policy {
            action: PolicyAction::Check,
        }) => {
            let engine = Engine::open(config_or_demo(cli.config.as_deref(), true).await?).await?;
            let problems = engine.check_policy().await;
            for p in &problems {
                println!("{p}");
            }
            let tables = engine.policy().tables().count();
            if problems.is_empty() {
                println!(
                    "policy '{}': OK ({tables} tables checked)",
                    engine.policy().source()
                );
                return Ok(0);
            }
            println!(
                "policy '{}': {} problem(s)",
                engine.policy().source(),
                problems.len()
            );
            return Ok(1);
        }
        Some(Command::Policy {
            action:
                PolicyAction::ImportRanger {
                    export,
                    catalog,
                    service,
                    base,
                    output,
                },
        }) => {
            return import_ranger(
                export,
                catalog,
                service.as_deref(),
                base.as_deref(),
                output.as_deref(),
            )
            .await;
        }
        Some(Command::Slt {
            paths,
            complete,
            flight,
            jobs,
            timeout,
            workspace_root,
            datafusion_session,
            min_pass_rate,
        }) => {
            if principal.is_none() {
                return Err(no_principal());
            }
            let mut files = Vec::new();
            for p in paths {
                let found = clearice_sqllogictest::collect_files(p)
                    .with_context(|| format!("'{}'", p.display()))?;
                if found.is_empty() {
                    bail!("no .slt files in '{}'", p.display());
                }
                files.extend(found);
            }
            let workspace_root = match workspace_root {
                Some(r) => Some(
                    r.canonicalize()
                        .with_context(|| format!("workspace root '{}'", r.display()))?
                        .to_string_lossy()
                        .into_owned(),
                ),
                None => None,
            };
            let mut options = clearice_sqllogictest::RunOptions {
                complete: *complete,
                workspace_root,
                datafusion_session: *datafusion_session,
                distributed: cli.distributed,
                file_timeout: Some(std::time::Duration::from_secs(*timeout)),
                executor: Some(cpu.clone()),
                ..clearice_sqllogictest::RunOptions::new(&user)
            };
            if let Some(j) = jobs {
                options.jobs = *j;
            }
            let summary = match flight {
                Some(url) => {
                    if *complete {
                        bail!("--complete rewrites files from an in-process run; drop --flight");
                    }
                    let mut summary = clearice_sqllogictest::Summary::default();
                    for (_, f) in &files {
                        let start = std::time::Instant::now();
                        let r = clearice_sqllogictest::run_file_flight(url, f, &options).await;
                        summary.report(&r, start);
                    }
                    summary
                }
                None => {
                    let config = config_or_demo(cli.config.as_deref(), true).await?;
                    let engine = Arc::new(open_engine(&cli, config).await?);
                    clearice_sqllogictest::run_files(engine, &files, &options).await
                }
            };
            let failed = summary.finish();
            let ok = match min_pass_rate {
                Some(min) => summary.pass_rate() >= *min,
                None => failed == 0,
            };
            if let Some(min) = min_pass_rate {
                println!(
                    "pass rate {:.1} % (required: at least {min:.1} %)",
                    summary.pass_rate()
                );
            }
            return Ok(if ok { 0 } else { 1 });
        }
        None => {}
    }
    let Some((_, source)) = principal else {
        return Err(no_principal());
    };
    let engine = open_engine(
        &cli,
        config_or_demo(cli.config.as_deref(), cli.quiet).await?,
    )
    .await?;
    let interactive = cli.commands.is_empty() && cli.file.is_none();
    let ctx = Arc::new(engine.session_for(&user, if interactive { "repl" } else { "cli" }));
    if interactive {
        let hint = match source {
            PrincipalSource::Flag | PrincipalSource::Env => String::new(),
            PrincipalSource::OsAccount | PrincipalSource::UserVariable => {
                "; --user NAME to act as another principal".into()
            }
        };
        let known = if engine.policy().is_known(&user) {
            String::new()
        } else {
            format!(
                "\nWarning: '{user}' is not a user in policy '{}': every table is denied",
                engine.policy().source()
            )
        };
        let banner = format!(
            "ClearIce {} — {} as '{user}' (from {source}{hint}){known}",
            env!("CARGO_PKG_VERSION"),
            engine.config().source
        );
        repl::run(Arc::clone(&ctx), &cpu, &banner, cli.format, cli.quiet).await?;
        return Ok(0);
    }
    for c in &cli.commands {
        exec::run_script(&ctx, c, cli.format, cli.quiet).await?;
    }
    if let Some(f) = &cli.file {
        let text = tokio::fs::read_to_string(f)
            .await
            .with_context(|| format!("cannot read '{}'", f.display()))?;
        exec::run_script(&ctx, &text, cli.format, cli.quiet).await?;
    }
    Ok(0)
}

/// Replaces `path` with `text`: written to a new file beside it (created, never
/// followed if it exists), synced, given the old file's permissions, then renamed over
/// it; on failure the old file stays and the new one is removed.
async fn write_replacing(path: &Path, text: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "policy.toml".into());
    let tmp = path.with_file_name(format!(".{name}.{}.importing", std::process::id()));
    let written = async {
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .await?;
        f.write_all(text.as_bytes()).await?;
        f.sync_all().await?;
        if let Ok(old) = tokio::fs::metadata(path).await {
            tokio::fs::set_permissions(&tmp, old.permissions()).await?;
        }
        tokio::fs::rename(&tmp, path).await
    }
    .await;
    if let Err(e) = written {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e).with_context(|| format!("writing '{}'", path.display()));
    }
    Ok(())
}

/// `clearice policy import-ranger`: the notes on stderr, the policy to `output` (written
/// beside it and renamed, so a failed import leaves it as it was) or stdout.
async fn import_ranger(
    export: &Path,
    catalog: &str,
    service: Option<&str>,
    base: Option<&Path>,
    output: Option<&Path>,
) -> Result<i32> {
    async fn read(p: &Path) -> Result<String> {
        tokio::fs::read_to_string(p)
            .await
            .with_context(|| format!("reading '{}'", p.display()))
    }
    let text = read(export).await?;
    let base_text = match base {
        Some(b) => Some(read(b).await?),
        None => None,
    };
    let base_name = base.map(|p| p.display().to_string());
    let options = clearice_policy::RangerOptions { catalog, service };
    let imported = clearice_policy::import_ranger(
        &text,
        &export.display().to_string(),
        &options,
        base_text.as_deref().zip(base_name.as_deref()),
    )?;
    for n in &imported.notes {
        eprintln!("note: {n}");
    }
    match output {
        Some(path) => {
            write_replacing(path, &imported.policy_text).await?;
            eprintln!(
                "policy written to '{}' ({} note(s)); check it against the catalogs with `clearice policy check`",
                path.display(),
                imported.notes.len()
            );
        }
        None => print!("{}", imported.policy_text),
    }
    Ok(0)
}
