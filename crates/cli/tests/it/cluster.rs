//! Scale-out with real processes: three `clearice worker`s on loopback, one killed with
//! SIGKILL in the middle of a query.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use futures::StreamExt;

use crate::common::*;

pub(crate) const SECRET: &str = "0c5e2a7f19d84b36a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8";

/// A demo lake under `tmp` with `[cluster]` (secret, `workers`) in `cluster.toml`.
fn lake(tmp: &Path) -> PathBuf {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(demo::init(&tmp.join("lake"))).unwrap();
    std::fs::write(tmp.join("lake/cluster.secret"), SECRET).unwrap();
    config
}

/// A copy of `config` with `[cluster]` naming `workers` (host:port) and the secret in
/// `cluster.secret` next to it.
fn with_cluster(config: &Path, workers: &[String]) -> PathBuf {
    let mut text = std::fs::read_to_string(config).unwrap();
    let urls: Vec<String> = workers.iter().map(|a| format!("\"http://{a}\"")).collect();
    text.push_str(&format!(
        "\n[cluster]\nworkers = [{}]\nsecret_file = \"cluster.secret\"\npartitions_per_worker = 2\n",
        urls.join(", ")
    ));
    let path = config.with_file_name(format!("cluster-{}.toml", workers.len()));
    std::fs::write(&path, text).unwrap();
    path
}

/// `n` `clearice worker`s of `config`'s lake (addresses in `dir`), and the config of
/// their coordinator.
pub(crate) fn start_cluster(config: &Path, n: usize, dir: &Path) -> (Vec<Proc>, PathBuf) {
    let worker_config = with_cluster(config, &[]);
    let workers: Vec<Proc> = (0..n)
        .map(|i| {
            start(
                &worker_config,
                &["worker"],
                &dir.join(format!("worker{i}.addr")),
            )
        })
        .collect();
    let addrs: Vec<String> = workers.iter().map(|w| w.addr.clone()).collect();
    let coordinator = with_cluster(config, &addrs);
    (workers, coordinator)
}

