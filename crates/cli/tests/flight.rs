//! `clearice serve` queried by the Python ADBC Flight SQL driver as three users.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &Path, dir: &Path) -> Server {
    let addr_file = dir.join("addr");
    let child = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .arg("--config")
        .arg(config)
        .args(["serve", "--addr", "127.0.0.1:0", "--addr-file"])
        .arg(&addr_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !addr_file.exists()
        || std::fs::read_to_string(&addr_file)
            .unwrap_or_default()
            .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Server {
        child,
        addr: std::fs::read_to_string(&addr_file).unwrap(),
    }
}

fn python() -> Option<String> {
    let p = std::env::var("CLEARICE_PYTHON").ok();
    if p.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_PYTHON is not set"
        );
        eprintln!(
            "\n*** SKIPPED: CLEARICE_PYTHON not set; run ./scripts/test.sh to run this test ***\n"
        );
    }
    p
}

#[test]
fn adbc_clients_see_the_policy_of_their_user() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = start(&lake.join("clearice.toml"), tmp.path());
    let script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/adbc_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.addr)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ADBC client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();

    let admin = &v["admin"];
    assert_eq!(
        admin["rows"],
        serde_json::json!([[1000001, "609-11-1603", "josé.garcia1@example.com"]])
    );
    assert_eq!(
        admin["prepared"],
        serde_json::json!([[1000002, "231-68-8653"]])
    );
    assert_eq!(admin["count"], 200000);
    assert!(
        admin["schema"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "phone")
    );
    assert!(
        admin["schema_types"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t != "string_view"),
        "{admin}"
    );
    assert!(
        admin["tables"]["lake.sales.customers"]
            .as_array()
            .unwrap()
            .len()
            >= 10
    );
    assert_eq!(admin["denied"], Value::Null);

    let analyst = &v["analyst"];
    let row = &analyst["rows"][0];
    assert_eq!(
        (&row[0], &row[1]),
        (&Value::from(1000001), &Value::from("XXX-XX-1603"))
    );
    assert_eq!(row[2].as_str().unwrap().len(), 64, "sha256 hex");
    assert_eq!(
        analyst["prepared"],
        serde_json::json!([[1000002, "XXX-XX-8653"]])
    );
    assert!(
        !analyst["schema"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "phone"),
        "phone hidden: {analyst}"
    );
    assert!(
        !analyst["tables"]["lake.sales.customers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "phone")
    );
    let denied = analyst["denied"].as_str().unwrap();
    assert!(
        denied.contains("PERMISSION_DENIED")
            || denied.contains("PermissionDenied")
            || denied.contains("access denied"),
        "{denied}"
    );
    assert!(denied.contains("card_number"), "{denied}");
    // session options: default catalog, then lake.sales for unqualified names, per user
    assert_eq!(
        analyst["session"],
        serde_json::json!(["datafusion", "lake", "sales"])
    );
    assert_eq!(analyst["unqualified"], serde_json::json!([["XXX-XX-1603"]]));
    assert_eq!(admin["unqualified"], serde_json::json!([["609-11-1603"]]));
    let bad_catalog = analyst["bad_catalog"].as_str().unwrap();
    assert!(
        bad_catalog.contains("'catalog' (invalid value)"),
        "{bad_catalog}"
    );
    let bad = analyst["bad_sql"].as_str().unwrap();
    assert!(
        bad.contains("INVALID_ARGUMENT") || bad.contains("InvalidArgument"),
        "{bad}"
    );

    let support = &v["support"];
    assert_eq!(
        support["rows"],
        serde_json::json!([[1000001, null, "josé.garcia1@example.com"]])
    );

    let wrong = v["wrong_password"].as_str().unwrap();
    assert!(
        wrong.contains("UNAUTHENTICATED") || wrong.contains("Unauthenticated"),
        "{wrong}"
    );
    let unknown = v["unknown_user"].as_str().unwrap();
    assert!(
        unknown.contains("UNAUTHENTICATED") || unknown.contains("Unauthenticated"),
        "{unknown}"
    );

    // The audit log names the Flight users and their client address.
    let audit = std::fs::read_to_string(lake.join("audit.jsonl")).unwrap();
    let rec: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        rec.iter()
            .any(|r| r["user"] == "analyst"
                && r["client"].as_str().unwrap().starts_with("127.0.0.1:"))
    );
    assert!(
        rec.iter()
            .any(|r| r["user"] == "analyst" && r["allowed"] == false)
    );
}

