//! `/metrics` of `clearice serve` (coordinating a worker) and `clearice worker`, scraped
//! by a real Prometheus server: statements by principal, kind and outcome, refused
//! logins, rows returned, bytes decrypted on the worker, KMS calls, caches, the memory
//! pool; the worker's endpoint wants its bearer token; promtool lints the exposition.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::SECRET;
use crate::common::*;

/// The Prometheus server binary (`CLEARICE_PROMETHEUS`, set by scripts/test.sh).
fn prometheus() -> Option<PathBuf> {
    let p = std::env::var_os("CLEARICE_PROMETHEUS").map(PathBuf::from);
    if p.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_PROMETHEUS (the prometheus binary, set by scripts/test.sh) is not set"
        );
    }
    p
}

/// Waits for `file` to hold an address, then returns it.
fn address_in(file: &Path) -> String {
    let start = Instant::now();
    loop {
        let a = std::fs::read_to_string(file).unwrap_or_default();
        if !a.is_empty() {
            return a;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{file:?} not written"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of PromQL `query` at Prometheus `addr` once it has one (scrapes run every
/// second).
fn value_of(addr: &str, query: &str) -> f64 {
    let start = Instant::now();
    loop {
        let (status, body) = http_get(addr, &format!("/api/v1/query?query={}", encode(query)), &[]);
        if status == 200 {
            let v: Value = serde_json::from_str(&body).unwrap();
            if let Some(x) = v["data"]["result"][0]["value"][1].as_str() {
                return x.parse().unwrap();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus never answered {query}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn prometheus_scrapes_statements_logins_decryption_and_the_pool_from_serve_and_a_worker() {
    let Some(python) = python() else { return };
    let Some(prometheus) = prometheus() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .args(["demo", "init"])
            .arg(&lake),
    );
    std::fs::write(lake.join("cluster.secret"), SECRET).unwrap();
    let token = "metrics-token-0123456789abcdef";
    std::fs::write(lake.join("metrics.token"), format!("{token}\n")).unwrap();
    let base = std::fs::read_to_string(lake.join("clearice.toml")).unwrap();
    let cluster = "\n[cluster]\nsecret_file = \"cluster.secret\"\npartitions_per_worker = 2\n";
    // The worker's endpoint wants a bearer token; the server's (loopback) does not.
    let worker_config = lake.join("worker.toml");
    std::fs::write(
        &worker_config,
        format!(
            "{base}\n[metrics]\naddr = \"127.0.0.1:0\"\ntoken_file = \"metrics.token\"\n{}",
            cluster.replace("[cluster]", "[cluster]\nworkers = []")
        ),
    )
    .unwrap();
    let worker_metrics = tmp.path().join("worker.metrics");
    let worker = start(
        &worker_config,
        &[
            "worker",
            "--metrics-addr-file",
            worker_metrics.to_str().unwrap(),
        ],
        &tmp.path().join("worker.addr"),
    );
    let worker_metrics = address_in(&worker_metrics);
    let serve_config = lake.join("serve.toml");
    std::fs::write(
        &serve_config,
        format!(
            "{base}\n[execution]\nmemory_limit_mb = 1024\n{}",
            cluster.replace(
                "[cluster]",
                &format!("[cluster]\nworkers = [\"http://{}\"]", worker.addr)
            )
        ),
    )
    .unwrap();
    let serve_metrics = tmp.path().join("serve.metrics");
    let serve = start(
        &serve_config,
        &[
            "--distributed",
            "serve",
            "--metrics-addr",
            "127.0.0.1:0",
            "--metrics-addr-file",
            serve_metrics.to_str().unwrap(),
        ],
        &tmp.path().join("serve.addr"),
    );
    let serve_metrics = address_in(&serve_metrics);

    // Statements that end ok, denied and failed, and a refused login.
    let out = run_ok(
        Command::new(&python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/metrics_client.py"))
            .arg(&serve.addr),
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["admin_rows"], 1, "{seen}");
    assert!(
        seen["analyst_denied"]
            .as_str()
            .is_some_and(|e| e.contains("card_number")),
        "{seen}"
    );
    assert!(seen["analyst_error"].as_str().is_some(), "{seen}");
    assert!(seen["bad_login_admin"].as_str().is_some(), "{seen}");
    assert!(
        seen["bad_login_intruder-7f3a9c"].as_str().is_some(),
        "{seen}"
    );

    // The endpoints themselves: the worker's refuses a scrape without its token.
    let (status, _) = http_get(&worker_metrics, "/metrics", &[]);
    assert_eq!(status, 401);
    let (status, _) = http_get(
        &worker_metrics,
        "/metrics",
        &[("authorization", "Bearer wrong-token-0123456789abcdef")],
    );
    assert_eq!(status, 401);
    let (status, text) = http_get(&serve_metrics, "/metrics", &[]);
    assert_eq!(status, 200);
    let (_, openmetrics) = http_get(
        &serve_metrics,
        "/metrics",
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    // No statement text, no value, no name a client sent reaches a label.
    for leaked in [
        "card_number",
        "no_such_column",
        "intruder-7f3a9c",
        "not-the-password",
        "1000001",
    ] {
        assert!(!text.contains(leaked), "{leaked} in:\n{text}");
    }
    // promtool (Prometheus' own linter) accepts the exposition.
    let promtool = prometheus.with_file_name("promtool");
    let mut lint = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        lint.stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // A real Prometheus scrapes both, the worker with its bearer token.
    let port = free_port();
    let prom_dir = tmp.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let prom_config = prom_dir.join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: serve\n    static_configs:\n      - targets: [\"{serve_metrics}\"]\n  - job_name: worker\n    authorization:\n      type: Bearer\n      credentials_file: {}\n    static_configs:\n      - targets: [\"{worker_metrics}\"]\n",
            lake.join("metrics.token").display()
        ),
    )
    .unwrap();
    let prom = Proc {
        child: Command::new(&prometheus)
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                prom_dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        addr: format!("127.0.0.1:{port}"),
    };
    let start = Instant::now();
    while std::net::TcpStream::connect(&prom.addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "prometheus did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let at = |q: &str| value_of(&prom.addr, q);
    assert_eq!(at("up{job=\"worker\"}"), 1.0);
    assert_eq!(at("up{job=\"serve\"}"), 1.0);
    assert!(
        at(
            "clearice_statements_total{job=\"serve\",principal=\"admin\",kind=\"select\",outcome=\"ok\"}"
        ) >= 2.0
    );
    assert!(
        at(
            "clearice_statements_total{job=\"serve\",principal=\"analyst\",kind=\"select\",outcome=\"denied\"}"
        ) >= 1.0
    );
    assert!(
        at(
            "clearice_statements_total{job=\"serve\",principal=\"analyst\",kind=\"select\",outcome=\"error\"}"
        ) >= 1.0
    );
    assert!(at("clearice_statement_duration_seconds_count{job=\"serve\",kind=\"select\"}") >= 4.0);
    assert!(
        at("clearice_login_failures_total{job=\"serve\",reason=\"invalid_credentials\"}") >= 2.0
    );
    assert!(at("clearice_result_rows_total{job=\"serve\",principal=\"admin\"}") >= 2.0);
    assert!(at("clearice_result_bytes_total{job=\"serve\",principal=\"admin\"}") > 0.0);
    assert!(at("clearice_sessions{job=\"serve\"}") >= 2.0);
    assert_eq!(at("clearice_running_statements{job=\"serve\"}"), 0.0);
    assert_eq!(
        at("clearice_memory_pool_limit_bytes{job=\"serve\"}"),
        1024.0 * 1024.0 * 1024.0
    );
    // Exposed (value_of waits for the series), whatever the pool holds now.
    at("clearice_memory_pool_reserved_bytes{job=\"worker\"}");
    // The scans ran on the worker: it decrypted and asked the KMS.
    assert!(at("clearice_worker_requests_total{job=\"worker\",outcome=\"admitted\"}") >= 1.0);
    assert!(at("sum(clearice_decrypted_bytes_total{job=\"worker\"})") > 0.0);
    assert!(
        at(
            "clearice_kms_requests_total{job=\"worker\",target=\"keyring\",operation=\"unwrap\",outcome=\"ok\"}"
        ) >= 1.0
    );
    assert!(at("sum(clearice_cache_requests_total{job=\"serve\",cache=\"table\"})") >= 1.0);
    assert!(at("clearice_build_info{job=\"worker\"}") == 1.0);

    // The Grafana dashboard in the repository: every panel's query is PromQL this
    // Prometheus accepts, over series the server exposes.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../integrations/grafana/clearice-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    // Families without samples are not exposed: the server's and the worker's together
    // have all but the remote provider's and the crypto-server's (tests/it/remote.rs).
    let (_, worker_text) = http_get(
        &worker_metrics,
        "/metrics",
        &[("authorization", &format!("Bearer {token}"))],
    );
    let both = format!("{text}{worker_text}");
    let exposed: Vec<&str> = both
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .collect();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 15);
    for target in panels.iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().unwrap();
        let query = expr
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        let (status, body) = http_get(
            &prom.addr,
            &format!("/api/v1/query?query={}", encode(&query)),
            &[],
        );
        assert_eq!(status, 200, "{expr}: {body}");
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("clearice_"))
        {
            let family = name.strip_suffix("_bucket").unwrap_or(name);
            assert!(
                exposed.contains(&family)
                    || family.starts_with("clearice_provider_")
                    || family.starts_with("clearice_crypto_server_"),
                "{name} of the dashboard is not exposed"
            );
        }
    }
    drop(prom);
    drop(serve);
    drop(worker);
}