#[test]
fn a_worker_killed_mid_query_fails_it_clearly_and_the_next_query_runs_on_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let config = lake(tmp.path());
    let (mut workers, coordinator_config) = start_cluster(&config, 3, tmp.path());
    // Rows are passed on at once (no retry window): a worker lost after the first row
    // fails the query.
    let mut text = std::fs::read_to_string(&coordinator_config).unwrap();
    text.push_str("retry_window_mb = 0\n");
    std::fs::write(&coordinator_config, text).unwrap();
    // The CLI as coordinator: the analyst's mask, applied on a worker.
    let out = run_ok(
        std::process::Command::new(env!("CARGO_BIN_EXE_clearice"))
            .arg("--config")
            .arg(&coordinator_config)
            .args([
                "--distributed",
                "--user",
                "analyst",
                "--format",
                "csv",
                "-q",
                "-c",
            ])
            .arg("SELECT id, ssn FROM lake.sales.customers WHERE id = 1000001"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "id,ssn\n1000001,XXX-XX-1603"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::open(Config::load(&coordinator_config).unwrap())
            .await
            .unwrap()
            .distribute()
            .unwrap();
        let sql = "SELECT order_id, card_number, amount FROM lake.sales.orders";
        let count = |engine: &Engine| {
            let session = engine.session("admin");
            async move {
                let mut stream = session.sql_stream(sql).await?;
                let mut rows = 0;
                while let Some(b) = stream.next().await {
                    rows += b?.num_rows();
                }
                Ok::<_, datafusion::error::DataFusionError>(rows)
            }
        };
        assert_eq!(count(&engine).await.unwrap(), demo::ORDERS);
        // Mid-query: the first batch has arrived when a worker dies.
        let session = engine.session("admin");
        let mut stream = session.sql_stream(sql).await.unwrap();
        let mut rows = stream.next().await.unwrap().unwrap().num_rows();
        let killed = workers.remove(1);
        signal(&killed.child, libc::SIGKILL);
        let mut error = None;
        while let Some(b) = stream.next().await {
            match b {
                Ok(b) => rows += b.num_rows(),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let error = error.unwrap_or_else(|| {
            panic!("the query ended without an error after its worker died ({rows} rows)")
        });
        assert!(rows < demo::ORDERS, "partial results only with an error");
        eprintln!("error after the kill: {error}");
        assert!(
            error.contains(&format!(
                "cluster worker http://{} stopped answering",
                killed.addr
            )) && error.contains("no partial result"),
            "the error names the worker: {error}"
        );
        assert!(!error.contains('\n'), "one line: {error}");
        drop(killed);
        // The probe drops the dead worker; queries run on the two others.
        let start = Instant::now();
        loop {
            match count(&engine).await {
                Ok(n) => {
                    assert_eq!(n, demo::ORDERS, "complete results");
                    break;
                }
                Err(e) => assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no recovery after the worker died: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(engine.live_workers().unwrap().len(), 2);
    });
}

#[test]
fn a_worker_lost_while_the_result_is_held_back_costs_a_retry_and_every_row_comes_once() {
    let tmp = tempfile::tempdir().unwrap();
    let config = lake(tmp.path());
    let (mut workers, coordinator_config) = start_cluster(&config, 3, tmp.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = std::sync::Arc::new(
            Engine::open(Config::load(&coordinator_config).unwrap())
                .await
                .unwrap()
                .distribute()
                .unwrap(),
        );
        // Rows streamed from every worker's scan (4,000 of them: within the retry window).
        let sql =
            "SELECT order_id, card_number, amount FROM lake.sales.orders WHERE order_id % 50 = 7";
        let rows = |engine: std::sync::Arc<Engine>, sql: String| async move {
            let mut stream = engine.session("admin").sql_stream(&sql).await?;
            let mut rows = Vec::new();
            while let Some(b) = stream.next().await {
                let b = b?;
                let ids = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .expect("order_id");
                rows.extend(ids.values().iter().copied());
            }
            rows.sort_unstable();
            Ok::<_, datafusion::error::DataFusionError>(rows)
        };
        let want = rows(std::sync::Arc::clone(&engine), sql.to_owned())
            .await
            .unwrap();
        assert_eq!(want.len(), demo::ORDERS / 50);
        // A worker stops answering mid-query: the others' rows are held back while the
        // query waits for its stage there; then it dies.
        let lost = workers.remove(1);
        signal(&lost.child, libc::SIGSTOP);
        let retried = format!("{sql} -- a worker lost");
        let running = tokio::spawn(rows(std::sync::Arc::clone(&engine), retried));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !running.is_finished(),
            "the query waits for the stopped worker"
        );
        signal(&lost.child, libc::SIGKILL);
        let got = tokio::time::timeout(Duration::from_secs(60), running)
            .await
            .expect("the query ends")
            .unwrap()
            .expect("run again on the two others");
        assert_eq!(got, want, "every row once");
        // Its audit record says so.
        let audit = std::fs::read_to_string(tmp.path().join("lake/audit.jsonl")).unwrap();
        let retried: Vec<serde_json::Value> = audit
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r.get("retries").is_some())
            .collect();
        assert!(!retried.is_empty(), "no audit record reports the retry");
        for r in &retried {
            let line = r["retries"][0].as_str().unwrap();
            assert!(
                line.starts_with("attempt 1 stopped: cluster worker ") && line.contains(&lost.addr),
                "{line}"
            );
            assert_eq!(r["rows"], want.len(), "{r}");
        }
        drop(lost);
    });
}