#[test]
fn serve_refuses_plaintext_on_a_public_address() {
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .arg("--config")
        .arg(lake.join("clearice.toml"))
        .args(["serve", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("without TLS") && e.contains("insecure = true"),
        "{e}"
    );
}

#[test]
fn superset_sqlalchemy_dialect_browses_and_queries_under_the_policy() {
    let Some(_) = python() else { return };
    let python = std::env::var("CLEARICE_SUPERSET_PYTHON")
        .expect("CLEARICE_SUPERSET_PYTHON (set by scripts/test.sh)");
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    let server = start(&lake.join("clearice.toml"), tmp.path());
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/superset_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.addr)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "Superset dialect client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for user in ["admin", "analyst"] {
        assert!(
            v[user]["schemas"]
                .as_array()
                .unwrap()
                .contains(&Value::from("sales")),
            "{v}"
        );
        assert_eq!(
            v[user]["tables"],
            serde_json::json!(["customers", "orders"])
        );
    }
    let has_phone = |u: &str| {
        v[u]["columns"]
            .as_array()
            .unwrap()
            .contains(&Value::from("phone"))
    };
    assert!(has_phone("admin") && !has_phone("analyst"), "{v}");
    assert_eq!(
        v["admin"]["rows"],
        serde_json::json!([[1000001, "609-11-1603"]])
    );
    assert_eq!(
        v["analyst"]["rows"],
        serde_json::json!([[1000001, "XXX-XX-1603"]])
    );
}

/// A demo lake served over TLS (certificates from tls_client.py `gen`); `server_extra` is
/// added to `[server]`.
fn tls_server(python: &str, tmp: &Path, server_extra: &str) -> (Server, PathBuf, PathBuf) {
    let lake = tmp.join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    let script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/tls_client.py");
    let made = Command::new(python)
        .arg(&script)
        .arg("gen")
        .arg(&lake)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let config = lake.join("clearice.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[server]\n",
        &format!("[server]\ntls_cert = \"server.pem\"\ntls_key = \"server.key\"\n{server_extra}"),
    );
    std::fs::write(&config, text).unwrap();
    (start(&config, tmp), lake, script)
}

#[test]
fn adbc_needs_a_client_certificate_with_mtls() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (server, lake, script) =
        tls_server(&python, tmp.path(), "tls_client_ca = \"clients-ca.pem\"\n");
    let run = |client: bool| {
        let mut cmd = Command::new(&python);
        cmd.arg(&script)
            .arg("query")
            .arg(&server.addr)
            .arg(lake.join("server.pem"));
        if client {
            cmd.arg(lake.join("client.pem"))
                .arg(lake.join("client.key"));
        }
        cmd.output().unwrap()
    };
    let with = run(true);
    assert!(
        with.status.success(),
        "mTLS client failed: {}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&with.stdout).trim(),
        "[[\"XXX-XX-1603\"]]"
    );
    // the same client without a certificate is refused during the TLS handshake
    let without = run(false);
    assert!(!without.status.success());
    let e = String::from_utf8_lossy(&without.stderr);
    // TLS 1.3: the server checks the client certificate after the client considers the
    // handshake done, so the client sees either the server's alert or its closed socket.
    assert!(
        e.contains("Unavailable")
            && (e.contains("certificate required")
                || e.contains("broken pipe")
                || e.contains("connection reset")),
        "{e}"
    );
    assert!(
        String::from_utf8_lossy(&without.stdout).trim().is_empty(),
        "no rows without a client certificate"
    );
}

#[test]
fn adbc_connects_over_tls() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (server, lake, script) = tls_server(&python, tmp.path(), "");
    let out = Command::new(&python)
        .arg(&script)
        .arg("query")
        .arg(&server.addr)
        .arg(lake.join("server.pem"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "TLS client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[[\"XXX-XX-1603\"]]"
    );
    // a plaintext client cannot talk to the TLS endpoint
    let plain = Command::new(&python)
        .arg("-c")
        .arg(format!(
            "import adbc_driver_flightsql.dbapi as f; f.connect('grpc://{}', db_kwargs={{'username':'analyst','password':'analyst'}})",
            server.addr
        ))
        .output()
        .unwrap();
    assert!(!plain.status.success());
}
