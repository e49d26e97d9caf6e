//! Runs `sql-tests/**/*.slt` (harness = false). The first directory level picks the lake:
//! `demo/` a demo lake written by ClearIce, `writes/` another one that SQL writes change
//! (its policy: the demo's plus `writes/policy_extra.toml`), `interop/` the PyArrow/PyIceberg lake
//! (`CLEARICE_INTEROP_DIR`), `spark/` tables written by Spark 4.1 with Iceberg's runtime
//! (`CLEARICE_SPARK_LAKE`: row-level deletes, time travel, metadata tables; also run over
//! Flight SQL), `parquet_testing/` parquet-testing's files with their
//! explicit keys. Each file runs in fresh sessions.
//!
//! `cargo test -p clearice-sqllogictest --test sqllogictests [-- FILTER...]`
//!
//! With `CLEARICE_DEMO_ON_S3=1` the demo lake is written to a bucket of an S3 server
//! (`moto_server` next to `CLEARICE_PYTHON`, started here on a loopback port), so the
//! demo and policy suites (and the policy suite over Flight SQL) run against S3.
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clearice_engine::{Config, Engine};
use clearice_sqllogictest::{RunOptions, Summary, collect_files, run_file, run_file_flight};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../sql-tests")
        .canonicalize()
        .expect("sql-tests")
}

fn env_dir(var: &str, default: Option<PathBuf>) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or(default)
        .filter(|p| p.exists())
}

async fn open(dir: &Path, toml: &str) -> Arc<Engine> {
    let path = dir.join("clearice.toml");
    std::fs::write(&path, toml).expect("write config");
    Arc::new(
        Engine::open(Config::load(&path).expect("config"))
            .await
            .expect("engine"),
    )
}

#[tokio::main]
async fn main() {
    let complete = std::env::args().any(|a| a == "--complete");
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let require = std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_some();
    let files: Vec<PathBuf> = collect_files(&root())
        .expect("sql-tests")
        .into_iter()
        .map(|(_, f)| f)
        .filter(|f| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|x| f.to_string_lossy().contains(x.as_str()))
        })
        .collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut summary = Summary::default();
    let mut skipped = Vec::new();
    // One Flight SQL server per suite (each suite has its own lake and policy).
    let mut flight_urls: HashMap<String, String> = HashMap::new();
    let mut engines: HashMap<String, Option<Suite>> = Default::default();
    let mut clusters: HashMap<String, Arc<Engine>> = HashMap::new();
    for f in &files {
        let rel = f.strip_prefix(root()).unwrap_or(f);
        let suite = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        // policy/ runs on the demo lake, whose policy it tests, and again over Flight SQL.
        let over_flight = suite == "policy" || suite == "spark" || suite == "writes";
        let suite = if suite == "policy" {
            "demo".to_owned()
        } else {
            suite
        };
        if !engines.contains_key(&suite) {
            let e = make_engine(&suite, tmp.path()).await;
            if e.is_none() {
                assert!(
                    !require,
                    "suite '{suite}' needs fixtures that are missing, but CLEARICE_REQUIRE_FIXTURES is set"
                );
            }
            engines.insert(suite.clone(), e);
        }
        let Some((engine, vars)) = engines[&suite].clone() else {
            skipped.push(rel.display().to_string());
            continue;
        };
        let start = Instant::now();
        let options = RunOptions {
            complete,
            vars,
            ..RunOptions::new("admin")
        };
        let r = run_file(Arc::clone(&engine), f, &options).await;
        summary.report(&r, start);
        // The read-only suites again on three workers: same rows, same masks.
        if (suite == "demo" || suite == "interop") && !complete {
            let coordinator = match clusters.get(&suite) {
                Some(c) => Arc::clone(c),
                None => {
                    let c = cluster_of(&engine).await;
                    clusters.insert(suite.clone(), Arc::clone(&c));
                    c
                }
            };
            let options = RunOptions {
                distributed: true,
                ..options.clone()
            };
            let start = Instant::now();
            let mut r = run_file(Arc::clone(&coordinator), f, &options).await;
            r.path = PathBuf::from(format!("{} (on 3 workers)", f.display()));
            summary.report(&r, start);
            // Flight SQL sessions (confined, limited) on the coordinator too.
            if over_flight {
                let key = format!("{suite} (on 3 workers)");
                let url = match flight_urls.get(&key) {
                    Some(u) => u.clone(),
                    None => {
                        let u = start_flight(coordinator).await;
                        flight_urls.insert(key, u.clone());
                        u
                    }
                };
                let start = Instant::now();
                let mut r = run_file_flight(&url, f, &options).await;
                r.path = PathBuf::from(format!("{} (over Flight SQL, on 3 workers)", f.display()));
                summary.report(&r, start);
            }
        }
        if over_flight && !complete {
            let url = match flight_urls.get(&suite) {
                Some(u) => u.clone(),
                None => {
                    let u = start_flight(Arc::clone(&engine)).await;
                    flight_urls.insert(suite.clone(), u.clone());
                    u
                }
            };
            let start = Instant::now();
            let mut r = run_file_flight(&url, f, &options).await;
            r.path = PathBuf::from(format!("{} (over Flight SQL)", f.display()));
            summary.report(&r, start);
        }
    }
    for s in &skipped {
        println!("*** SKIPPED {s}: its fixtures are missing; run ./scripts/test.sh ***");
    }
    let failed = summary.finish() > 0;
    for mut c in MOTO.lock().expect("moto").drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }
    if failed {
        std::process::exit(1);
    }
}

