//! Scale-out: a coordinator and three workers (datafusion-distributed) on loopback, each
//! an engine with its own KMS client, over a demo lake.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use serde_json::Value;

use crate::common::*;

/// A worker serving on loopback until dropped.
pub(crate) struct TestWorker {
    pub(crate) engine: Arc<Engine>,
    pub(crate) url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start_worker(
    config: &Path,
    listener: tokio::net::TcpListener,
    scheme: &str,
) -> TestWorker {
    let engine = Arc::new(Engine::open(Config::load(config).unwrap()).await.unwrap());
    let url = format!("{scheme}://{}", listener.local_addr().unwrap());
    let e = Arc::clone(&engine);
    let server = tokio::spawn(async move {
        e.serve_worker(listener, std::future::pending())
            .await
            .unwrap();
    });
    TestWorker {
        engine,
        url,
        server,
    }
}

/// A demo lake, three workers on it and a coordinator. The config gets `[cluster]`
/// (`extra` appended to it).
async fn cluster(tmp: &Path, extra: &str) -> (Arc<Engine>, Vec<TestWorker>, std::path::PathBuf) {
    let config = demo::init(&tmp.join("lake")).await.unwrap();
    let (coordinator, workers) = cluster_of(&config, extra).await;
    (coordinator, workers, config)
}

/// Three workers and a coordinator, each an engine of `config` with `[cluster]` (and
/// `extra`) appended, written next to it as `cluster.toml`.
pub(crate) async fn cluster_of(config: &Path, extra: &str) -> (Arc<Engine>, Vec<TestWorker>) {
    cluster_with(config, extra, "http").await
}

/// [`cluster_of`] with worker URLs of `scheme` (`https` for a cluster with TLS in `extra`).
pub(crate) async fn cluster_with(
    config: &Path,
    extra: &str,
    scheme: &str,
) -> (Arc<Engine>, Vec<TestWorker>) {
    let dir = config.parent().unwrap();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let urls: Vec<String> = listeners
        .iter()
        .map(|l| format!("\"{scheme}://{}\"", l.local_addr().unwrap()))
        .collect();
    std::fs::write(
        dir.join("cluster.secret"),
        "3f1c9a0d8e7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877",
    )
    .unwrap();
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str(&format!(
        "\n[cluster]\nworkers = [{}]\nsecret_file = \"cluster.secret\"\npartitions_per_worker = 1\n{extra}",
        urls.join(", ")
    ));
    let clustered = dir.join("cluster.toml");
    std::fs::write(&clustered, text).unwrap();
    let mut workers = Vec::new();
    for l in listeners {
        workers.push(start_worker(&clustered, l, scheme).await);
    }
    let coordinator = Arc::new(
        Engine::open(Config::load(&clustered).unwrap())
            .await
            .unwrap()
            .distribute()
            .unwrap(),
    );
    (coordinator, workers)
}

pub(crate) async fn explain(engine: &Engine, principal: &str, sql: &str) -> String {
    plan_text(&engine.session(principal), sql).await
}

pub(crate) const QUERIES: &[&str] = &[
    "SELECT * FROM lake.sales.customers ORDER BY id",
    "SELECT count(*), sum(balance), min(ssn), max(email) FROM lake.sales.customers",
    "SELECT id, ssn, email, birth_date FROM lake.sales.customers WHERE id % 997 = 3 ORDER BY id",
    "SELECT country, count(*), sum(balance) FROM lake.sales.customers WHERE country <> 'FR' GROUP BY country ORDER BY country",
    "SELECT c.country, count(*), sum(o.amount) FROM lake.sales.orders o JOIN lake.sales.customers c ON o.customer_id = c.id GROUP BY c.country ORDER BY c.country",
    "SELECT card_number, amount FROM lake.sales.orders WHERE order_id % 5000 = 1 ORDER BY order_id",
    "SELECT email, count(*) FROM lake.sales.customers GROUP BY email ORDER BY 2 DESC, 1 LIMIT 5",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distributed_results_match_single_node_and_keys_are_unwrapped_on_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let (coordinator, workers, single_config) = cluster(tmp.path(), "").await;
    let single = Engine::open(Config::load(&single_config).unwrap())
        .await
        .unwrap();
    for principal in ["admin", "analyst", "support"] {
        for sql in QUERIES {
            let want = match query(&single.session(principal), sql).await {
                Ok(b) => Ok(json_rows(&b)),
                Err(e) => Err(e.to_string()),
            };
            let got = match query(&coordinator.session(principal), sql).await {
                Ok(b) => Ok(json_rows(&b)),
                Err(e) => Err(e.to_string()),
            };
            assert_eq!(got, want, "{principal}: {sql}");
        }
    }
    // The scans ran on the workers: stages, and the masks decided for the principal.
    let plan = explain(&coordinator, "analyst", QUERIES[2]).await;
    assert!(plan.contains("RemoteScanExec"), "{plan}");
    assert!(plan.contains("Network"), "not distributed:\n{plan}");
    assert!(plan.contains("ssn=show_last_4"), "{plan}");
    assert!(plan.contains("email=sha256"), "{plan}");
    // Keys: unwrapped by the workers that read the files, never by the coordinator.
    assert_eq!(
        coordinator.key_resolver().kms_unwrap_count(),
        0,
        "the coordinator read no data"
    );
    for w in &workers {
        let r = w.engine.key_resolver();
        assert!(
            r.kms_unwrap_count_for("pii_key") >= 1 && r.kms_unwrap_count_for("finance_key") >= 1,
            "worker {} unwrapped pii_key {} and finance_key {} times",
            w.url,
            r.kms_unwrap_count_for("pii_key"),
            r.kms_unwrap_count_for("finance_key")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_unwrap_only_the_keys_of_columns_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (coordinator, workers, _) = cluster(tmp.path(), "").await;
    let rows = json_rows(
        &query(
            &coordinator.session("admin"),
            "SELECT country, sum(balance) FROM lake.sales.customers GROUP BY country",
        )
        .await
        .unwrap(),
    );
    assert!(!rows.is_empty());
    for w in &workers {
        let r = w.engine.key_resolver();
        assert_eq!(r.kms_unwrap_count_for("pii_key"), 0, "worker {}", w.url);
        assert!(
            r.kms_unwrap_count_for("finance_key") >= 1,
            "worker {}",
            w.url
        );
    }
    assert_eq!(coordinator.key_resolver().kms_unwrap_count(), 0);
}

/// What crosses the network: plan bytes name tables, key ids and masks, never keys,
/// footers or data; a worker refuses bytes the cluster secret did not sign.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_bytes_hold_no_key_material_and_workers_verify_them() {
    use datafusion_proto::physical_plan::PhysicalExtensionCodec;
    let tmp = tempfile::tempdir().unwrap();
    let (coordinator, workers, _) = cluster(tmp.path(), "").await;
    let session = coordinator.session("analyst");
    let df = session
        .sql_plan("SELECT id, ssn, email, balance FROM lake.sales.customers WHERE id < 100")
        .await
        .unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let mut scans = Vec::new();
    collect_scans(&plan, &mut scans);
    assert!(!scans.is_empty(), "no RemoteScanExec in the plan");
    let secret = std::fs::read(tmp.path().join("lake/cluster.secret")).unwrap();
    let signer = Arc::new(
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(60)).unwrap(),
    );
    let codec = clearice_engine::ClearIceCodec::coordinator(Arc::clone(&signer));
    let mut bytes = Vec::new();
    let query = uuid::Uuid::new_v4();
    clearice_engine::encoding_for(query, || {
        codec.try_encode(Arc::clone(&scans[0]), &mut bytes)
    })
    .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("\"principal\":\"analyst\""), "{text}");
    assert!(text.contains("pii_key"), "key ids are named: {text}");
    assert!(text.contains("show_last_4"), "{text}");
    // No key bytes: the keyring's keys, in any encoding, are not in the plan.
    let keyring: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("lake/keyring.json")).unwrap(),
    )
    .unwrap();
    let mut secrets = Vec::new();
    collect_strings(&keyring, &mut secrets);
    let secrets: Vec<&String> = secrets.iter().filter(|s| s.len() >= 16).collect();
    assert!(!secrets.is_empty(), "keyring has keys: {keyring}");
    for s in secrets {
        assert!(!text.contains(s.as_str()), "key material in the plan bytes");
    }
    assert!(!text.contains("PARE"), "no footer bytes");
    // A worker decodes what the coordinator signed...
    let worker_ctx = datafusion::execution::TaskContext::default();
    let worker_codec = worker_codec(&workers[0], &signer);
    worker_codec.try_decode(&bytes, &[], &worker_ctx).unwrap();
    // ...and refuses it altered (principal swapped) or signed with another secret.
    let forged = String::from_utf8_lossy(&bytes)
        .replace("\"principal\":\"analyst\"", "\"principal\":\"admin\"")
        .into_bytes();
    let err = worker_codec
        .try_decode(&forged, &[], &worker_ctx)
        .unwrap_err()
        .to_string();
    assert!(err.contains("signature does not verify"), "{err}");
    let other = clearice_engine::ClearIceCodec::coordinator(Arc::new(
        clearice_engine::TaskSigner::new(&[7u8; 32], Duration::from_secs(60)).unwrap(),
    ));
    let mut other_bytes = Vec::new();
    clearice_engine::encoding_for(query, || {
        other.try_encode(Arc::clone(&scans[0]), &mut other_bytes)
    })
    .unwrap();
    let err = worker_codec
        .try_decode(&other_bytes, &[], &worker_ctx)
        .unwrap_err()
        .to_string();
    assert!(err.contains("signature does not verify"), "{err}");
}

