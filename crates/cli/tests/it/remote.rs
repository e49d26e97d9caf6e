//! The `remote` crypto provider against the real reference service (`clearice
//! crypto-server`, a separate process on a loopback port): the demo lake with its PII key
//! held by the service, read through the shell and over Flight SQL, with the service
//! deciding per user and per token; its failures (frozen, stopped, wrong credentials)
//! end in one clear error within the timeout.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{http_get, python, run_ok, signal, start};

fn clearice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_clearice"))
}

fn sql(config: &Path, user: &str, sql: &str, log: &str) -> Output {
    clearice()
        .arg("--config")
        .arg(config)
        .args(["--user", user, "--format", "json", "-q", "-c", sql])
        .env("CLEARICE_LOG", log)
        .output()
        .unwrap()
}

fn rows(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "query failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn failure(out: &Output) -> (i32, String) {
    assert!(!out.status.success(), "query succeeded unexpectedly");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Rewrites `[providers.dbps]` of a copy of the lake's config.
fn config_variant(lake: &Path, name: &str, addr: &str, extra: &str, secret: &str) -> PathBuf {
    // The config as `demo init` wrote it (variants are written next to it).
    let original = lake.join("clearice.toml.orig");
    if !original.exists() {
        std::fs::copy(lake.join("clearice.toml"), &original).unwrap();
    }
    let text = std::fs::read_to_string(&original)
        .unwrap()
        .replace("http://127.0.0.1:8443", &format!("http://{addr}"))
        .replace("crypto-server/jwt.secret", secret)
        .replace(
            "subject = \"clearice\"\n",
            &format!("subject = \"clearice\"\n{extra}"),
        );
    let path = lake.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const ROW: &str = "SELECT id, ssn, email, balance FROM lake.sales.customers WHERE id = 1000001";

#[test]
fn remote_provider_decides_per_user_over_the_shell_and_flight_and_fails_cleanly() {
    let Some(python) = python() else { return };
    let client: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/remote_client.py");
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    run_ok(
        clearice()
            .args(["demo", "init", "--provider", "remote"])
            .arg(&lake),
    );
    let service_dir = lake.join("crypto-server");
    // ClearIce's own keyring no longer holds the PII key: only the service does.
    let local_keys: Value =
        serde_json::from_str(&std::fs::read_to_string(lake.join("keyring.json")).unwrap()).unwrap();
    assert!(local_keys.get("pii_key").is_none(), "{local_keys}");
    let pii_key_b64 = serde_json::from_str::<Value>(
        &std::fs::read_to_string(service_dir.join("keyring.json")).unwrap(),
    )
    .unwrap()["pii_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let jwt_secret = std::fs::read_to_string(service_dir.join("jwt.secret")).unwrap();

    // The service encrypted the PII columns while `demo init` wrote them: a data key per
    // file (`new_key`), then every PII module of each column chunk (`encrypt`)...
    let audit_text = std::fs::read_to_string(service_dir.join("audit.jsonl")).unwrap();
    let written: Vec<Value> = audit_text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        written
            .iter()
            .filter(|r| r["operation"] == "new_key")
            .count(),
        4,
        "one key per customers file: {audit_text}"
    );
    for column in ["ssn", "email", "phone"] {
        assert!(written.iter().any(|r| r["operation"] == "encrypt"
            && r["column"] == column
            && r["key_id"] == "pii_key"
            && r["modules"].as_u64().unwrap() > 2));
    }
    // ...and the files are standard PME that PyArrow reads given the master keys.
    let data = lake.join("warehouse/sales/customers/data");
    let first = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .unwrap();
    let out = run_ok(
        Command::new(&python)
            .arg(&client)
            .arg("pyread")
            .arg(&first)
            .arg(lake.join("keyring.json"))
            .arg(service_dir.join("keyring.json")),
    );
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ssn = read[0]["ssn"].as_str().unwrap();
    assert!(ssn.len() == 11 && ssn.as_bytes()[3] == b'-', "{read}");
    // Without the service's key, PyArrow cannot read them.
    let out = Command::new(&python)
        .arg(&client)
        .arg("pyread")
        .arg(&first)
        .arg(lake.join("keyring.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());

    // Users' own tokens: ES256 from an identity provider the service trusts.
    run_ok(
        Command::new(&python)
            .arg(&client)
            .arg("keygen")
            .arg(&service_dir),
    );
    let service_config = service_dir.join("crypto-server.toml");
    let text = std::fs::read_to_string(&service_config).unwrap().replace(
        "hs256_secret_file = \"jwt.secret\"\n",
        "hs256_secret_file = \"jwt.secret\"\nes256_public_key = \"idp.pub\"\n",
    );
    std::fs::write(&service_config, text).unwrap();
    let service_metrics = tmp.path().join("service.metrics");
    let service = start(
        &service_config,
        &[
            "crypto-server",
            "--metrics-addr",
            "127.0.0.1:0",
            "--metrics-addr-file",
            service_metrics.to_str().unwrap(),
        ],
        &tmp.path().join("service.addr"),
    );
    let config = config_variant(
        &lake,
        "clearice.toml",
        &service.addr,
        "",
        "crypto-server/jwt.secret",
    );

    // --- the shell: the service grants admin and support, refuses analyst ------------
    let admin = rows(&sql(&config, "admin", ROW, "trace"));
    assert_eq!(admin[0]["ssn"], "609-11-1603", "{admin}");
    assert_eq!(admin[0]["email"], "josé.garcia1@example.com");
    let support = rows(&sql(
        &config,
        "support",
        "SELECT email FROM lake.sales.customers WHERE id = 1000001",
        "warn",
    ));
    assert_eq!(support[0]["email"], "josé.garcia1@example.com", "{support}");
    // analyst's policy says show_last_4 / sha256: the service's refusal wins
    // (on_missing_key = "null"), and the local finance key still decrypts.
    let analyst = rows(&sql(&config, "analyst", ROW, "warn"));
    assert_eq!(analyst[0]["ssn"], Value::Null, "{analyst}");
    assert_eq!(analyst[0]["email"], Value::Null, "{analyst}");
    assert_eq!(analyst[0]["balance"], admin[0]["balance"]);
    // ClearIce's audit says who decided.
    let audit = std::fs::read_to_string(lake.join("audit.jsonl")).unwrap();
    assert!(
        audit.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["user"] == "analyst"
                && r["columns"].as_array().unwrap().iter().any(|c| {
                    c["name"] == "ssn"
                        && c["rule"]
                            .as_str()
                            .unwrap()
                            .contains("denied by crypto provider 'dbps' (key 'pii_key')")
                })
        }),
        "{audit}"
    );
    // The service's metrics count what it answered: modules decrypted for admin, the
    // analyst refused, its KMS asked; no key or secret in them.
    let (status, metrics) = http_get(
        &std::fs::read_to_string(&service_metrics).unwrap(),
        "/metrics",
        &[],
    );
    assert_eq!(status, 200);
    let sample = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
    };
    assert!(
        sample("clearice_crypto_server_requests_total{operation=\"decrypt\",outcome=\"ok\"}")
            >= 1.0
    );
    assert!(
        sample("clearice_crypto_server_requests_total{operation=\"access\",outcome=\"ok\"}") >= 1.0
    );
    assert!(sample("clearice_decrypted_bytes_total{algorithm=\"AES_GCM_V1\"}") > 0.0);
    assert!(
        sample(
            "clearice_kms_requests_total{target=\"keyring\",operation=\"unwrap\",outcome=\"ok\"}"
        ) >= 1.0
    );
    // The Grafana dashboard's crypto-server series are the ones it exposes.
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../integrations/grafana/clearice-dashboard.json"),
    )
    .unwrap();
    for name in dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("clearice_crypto_server_"))
    {
        let family = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            metrics.contains(&format!("# TYPE {family} ")),
            "{family} not exposed"
        );
    }

    // The service's own audit: granted calls for admin, no key bytes, no secrets.
    let service_audit = std::fs::read_to_string(service_dir.join("audit.jsonl")).unwrap();
    let records: Vec<Value> = service_audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(records.iter().any(|r| r["user"] == "admin"
        && r["key_id"] == "pii_key"
        && r["granted"] == true
        && r["subject"] == "clearice"
        && r["column"] == "ssn"
        && r["table"] == "lake.sales.customers"
        && r["modules"].as_u64().unwrap() > 0));
    assert!(
        !records
            .iter()
            .any(|r| r["user"] == "analyst" && r["granted"] == true)
    );
    for secret in [pii_key_b64.as_str(), jwt_secret.trim()] {
        assert!(!service_audit.contains(secret));
        assert!(!audit.contains(secret));
    }
    // Trace logs of the shell carry neither the key, the secret nor a bearer token.
    let traced = sql(&config, "admin", ROW, "trace");
    let log = String::from_utf8_lossy(&traced.stderr);
    for secret in [pii_key_b64.as_str(), jwt_secret.trim(), "eyJ"] {
        assert!(!log.contains(secret), "{secret} in the trace log");
    }
    // EXPLAIN names no key material either.
    let explain = sql(&config, "admin", &format!("EXPLAIN {ROW}"), "warn");
    let plan = String::from_utf8_lossy(&explain.stdout);
    assert!(
        !plan.contains(&pii_key_b64) && !plan.contains("wrappedDEK"),
        "{plan}"
    );

    // --- policy check: the service answers and knows the keys routed to it ----------
    let check = clearice()
        .arg("--config")
        .arg(&config)
        .args(["policy", "check"])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let policy = std::fs::read_to_string(lake.join("policy.toml"))
        .unwrap()
        .replace(
            "master_key = \"finance_key\"\n",
            "master_key = \"finance_key\"\nprovider = \"dbps\"\n",
        );
    std::fs::write(lake.join("policy-finance.toml"), policy).unwrap();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("path = \"policy.toml\"", "path = \"policy-finance.toml\"");
    let finance = lake.join("finance.toml");
    std::fs::write(&finance, text).unwrap();
    let check = clearice()
        .arg("--config")
        .arg(&finance)
        .args(["policy", "check"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{report}");
    assert!(
        report.contains(
            "lake.sales.customers.balance: crypto provider 'dbps' does not know master key 'finance_key'"
        ),
        "{report}"
    );

    // --- Flight SQL: the principal is the service's user; a client's own token wins ---
    // The client's queries (with and without users' own tokens) against `addr`.
    let ask = |addr: &str| -> Value {
        let out = run_ok(
            Command::new(&python)
                .arg(&client)
                .args(["query", addr])
                .arg(service_dir.join("idp.key"))
                .arg("clearice-crypto"),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let flight = start(&config, &["serve"], &tmp.path().join("flight.addr"));
    let v = ask(&flight.addr);
    assert_eq!(
        v["admin_own_credentials"]["rows"],
        serde_json::json!([[1000001, "609-11-1603"]]),
        "{v}"
    );
    assert_eq!(
        v["own_credentials"]["rows"],
        serde_json::json!([[1000001, null]]),
        "{v}"
    );
    // Same ClearIce user (analyst), different tokens, different answers: alice's token
    // carries a role the service grants pii_key (ClearIce's policy still masks it).
    assert_eq!(
        v["alice"]["rows"],
        serde_json::json!([[1000001, "XXX-XX-1603"]]),
        "{v}"
    );
    assert_eq!(
        v["bob"]["rows"],
        serde_json::json!([[1000001, null]]),
        "{v}"
    );
    let expired = v["expired"]["error"].as_str().unwrap_or_default();
    assert!(
        expired.contains("crypto provider 'dbps' rejected the credentials: token expired"),
        "{v}"
    );
    // Run here, not on workers.
    assert!(
        !v["alice_plan"].to_string().contains("ClusterRootExec"),
        "{v}"
    );
    drop(flight);

    // --- on workers: a client's own token travels sealed in the signed scan ----------
    std::fs::write(lake.join("cluster.secret"), crate::cluster::SECRET).unwrap();
    let (workers, coordinator) = crate::cluster::start_cluster(&config, 2, tmp.path());
    let flight = start(
        &coordinator,
        &["--distributed", "serve"],
        &tmp.path().join("coordinator.addr"),
    );
    let on_workers = ask(&flight.addr);
    // The scan ran on the workers...
    assert!(
        on_workers["alice_plan"]
            .to_string()
            .contains("ClusterRootExec: workers=2"),
        "{on_workers}"
    );
    // ...and they decrypted with each user's own token: the same answers as one process
    // (without alice's token a worker would ask as ClearIce for analyst: refused, null).
    for who in ["alice", "bob", "own_credentials", "admin_own_credentials"] {
        assert_eq!(on_workers[who], v[who], "{who}: {on_workers}");
    }
    assert!(
        on_workers["expired"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("crypto provider 'dbps' rejected the credentials: token expired"),
        "{on_workers}"
    );
    drop(flight);
    drop(workers);
    let service_audit = std::fs::read_to_string(service_dir.join("audit.jsonl")).unwrap();
    assert!(service_audit.lines().any(|l| {
        let r: Value = serde_json::from_str(l).unwrap();
        r["user"] == "alice" && r["subject"] == "alice" && r["granted"] == true
    }));

    // --- TLS with a private CA --------------------------------------------------------
    run_ok(
        Command::new(&python)
            .arg(&client)
            .arg("tlsgen")
            .arg(&service_dir),
    );
    let tls_config = service_dir.join("crypto-server-tls.toml");
    std::fs::write(
        &tls_config,
        std::fs::read_to_string(&service_config).unwrap().replace(
            "[kms]",
            "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n\n[kms]",
        ),
    )
    .unwrap();
    let tls_service = start(
        &tls_config,
        &["crypto-server"],
        &tmp.path().join("tls.addr"),
    );
    let tls = config_variant(
        &lake,
        "tls.toml",
        &tls_service.addr,
        "ca_file = \"crypto-server/ca.pem\"\n",
        "crypto-server/jwt.secret",
    );
    let text = std::fs::read_to_string(&tls)
        .unwrap()
        .replace("http://127.0.0.1", "https://127.0.0.1");
    std::fs::write(&tls, &text).unwrap();
    assert_eq!(
        rows(&sql(&tls, "admin", ROW, "warn"))[0]["ssn"],
        "609-11-1603"
    );
    // Without the CA the service is not trusted: one clear line, no rows.
    let untrusted = lake.join("untrusted.toml");
    std::fs::write(
        &untrusted,
        text.replace("ca_file = \"crypto-server/ca.pem\"\n", ""),
    )
    .unwrap();
    let (code, err) = failure(&sql(&untrusted, "admin", ROW, "warn"));
    assert!(
        err.contains("crypto provider 'dbps' unavailable")
            && err.to_lowercase().contains("certificate"),
        "{err}"
    );
    assert_eq!(code, 8, "{err}");
    drop(tls_service);

    // --- wrong credentials: a secret the service does not know ------------------------
    std::fs::write(lake.join("wrong.secret"), "x".repeat(44)).unwrap();
    let wrong = config_variant(&lake, "wrong.toml", &service.addr, "", "wrong.secret");
    let (code, err) = failure(&sql(&wrong, "admin", ROW, "warn"));
    assert!(
        err.contains(
            "crypto provider 'dbps' rejected the credentials: token signature does not verify"
        ),
        "{err}"
    );
    assert_eq!(code, 4, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // --- a frozen service: bounded wait, then one clear error -------------------------
    let bounded = config_variant(
        &lake,
        "bounded.toml",
        &service.addr,
        "timeout_s = 1\nretries = 1\n",
        "crypto-server/jwt.secret",
    );
    signal(&service.child, libc::SIGSTOP);
    let started = Instant::now();
    let (code, err) = failure(&sql(&bounded, "admin", ROW, "warn"));
    let waited = started.elapsed();
    signal(&service.child, libc::SIGCONT);
    assert!(
        err.contains("crypto provider 'dbps' unavailable")
            && err.contains("no answer within 1.0 s"),
        "{err}"
    );
    assert_eq!(code, 8, "{err}");
    assert!(waited < Duration::from_secs(15), "waited {waited:?}");

    // --- frozen mid-query: the scan has had answers, then none; no rows, no hang -------
    let serial = config_variant(
        &lake,
        "serial.toml",
        &service.addr,
        "timeout_s = 1\nretries = 1\nmax_concurrent = 1\nmax_request_mb = 1\n",
        "crypto-server/jwt.secret",
    );
    let service_audit = service_dir.join("audit.jsonl");
    let seen = std::fs::metadata(&service_audit).unwrap().len();
    let query = clearice()
        .arg("--config")
        .arg(&serial)
        .args(["--user", "admin", "--format", "json", "-q", "-c"])
        .arg("SELECT count(DISTINCT ssn || email || phone) AS n FROM lake.sales.customers")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // The first module batch of this query decrypted: freeze the service.
    while std::fs::metadata(&service_audit).unwrap().len() == seen {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no decrypt call seen"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    signal(&service.child, libc::SIGSTOP);
    let out = query.wait_with_output().unwrap();
    let waited = started.elapsed();
    signal(&service.child, libc::SIGCONT);
    let (code, err) = failure(&out);
    assert!(err.contains("no answer within 1.0 s"), "{err}");
    assert_eq!(code, 8, "{err}");
    assert!(out.stdout.is_empty(), "partial output: {:?}", out.stdout);
    // The engine's own message, without DataFusion's or parquet-rs's labels.
    assert!(
        err.starts_with("Error: file '") && !err.contains("Parquet error"),
        "{err}"
    );
    assert!(waited < Duration::from_secs(20), "waited {waited:?}");

    // --- a stopped service: no hang, no rows ------------------------------------------
    drop(service);
    let started = Instant::now();
    let (code, err) = failure(&sql(&bounded, "admin", ROW, "warn"));
    assert!(
        err.contains("crypto provider 'dbps' unavailable") && err.contains("cannot connect"),
        "{err}"
    );
    assert_eq!(code, 8, "{err}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // Columns the service does not protect still read without it.
    let out = sql(
        &bounded,
        "admin",
        "SELECT id, balance FROM lake.sales.customers WHERE id = 1000001",
        "warn",
    );
    assert_eq!(rows(&out)[0]["id"], 1000001);
}

/// A table Iceberg encrypts itself whose table key only the service has: the service
/// wraps and unwraps its key encryption keys, per user; ClearIce's own keyring never
/// holds the key.
#[test]
fn a_table_key_the_service_keeps_is_unwrapped_by_it_per_user() {
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    run_ok(
        clearice()
            .args(["demo", "init", "--provider", "remote"])
            .arg(&lake),
    );
    let service_dir = lake.join("crypto-server");
    // The service keeps a table key of its own: released (as wrapped key encryption keys)
    // to ClearIce for admin and support, never used for module cryptography.
    let keyring = service_dir.join("keyring.json");
    let mut keys: Value =
        serde_json::from_str(&std::fs::read_to_string(&keyring).unwrap()).unwrap();
    keys["vault_key"] = Value::from("dmF1bHQta2V5LTAxMjM0NQ==");
    std::fs::write(&keyring, keys.to_string()).unwrap();
    let service_config = service_dir.join("crypto-server.toml");
    let mut text = std::fs::read_to_string(&service_config).unwrap();
    text.push_str("\n[keys.vault_key]\nusers = [\"admin\", \"support\"]\ntable_key = true\n");
    std::fs::write(&service_config, text).unwrap();
    let local_keys = std::fs::read_to_string(lake.join("keyring.json")).unwrap();
    assert!(!local_keys.contains("vault_key"), "{local_keys}");
    let service = start(
        &service_config,
        &["crypto-server"],
        &tmp.path().join("service.addr"),
    );
    let config = config_variant(
        &lake,
        "clearice.toml",
        &service.addr,
        "",
        "crypto-server/jwt.secret",
    );
    let mut policy = std::fs::read_to_string(lake.join("policy.toml")).unwrap();
    policy.push_str(
        "\n[tables.\"lake.sales.vault\"]\nprovider = \"dbps\"\nwrite = [\"admin\"]\n\
         [tables.\"lake.sales.vault\".columns.id]\naccess = { \"*\" = \"plaintext\" }\nwrite = [\"admin\"]\n\
         [tables.\"lake.sales.vault\".columns.ssn]\n\
         access = { admin = \"plaintext\", support = \"show_last_4\", analyst = \"plaintext\" }\nwrite = [\"admin\"]\n",
    );
    std::fs::write(lake.join("policy.toml"), policy).unwrap();
    let ok = |user: &str, q: &str| rows(&sql(&config, user, q, "warn"));
    // Each statement is its own process: nothing is carried over but the lake.
    for q in [
        "CREATE TABLE lake.sales.vault (id BIGINT, ssn VARCHAR) WITH (\"encryption.key-id\" = 'vault_key')",
        "INSERT INTO lake.sales.vault VALUES (1, '111-22-3333'), (2, '444-55-6666'), (3, '777-88-9999')",
        "DELETE FROM lake.sales.vault WHERE id = 2",
    ] {
        let out = sql(&config, "admin", q, "warn");
        assert!(
            out.status.success(),
            "{q}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let all = ok("admin", "SELECT id, ssn FROM lake.sales.vault ORDER BY id");
    assert_eq!(
        all,
        serde_json::json!([{"id": 1, "ssn": "111-22-3333"}, {"id": 3, "ssn": "777-88-9999"}])
    );
    // support: the service grants vault_key, the policy masks.
    let support = ok("support", "SELECT ssn FROM lake.sales.vault ORDER BY id");
    assert_eq!(
        support,
        serde_json::json!([{"ssn": "XXX-XX-3333"}, {"ssn": "XXX-XX-9999"}])
    );
    // analyst: the policy would show plaintext, the service refuses the table key, and
    // that is the whole table's outcome, in one line naming table and key.
    let (_, err) = failure(&sql(
        &config,
        "analyst",
        "SELECT id FROM lake.sales.vault",
        "warn",
    ));
    assert!(
        err.contains("lake.sales.vault")
            && err.contains("crypto provider 'dbps' refuses table key 'vault_key'"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // On disk: the data files are PME, the table's key encryption keys are wrapped by
    // vault_key, which only the service has.
    let table_dir = lake.join("warehouse/sales/vault");
    let metadata = std::fs::read_dir(table_dir.join("metadata"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".metadata.json"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .unwrap();
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&metadata).unwrap()).unwrap();
    // Key encryption keys wrapped by vault_key; manifest list keys wrapped by one of them.
    let keys = m["encryption-keys"].as_array().unwrap();
    let keks: Vec<&Value> = keys
        .iter()
        .filter(|k| k["encrypted-by-id"] == "vault_key")
        .map(|k| &k["key-id"])
        .collect();
    assert!(!keks.is_empty(), "{m}");
    assert!(
        keys.iter()
            .all(|k| k["encrypted-by-id"] == "vault_key" || keks.contains(&&k["encrypted-by-id"])),
        "{m}"
    );
    for f in std::fs::read_dir(table_dir.join("data")).unwrap() {
        let bytes = std::fs::read(f.unwrap().path()).unwrap();
        assert_eq!(&bytes[..4], b"PARE");
    }
    // The service decided and audited every wrap and unwrap.
    let audit: Vec<Value> = std::fs::read_to_string(service_dir.join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls = |op: &str, user: &str, granted: bool| {
        audit
            .iter()
            .filter(|r| {
                r["operation"] == op
                    && r["user"] == user
                    && r["granted"] == granted
                    && r["key_id"] == "vault_key"
                    && r["table"] == "lake.sales.vault"
            })
            .count()
    };
    assert!(calls("wrap_key", "admin", true) >= 1, "{audit:?}");
    assert!(calls("unwrap_key", "admin", true) >= 2, "{audit:?}");
    assert!(calls("unwrap_key", "support", true) >= 1, "{audit:?}");
    assert_eq!(calls("unwrap_key", "analyst", true), 0, "{audit:?}");
    // Without the service, nothing of the table is read.
    drop(service);
    let (_, err) = failure(&sql(
        &config,
        "admin",
        "SELECT count(*) FROM lake.sales.vault",
        "warn",
    ));
    assert!(err.contains("crypto provider 'dbps'"), "{err}");
}