/// A coordinator over `engine`'s lake with three workers on loopback ports, in this
/// process, each an engine of its own (own KMS client).
async fn cluster_of(engine: &Engine) -> Arc<Engine> {
    let source = PathBuf::from(&engine.config().source);
    std::fs::write(
        source.with_file_name("cluster.secret"),
        "9d1e0f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6",
    )
    .expect("secret");
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
        );
    }
    let urls: Vec<String> = listeners
        .iter()
        .map(|l| format!("\"http://{}\"", l.local_addr().expect("addr")))
        .collect();
    let mut text = std::fs::read_to_string(&source).expect("config");
    text.push_str(&format!(
        "\n[cluster]\nworkers = [{}]\nsecret_file = \"cluster.secret\"\n",
        urls.join(", ")
    ));
    let path = source.with_file_name("cluster.toml");
    std::fs::write(&path, text).expect("cluster config");
    for l in listeners {
        let worker = Engine::open(Config::load(&path).expect("config"))
            .await
            .expect("worker");
        tokio::spawn(async move {
            worker
                .serve_worker(l, std::future::pending())
                .await
                .expect("worker")
        });
    }
    Arc::new(
        Engine::open(Config::load(&path).expect("config"))
            .await
            .expect("coordinator")
            .distribute()
            .expect("coordinator"),
    )
}

/// An engine for a suite and the `$VARS` its files may use.
type Suite = (Arc<Engine>, Vec<(String, String)>);