fn worker_codec(
    w: &TestWorker,
    signer: &Arc<clearice_engine::TaskSigner>,
) -> clearice_engine::ClearIceCodec {
    w.engine.worker_codec(Arc::clone(signer))
}

fn collect_scans(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    out: &mut Vec<Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
) {
    if plan.name() == "RemoteScanExec" {
        out.push(Arc::clone(plan));
    }
    for c in plan.children() {
        collect_scans(c, out);
    }
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(o) => o.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// The audit records of the query whose SQL is `sql`.
fn audit_of(dir: &Path, sql: &str) -> Vec<Value> {
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(sql.as_bytes()));
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["sql_sha256"] == sha.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_worker_costs_a_retry_on_the_others_and_when_all_are_lost_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    // The probe does not run during the test: the coordinator still plans stages on a
    // worker that stopped, and meets it in the query.
    // (The demo lake's config already has an audit log, audit.jsonl.)
    let extra = "probe_interval_ms = 3600000\n";
    let (coordinator, mut workers, config) = cluster(tmp.path(), extra).await;
    let dir = config.parent().unwrap();
    let sql = "SELECT country, count(*), sum(balance) FROM lake.sales.customers GROUP BY country ORDER BY country";
    let want = json_rows(&query(&coordinator.session("admin"), sql).await.unwrap());
    let plan = explain(&coordinator, "admin", sql).await;
    assert!(plan.contains("ClusterRootExec: workers=3"), "{plan}");
    assert_eq!(plan.matches("RemoteScanExec").count(), 1, "{plan}");

    // One worker stops: the query's stage on it fails, the query runs again on the two
    // others and returns every row once.
    let dead = workers.remove(1);
    let dead_url = dead.url.clone();
    drop(dead);
    let retried = format!("{sql} -- after one worker stopped");
    let got = query(&coordinator.session("admin"), &retried)
        .await
        .unwrap();
    assert_eq!(json_rows(&got), want);
    let records = audit_of(dir, &retried);
    assert!(!records.is_empty());
    for r in &records {
        let retries = r["retries"]
            .as_array()
            .expect("the audit reports the retry");
        assert_eq!(retries.len(), 1, "{r}");
        let line = retries[0].as_str().unwrap();
        assert!(
            line.starts_with("attempt 1 stopped: cluster worker "),
            "{line}"
        );
        assert!(line.contains(&dead_url), "{line}");
        assert_eq!(r["rows"], want.len(), "{r}");
        assert!(r["error"].is_null(), "{r}");
    }
    assert_eq!(coordinator.live_workers().unwrap().len(), 2);
    // A query without trouble reports no retry.
    let calm = format!("{sql} -- calm");
    query(&coordinator.session("admin"), &calm).await.unwrap();
    assert!(
        audit_of(dir, &calm)
            .iter()
            .all(|r| r.get("retries").is_none())
    );

    // Every worker stops: one line naming them, and no row.
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    workers.clear();
    let lost = format!("{sql} -- after every worker stopped");
    let mut stream = coordinator.session("admin").sql_stream(&lost).await;
    let e = match &mut stream {
        Ok(s) => {
            use futures::StreamExt;
            match s.next().await {
                Some(Err(e)) => e.to_string(),
                other => panic!("a row or an end without error: {other:?}"),
            }
        }
        Err(e) => e.to_string(),
    };
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("stopped answering") || e.contains("no cluster worker answers"),
        "{e}"
    );
    for u in &urls {
        assert!(e.contains(u.as_str()), "{e} names {u}");
    }
}