#[test]
fn a_worker_refuses_to_start_without_a_cluster_secret_or_beyond_loopback_in_plaintext_and_starts_there_with_mutual_tls()
 {
    let tmp = tempfile::tempdir().unwrap();
    let config = lake(tmp.path());
    // `clearice worker` with `config` on `addr` must fail; its stderr.
    let refusal = |config: &Path, addr: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_clearice"))
            .arg("--config")
            .arg(config)
            .args(["worker", "--addr", addr])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refusal(&config, "127.0.0.1:0");
    assert!(err.contains("[cluster] secret_file"), "{err}");
    let clustered = with_cluster(&config, &[]);
    let err = refusal(&clustered, "0.0.0.0:0");
    assert!(
        err.contains("without TLS") && err.contains("tls_cert") && err.contains("insecure"),
        "{err}"
    );
    // With the cluster's certificates it listens there, over TLS.
    let (ca_pem, issuer) = clearice_testkit::certs::ca("cluster CA");
    let (cert, key) = clearice_testkit::certs::node(&issuer);
    let lake_dir = tmp.path().join("lake");
    for (f, text) in [("ca.pem", &ca_pem), ("node.pem", &cert), ("node.key", &key)] {
        std::fs::write(lake_dir.join(f), text).unwrap();
    }
    let mut text = std::fs::read_to_string(&clustered).unwrap();
    text.push_str("tls_cert = \"node.pem\"\ntls_key = \"node.key\"\ntls_ca = \"ca.pem\"\n");
    let tls_config = lake_dir.join("cluster-tls.toml");
    std::fs::write(&tls_config, text).unwrap();
    let addr_file = tmp.path().join("tls-worker.addr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_clearice"))
        .arg("--config")
        .arg(&tls_config)
        .args(["worker", "--addr", "0.0.0.0:0", "--addr-file"])
        .arg(&addr_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::fs::read_to_string(&addr_file)
        .unwrap_or_default()
        .is_empty()
    {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the TLS worker exited: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no TLS worker");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("listening on https://0.0.0.0:"), "{said}");
    std::fs::write(tmp.path().join("lake/cluster.secret"), "short").unwrap();
    let err = refusal(&clustered, "127.0.0.1:0");
    assert!(err.contains("at least 32 are needed"), "{err}");
}

const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";
const GET_WORKER_INFO: &str = "/worker.WorkerService/GetWorkerInfo";

/// `message` as one gRPC message on the wire (uncompressed, behind its 5-byte length
/// prefix). The request body is built from a `String`, so every byte stays below 0x80.
fn grpc_frame(message: &[u8]) -> String {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    String::from_utf8(frame).expect("bytes below 0x80")
}

/// Sends `frame` to `path` on the worker at `url` as any peer could, with `credential` as
/// its `authorization` if any. Returns the worker's status and how long it took to answer.
async fn raw_call(
    url: &str,
    path: &str,
    credential: Option<String>,
    frame: String,
) -> (tonic::Code, Duration) {
    use tonic::codegen::{Service, http};
    let mut channel = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("{url}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(c) = credential {
        request = request.header("authorization", c);
    }
    let request = request.body(tonic::body::Body::new(frame)).unwrap();
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(60), channel.call(request))
        .await
        .expect("the worker held the call for 60 s")
        .unwrap();
    let code =
        tonic::Status::from_header_map(response.headers()).map_or(tonic::Code::Ok, |s| s.code());
    (code, started.elapsed())
}

/// The largest resident set process `pid` has had so far, in bytes (Linux's `VmHWM`: a
/// message held only during its call shows there after the call).
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn a_worker_process_reads_no_unauthenticated_or_oversized_message() {
    let tmp = tempfile::tempdir().unwrap();
    let config = lake(tmp.path());
    let worker = start(
        &with_cluster(&config, &[]),
        &["worker"],
        &tmp.path().join("worker.addr"),
    );
    let url = format!("http://{}", worker.addr);
    let signer =
        clearice_engine::TaskSigner::new(SECRET.as_bytes(), Duration::from_secs(60)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // A first call, so that the worker's connection handling is warm.
        let (code, took) = raw_call(&url, GET_WORKER_INFO, None, grpc_frame(&[])).await;
        assert_eq!(code, tonic::Code::Unauthenticated);
        assert!(took < Duration::from_secs(1), "{took:?}");
        let before = peak_rss_bytes(worker.child.id());
        let big = grpc_frame(&vec![b'a'; 256 << 20]);
        // 256 MiB with the cluster's credential: over the 64 MiB limit, refused from the
        // length prefix; without one, refused from the headers.
        let (signed, _) = raw_call(
            &url,
            EXECUTE_TASK,
            Some(signer.call_credential(EXECUTE_TASK)),
            big.clone(),
        )
        .await;
        let (unsigned, took) = raw_call(&url, EXECUTE_TASK, None, big).await;
        let grown = peak_rss_bytes(worker.child.id()).saturating_sub(before);
        eprintln!("worker peak RSS grew by {} KiB", grown / 1024);
        assert_eq!(signed, tonic::Code::OutOfRange);
        assert_eq!(unsigned, tonic::Code::Unauthenticated);
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(
            grown < 16 << 20,
            "the worker's peak RSS grew by {} MiB on messages it refused",
            grown >> 20
        );
    });
}