async fn make_engine(suite: &str, tmp: &Path) -> Option<Suite> {
    let dir = tmp.join(suite);
    std::fs::create_dir_all(&dir).expect("suite dir");
    match suite {
        "demo" | "writes" => {
            let config = if std::env::var_os("CLEARICE_DEMO_ON_S3").is_some() {
                demo_on_s3(&dir).await
            } else {
                clearice_demo::init(&dir.join("lake"))
                    .await
                    .expect("demo init")
            };
            if suite == "writes" {
                // The demo policy, plus the tables the write tests create.
                let policy = config.with_file_name("policy.toml");
                let mut text = std::fs::read_to_string(&policy).expect("demo policy");
                text.push_str(
                    &std::fs::read_to_string(root().join("writes/policy_extra.toml"))
                        .expect("writes/policy_extra.toml"),
                );
                std::fs::write(&policy, text).expect("policy");
                // The pipeline writer of policy_extra.toml logs in over Flight too.
                let mut toml = std::fs::read_to_string(&config).expect("demo config");
                toml.push_str(&clearice_demo::server_users(&["etl"]).expect("etl user"));
                std::fs::write(&config, toml).expect("config");
            }
            let engine = Arc::new(
                Engine::open(Config::load(&config).expect("config"))
                    .await
                    .expect("engine"),
            );
            Some((engine, vec![]))
        }
        "interop" => {
            let i = env_dir("CLEARICE_INTEROP_DIR", None)?;
            let toml = format!(
                "[catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{i}/catalog.db\"\nwarehouse = \"file://{i}/warehouse\"\n\
                 [kms]\ntype = \"keyring\"\npath = \"{i}/keyring.json\"\n\
                 [policy]\npath = \"{p}\"\n",
                i = i.display(),
                p = root().join("interop/policy.toml").display()
            );
            Some((
                open(&dir, &toml).await,
                vec![("INTEROP_DIR".into(), i.display().to_string())],
            ))
        }
        "spark" => {
            let l = env_dir("CLEARICE_SPARK_LAKE", None)?;
            let i = env_dir("CLEARICE_INTEROP_DIR", None)?;
            let toml = format!(
                "[catalogs.spark]\ntype = \"sql\"\nuri = \"sqlite://{l}/catalog.db\"\nwarehouse = \"file://{l}/warehouse\"\n\
                 [kms]\ntype = \"keyring\"\npath = \"{i}/keyring.json\"\n\
                 [policy]\npath = \"{p}\"\n\
                 [server]\naddr = \"127.0.0.1:0\"\n{u}",
                l = l.display(),
                i = i.display(),
                p = root().join("spark/policy.toml").display(),
                u = clearice_demo::server_users(&["admin", "analyst"]).expect("users")
            );
            Some((open(&dir, &toml).await, vec![]))
        }
        "parquet_testing" => {
            let default = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/interop/parquet-testing");
            let p = env_dir("CLEARICE_PARQUET_TESTING_DIR", Some(default))?
                .canonicalize()
                .ok()?;
            std::fs::write(
                dir.join("explicit.json"),
                r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ==", "kc1": "MTIzNDU2Nzg5MDEyMzQ1MA==", "kc2": "MTIzNDU2Nzg5MDEyMzQ1MQ=="}"#,
            )
            .expect("keys");
            let toml = "[explicit_keys]\npath = \"explicit.json\"\n";
            Some((
                open(&dir, toml).await,
                vec![("PARQUET_TESTING_DIR".into(), p.display().to_string())],
            ))
        }
        other => {
            panic!(
                "sql-tests/{other}: unknown suite (expected demo, writes, interop, spark or parquet_testing)"
            )
        }
    }
}

/// The demo lake with its warehouse in a bucket of a `moto_server` started for the rest
/// of the run (stopped when the process exits: it is killed with its parent's pipe).
async fn demo_on_s3(dir: &Path) -> PathBuf {
    use std::process::{Command, Stdio};
    let python =
        std::env::var("CLEARICE_PYTHON").expect("CLEARICE_DEMO_ON_S3 needs CLEARICE_PYTHON");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let server = Path::new(&python).with_file_name("moto_server");
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", server.display()));
    MOTO.lock().expect("moto").push(child);
    let endpoint = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed().as_secs() < 60, "moto_server did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let made = Command::new(&python)
        .args([
            "-c",
            &format!(
                "import boto3; boto3.client('s3', endpoint_url='{endpoint}', aws_access_key_id='testing', \
                 aws_secret_access_key='testing', region_name='us-east-1').create_bucket(Bucket='demo')"
            ),
        ])
        .output()
        .expect("python");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let secret = dir.join("s3.secret");
    std::fs::write(&secret, "testing").expect("secret");
    let s3 = clearice_engine::S3Options {
        endpoint: Some(endpoint),
        region: Some("us-east-1".into()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some(clearice_engine::Secret::new("testing")),
        ..Default::default()
    };
    let config = clearice_demo::init_with(
        &dir.join("lake"),
        clearice_demo::DemoOptions {
            warehouse: Some("s3://demo/lake".into()),
            s3,
            ..Default::default()
        },
    )
    .await
    .expect("demo init on S3");
    let text = std::fs::read_to_string(&config).expect("config").replace(
        "[storage.s3]\n",
        &format!(
            "[storage.s3]\naccess_key_id = \"testing\"\nsecret_access_key_file = \"{}\"\n",
            secret.display()
        ),
    );
    std::fs::write(&config, text).expect("config");
    println!("demo lake on S3: s3://demo/lake");
    config
}

/// S3 servers started for this run, killed when it ends.
static MOTO: std::sync::Mutex<Vec<std::process::Child>> = std::sync::Mutex::new(Vec::new());

/// Serves `engine` over Flight SQL on a free loopback port for the rest of the run.
async fn start_flight(engine: Arc<Engine>) -> String {
    let server = engine
        .config()
        .server
        .clone()
        .expect("demo lake has [server]");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = clearice_flight::ClearIceFlightSql::new(engine, &server);
    tokio::spawn(clearice_flight::serve(
        service,
        listener,
        None,
        std::future::pending(),
    ));
    format!("grpc://{addr}")
}