const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";
const GET_WORKER_INFO: &str = "/worker.WorkerService/GetWorkerInfo";

/// `ExecuteTask` for a task no coordinator set up (`TaskKey { query_id: [7; 16], stage_id:
/// 1, task_number: 0 }`, partitions 0..1), protobuf-encoded.
const UNKNOWN_TASK: &[u8] = &[
    0x0a, 0x14, 0x0a, 0x10, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0x10, 0x01, 0x18, 0x00,
    0x10, 0x00, 0x18, 0x01,
];

/// `message` as one gRPC message on the wire (uncompressed, behind its 5-byte length
/// prefix). The request body is built from a `String`, so every byte stays below 0x80.
fn grpc_frame(message: &[u8]) -> String {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    String::from_utf8(frame).expect("bytes below 0x80")
}

/// Sends `frame` to `path` on the worker at `url` as any peer could, with `credential` as
/// its `authorization` if any. Returns the worker's status (`Ok`: it took the call) and
/// how long it took to answer.
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
    let response = tokio::time::timeout(Duration::from_secs(30), channel.call(request))
        .await
        .expect("the worker held the call for 30 s")
        .unwrap();
    let code =
        tonic::Status::from_header_map(response.headers()).map_or(tonic::Code::Ok, |s| s.code());
    (code, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_worker_calls_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (_coordinator, workers, _) = cluster(tmp.path(), "").await;
    let url = &workers[0].url;
    let secret = std::fs::read(tmp.path().join("lake/cluster.secret")).unwrap();
    let ours =
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(60)).unwrap();
    let theirs = clearice_engine::TaskSigner::new(&[7u8; 32], Duration::from_secs(60)).unwrap();
    let refused = |what: &str, (code, took): (tonic::Code, Duration)| {
        assert_eq!(code, tonic::Code::Unauthenticated, "{what}");
        assert!(took < Duration::from_secs(1), "{what}: {took:?}");
    };
    // No credential: GetWorkerInfo, and ExecuteTask for a task nobody set up (the worker
    // used to wait 10 s for its plan).
    refused(
        "GetWorkerInfo",
        raw_call(url, GET_WORKER_INFO, None, grpc_frame(&[])).await,
    );
    refused(
        "ExecuteTask",
        raw_call(url, EXECUTE_TASK, None, grpc_frame(UNKNOWN_TASK)).await,
    );
    // Made with another secret, for another RPC, or not a credential at all.
    refused(
        "another cluster's credential",
        raw_call(
            url,
            EXECUTE_TASK,
            Some(theirs.call_credential(EXECUTE_TASK)),
            grpc_frame(UNKNOWN_TASK),
        )
        .await,
    );
    refused(
        "a GetWorkerInfo credential on ExecuteTask",
        raw_call(
            url,
            EXECUTE_TASK,
            Some(ours.call_credential(GET_WORKER_INFO)),
            grpc_frame(UNKNOWN_TASK),
        )
        .await,
    );
    refused(
        "Basic credentials",
        raw_call(
            url,
            GET_WORKER_INFO,
            Some("Basic YWRtaW46YWRtaW4=".into()),
            grpc_frame(&[]),
        )
        .await,
    );
    // The cluster's own credential is taken.
    let (code, _) = raw_call(
        url,
        GET_WORKER_INFO,
        Some(ours.call_credential(GET_WORKER_INFO)),
        grpc_frame(&[]),
    )
    .await;
    assert_eq!(code, tonic::Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_worker_messages_are_refused_before_they_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (coordinator, workers, _) = cluster(tmp.path(), "").await;
    let url = &workers[0].url;
    let secret = std::fs::read(tmp.path().join("lake/cluster.secret")).unwrap();
    let ours =
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(60)).unwrap();
    // 64 MiB (the limit) and one byte, from a peer with the secret: refused from the length
    // prefix (`OUT_OF_RANGE`), not decoded.
    let over = vec![b'a'; (64 << 20) + 1];
    let (code, took) = raw_call(
        url,
        EXECUTE_TASK,
        Some(ours.call_credential(EXECUTE_TASK)),
        grpc_frame(&over),
    )
    .await;
    assert_eq!(code, tonic::Code::OutOfRange);
    assert!(took < Duration::from_secs(5), "{took:?}");
    // 256 MiB without a credential: refused before any of it is read.
    drop(over);
    let (code, took) = raw_call(url, EXECUTE_TASK, None, grpc_frame(&vec![b'a'; 256 << 20])).await;
    assert_eq!(code, tonic::Code::Unauthenticated);
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The worker still serves the cluster.
    still_answers(&coordinator).await;
}

/// The cluster of `coordinator` still answers a query (after a refused peer).
pub(crate) async fn still_answers(coordinator: &Engine) {
    let rows = query(
        &coordinator.session("admin"),
        "SELECT count(*) FROM lake.sales.customers",
    )
    .await
    .unwrap();
    assert_eq!(rows[0].num_rows(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_raised_on_workers_keep_their_class_and_message() {
    let tmp = tempfile::tempdir().unwrap();
    let (coordinator, _workers, config) = cluster(tmp.path(), "").await;
    let single = Engine::open(Config::load(&config).unwrap()).await.unwrap();
    // A byte flipped inside the encrypted footer of every customers file, before any
    // process has read them (workers decrypt footers; the coordinator does not).
    let data = tmp.path().join("lake/warehouse/sales/customers/data");
    for f in std::fs::read_dir(data).unwrap() {
        let f = f.unwrap().path();
        let mut b = std::fs::read(&f).unwrap();
        let at = b.len() - 8 - 40;
        b[at] ^= 0x10;
        std::fs::write(&f, b).unwrap();
    }
    let sql = "SELECT count(ssn) FROM lake.sales.customers";
    let on_worker = query(&coordinator.session("admin"), sql).await.unwrap_err();
    let here = query(&single.session("admin"), sql).await.unwrap_err();
    assert!(
        matches!(
            clearice_access::cause_of::<clearice_engine::ClusterError>(&on_worker),
            Some(clearice_engine::ClusterError::OnWorker { .. })
        ),
        "raised on a worker: {on_worker}"
    );
    use clearice_engine::{ErrorClass, classify, message_of};
    assert_eq!(classify(&here), ErrorClass::Tampered, "{here}");
    assert_eq!(classify(&on_worker), ErrorClass::Tampered, "{on_worker}");
    let m = message_of(&on_worker);
    assert!(
        m.contains("authentication failed") && m.contains(".parquet") && m.contains("footer"),
        "{m}"
    );
    assert!(
        !m.contains("clearice-error-class") && m.lines().count() == 1,
        "{m}"
    );
}
