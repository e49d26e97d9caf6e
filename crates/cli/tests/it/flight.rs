//! `clearice serve` queried by the Python ADBC Flight SQL driver as three users.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::python;

/// The servers of these tests run one at a time: the attack suite measures that a point
/// query is not starved by a runaway one, which another test's server (or JVM) on the
/// same 2 cores would skew.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    start_in(config, dir, &std::env::current_dir().unwrap())
}

#[test]
fn adbc_clients_see_the_policy_of_their_user() {
    let _alone = one_at_a_time();
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
        serde_json::json!(["lake", "lake", "sales"])
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

    // Result columns carry Flight SQL's column metadata.
    let meta = &analyst["column_meta"];
    assert_eq!(
        meta["id"]["ARROW:FLIGHT:SQL:TABLE_NAME"], "customers",
        "{meta}"
    );
    assert_eq!(meta["id"]["ARROW:FLIGHT:SQL:CATALOG_NAME"], "lake");
    assert_eq!(meta["id"]["ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"], "sales");
    assert_eq!(meta["id"]["ARROW:FLIGHT:SQL:TYPE_NAME"], "BIGINT");
    assert_eq!(meta["id"]["ARROW:FLIGHT:SQL:PRECISION"], "19");
    assert_eq!(meta["next"]["ARROW:FLIGHT:SQL:TABLE_NAME"], Value::Null);
    assert_eq!(meta["next"]["ARROW:FLIGHT:SQL:TYPE_NAME"], "BIGINT");
    assert_eq!(v["header_schema"], serde_json::json!([["XXX-XX-1603"]]));
    let bad_header = v["header_bad_catalog"].as_str().unwrap();
    assert!(
        bad_header.contains("headers 'catalog'/'schema'")
            && bad_header.contains("catalog 'nope' not found"),
        "{bad_header}"
    );
    // Without a schema, one-part names resolve in the default catalog's `public`.
    let no_header = v["no_header"].as_str().unwrap();
    assert!(no_header.contains("customers"), "{no_header}");

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
    let _alone = one_at_a_time();
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
    for (user, ssn) in [("admin", "609-11-1603"), ("analyst", "XXX-XX-1603")] {
        assert_eq!(v[user]["two_part"], serde_json::json!([[ssn]]), "{v}");
        assert_eq!(v[user]["one_part"], serde_json::json!([[ssn]]), "{v}");
    }
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
    let _alone = one_at_a_time();
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
    let _alone = one_at_a_time();
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

/// Starts `clearice serve` with `cwd` as its working directory (relative paths in SQL
/// resolve against it).
fn start_in(config: &Path, dir: &Path, cwd: &Path) -> Server {
    let addr_file = dir.join("addr");
    let child = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .current_dir(cwd)
        .arg("--config")
        .arg(config)
        .args(["serve", "--addr", "127.0.0.1:0", "--addr-file"])
        .arg(&addr_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&addr_file)
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

fn error_text(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("expected a refusal, got {v}"))
}

/// The threat model's attack suite (README "Threat model"): a low-privilege principal
/// (`support`, no file area), an analyst granted a read area and an export area, and an
/// admin, over ADBC against the real binary.
#[test]
fn attack_suite_flight_users_cannot_reach_server_files_settings_or_resources() {
    let _alone = one_at_a_time();
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let lake = root.join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    // Files the server can read but no Flight user may.
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.csv"), "secret\ntopsecret-1\n").unwrap();
    std::fs::write(
        outside.join("secret.json"),
        "{\"secret\": \"topsecret-2\"}\n",
    )
    .unwrap();
    // A read area with a legit file, a symlink out of it, and a directory hiding one.
    let shared = root.join("areas/shared");
    std::fs::create_dir_all(shared.join("dir")).unwrap();
    std::fs::write(shared.join("data.csv"), "x\n41\n").unwrap();
    std::fs::write(shared.join("dir/good.csv"), "secret\nfine\n").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.csv"), shared.join("link.csv")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.csv"), shared.join("dir/evil.csv")).unwrap();
    // An export area with a symlink pointing out of it.
    let exports = root.join("areas/exports");
    std::fs::create_dir_all(&exports).unwrap();
    std::os::unix::fs::symlink(&outside, exports.join("escape")).unwrap();
    // Nobody may write here: every write statement is an attack.
    let policy = std::fs::read_to_string(lake.join("policy.toml"))
        .unwrap()
        .replace("write = [\"admin\"]", "write = []")
        .replace("create = [\"admin\"]", "create = []");
    let policy = policy.replace(
        "[tables.\"lake.sales.orders\"]\nfooter_key = \"footer_key\"",
        "[tables.\"lake.sales.orders\"]\nfooter_key = \"footer_key\"\naccess = { support = \"hide\" }",
    );
    std::fs::write(
        lake.join("policy.toml"),
        format!(
            "{policy}\n[areas.shared]\nroot = \"{}\"\nread = [\"analyst\", \"admin\"]\n\n[areas.exports]\nroot = \"{}\"\nwrite = [\"analyst\", \"admin\"]\n",
            shared.display(),
            exports.display()
        ),
    )
    .unwrap();
    let config = std::fs::read_to_string(lake.join("clearice.toml")).unwrap();
    let config = config.replace(
        "addr = \"127.0.0.1:50051\"",
        "addr = \"127.0.0.1:50051\"\nlogin_free_failures = 3\nlogin_backoff_max_ms = 2000",
    );
    std::fs::write(
        lake.join("clearice.toml"),
        format!(
            "{config}\n[server.limits]\nstatement_timeout_s = 12\nmax_concurrent_statements = 2\nquery_memory_mb = 32\n"
        ),
    )
    .unwrap();
    let hidden_file = walk(&lake.join("warehouse/sales/orders"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    let server = start_in(&lake.join("clearice.toml"), &root, &shared);
    let paths = serde_json::json!({
        "outside": outside, "shared": shared, "exports": exports, "hidden_file": hidden_file,
    });
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/attack_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.addr)
        .arg(paths.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "attack client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let permission_denied = |user: &str, attack: &str, needle: &str| {
        let e = error_text(&v[user][attack]);
        assert!(
            e.contains("PERMISSION_DENIED") || e.contains("PermissionDenied"),
            "{user} {attack}: {e}"
        );
        assert!(e.contains(needle), "{user} {attack}: {e}");
        assert!(!e.contains("topsecret"), "{user} {attack} leaks: {e}");
    };
    for user in ["support", "analyst", "admin"] {
        for (attack, needle) in [
            ("read_abs", "secret.csv"),
            ("read_rel_dotdot", "secret.csv"),
            ("read_abs_dotdot", "secret.csv"),
            ("read_symlink", "link.csv"),
            ("read_file_url", "file://"),
            ("read_s3_url", "'s3' URLs are not in any area"),
            ("read_catalog_store", "clearice-catalog"),
            ("read_catalog_s3", "clearice-s3"),
            ("read_hidden_datafile", ".parquet"),
            ("read_json", "secret.json"),
            ("external_outside", "secret.csv"),
            ("copy_outside_csv", "owned.csv"),
            ("copy_outside_parquet", "owned.parquet"),
            ("copy_outside_json", "owned.json"),
            ("copy_outside_dir", "owned_dir"),
            ("copy_export_symlink", "escape"),
            ("explain_analyze_copy", "owned2.csv"),
            ("set_memory", "datafusion.runtime.memory_limit"),
            ("set_partitions", "datafusion.execution.target_partitions"),
            ("set_catalog", "datafusion.catalog.default_catalog"),
            ("set_crypto", "pushdown_filters"),
            ("ddl_ctas", "write denied"),
            ("ddl_drop", "write denied"),
            ("ddl_schema", "write denied"),
            ("ddl_view", "not allowed over Flight SQL"),
            ("ddl_memory_table", "not allowed over Flight SQL"),
            ("dml_insert", "write denied"),
        ] {
            permission_denied(user, attack, needle);
        }
        assert_eq!(v[user]["set_allowed"]["error"], Value::Null, "{user}");
        let tz = |k: &str| v[user][k].to_string();
        assert!(
            tz("time_zone_after_set").contains("+01:00"),
            "{user}: {}",
            tz("time_zone_after_set")
        );
        assert!(
            !tz("time_zone_other_session").contains("+01:00"),
            "{user}: {}",
            tz("time_zone_other_session")
        );
    }
    // The low-privilege user has no area: the granted statements are refused too.
    for attack in [
        "area_read",
        "area_read_rel",
        "area_read_dir",
        "area_external",
        "export_csv",
        "export_parquet",
        "export_json",
        "export_masked",
    ] {
        permission_denied("support", attack, "granted no area");
    }
    // The analyst reads and exports inside its areas; the directory's symlink is skipped.
    let analyst = &v["analyst"];
    for ok in [
        "area_read",
        "area_read_rel",
        "area_read_dir",
        "area_external",
        "export_csv",
        "export_parquet",
        "export_json",
        "export_masked",
    ] {
        assert_eq!(analyst[ok]["error"], Value::Null, "{ok}: {}", analyst[ok]);
    }
    assert_eq!(analyst["area_read"]["ok"], serde_json::json!([[41]]));
    assert_eq!(
        analyst["area_read_dir"]["ok"],
        serde_json::json!([["fine"]])
    );
    // A masked column is exported masked; a denied one is not exported at all.
    let ssn = std::fs::read_to_string(exports.join("ssn_analyst.csv")).unwrap();
    assert!(
        ssn.contains("XXX-XX-1603") && !ssn.contains("609-11-1603"),
        "{ssn}"
    );
    assert!(error_text(&analyst["export_denied"]).contains("card_number"));
    assert!(!exports.join("cards_analyst.csv").exists());
    // Nothing was written outside the export area.
    let written: Vec<String> = walk(&outside)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(written.len(), 2, "only the two secrets: {written:?}");

    eprintln!(
        "limits: timeout after {} s, point latencies during runaway {}",
        v["timeout_seconds"], v["point_latencies_during_runaway"]
    );
    // Limits.
    let e = v["timeout_error"].as_str().unwrap();
    assert!(
        e.contains("DEADLINE_EXCEEDED") || e.contains("DeadlineExceeded") || e.contains("timeout"),
        "{e}"
    );
    let took = v["timeout_seconds"].as_f64().unwrap();
    assert!((11.5..40.0).contains(&took), "timeout after {took} s");
    // One of the three overlapping runaway statements is refused.
    let e = v["concurrency_error"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v["runaway_errors"].to_string());
    assert!(
        e.contains("too many statements"),
        "a third statement of support's was not refused while its two runaway statements \
         ran: probe {}, runaways {}",
        v["concurrency_error"],
        v["runaway_errors"]
    );
    let mut lat: Vec<f64> = v["point_latencies_during_runaway"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect();
    lat.sort_by(f64::total_cmp);
    // Stated (README): while one principal's runaway queries fill their limit, another
    // user's point query is not starved until they end: each answers within the statement
    // timeout (measured 0.1-6.8 s on 2 vCPU, debug build; without FairJoins the first one
    // waited for the runaway to end, ~100 s).
    eprintln!(
        "point queries done before the runaway ended: {}",
        v["points_before_runaway_ended"]
    );
    assert!(
        lat[4] < 12.0,
        "point queries took {lat:?} s during the runaway"
    );
    let errors = v["runaway_errors"].to_string();
    assert!(
        errors.contains("DEADLINE_EXCEEDED") || errors.contains("statement timeout"),
        "{errors}"
    );
    let e = v["memory_error"].as_str().unwrap();
    assert!(e.contains("memory limit"), "{e}");
    assert_eq!(v["memory_other_user"], serde_json::json!([[200000]]));

    // Login throttling.
    let errors: Vec<&str> = v["wrong_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        errors
            .iter()
            .all(|e| e.contains("UNAUTHENTICATED") || e.contains("Unauthenticated"))
    );
    let throttled = errors
        .iter()
        .filter(|e| e.contains("too many failed logins"))
        .count();
    assert!(throttled >= 10, "{errors:?}");
    assert!(
        v["right_during_backoff"]
            .as_str()
            .is_some_and(|e| e.contains("too many failed logins"))
    );
    assert_eq!(v["right_after_backoff"], Value::Null);

    // Every refusal is audited with its action.
    let audit = std::fs::read_to_string(lake.join("audit.jsonl")).unwrap();
    let rec: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |action: &str, user: &str| {
        rec.iter()
            .filter(|r| r["action"] == action && r["user"] == user && r["allowed"] == false)
            .count()
    };
    assert!(count("read_file", "support") >= 13, "{audit}");
    assert!(count("write_file", "support") >= 6);
    assert!(count("set", "admin") >= 4);
    // Views and in-memory tables are refused by confinement ...
    assert!(count("statement", "admin") >= 2);
    // ... catalog writes by the policy's write rules, audited as the write they were.
    for action in ["create_table", "drop_table", "create_schema", "insert"] {
        assert!(count(action, "admin") >= 1, "{action}: {audit}");
    }
    assert!(count("limit", "support") >= 3);
    assert!(count("login", "analyst") >= 20);
    assert!(!audit.contains("topsecret"));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The Flight SQL JDBC driver jars (newest release, previous major), set by scripts/test.sh.
fn jdbc_jars() -> Option<Vec<PathBuf>> {
    let v = std::env::var("CLEARICE_JDBC_JARS").ok();
    if v.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_JDBC_JARS is not set"
        );
        eprintln!("\n*** SKIPPED: CLEARICE_JDBC_JARS not set; run ./scripts/test.sh ***\n");
    }
    v.map(|v| v.split(':').map(PathBuf::from).collect())
}

/// Runs tests/java/JdbcClient.java with `jar` on the class path; returns its `name\tvalue`
/// lines as a map.
fn jdbc_client(jar: &Path, args: &[&str]) -> std::collections::HashMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/JdbcClient.java");
    let out = Command::new("java")
        .arg("--add-opens=java.base/java.nio=ALL-UNNAMED")
        .arg("-cp")
        .arg(jar)
        .arg(src)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("done\ttrue"),
        "{}: {stdout}\n{}",
        jar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A bearer token for `user` (what DBeaver's `token=` property would carry), via pyarrow.
fn bearer_token(python: &str, addr: &str, user: &str) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(format!(
            "import pyarrow.flight as f; c = f.FlightClient('grpc://{addr}'); \
             print(dict([c.authenticate_basic_token('{user}', '{user}')])[b'authorization'].decode().split(' ', 1)[1])"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What DBeaver does on connect and browse, with the driver DBeaver loads (both lines).
#[test]
fn jdbc_driver_connects_browses_and_queries_like_dbeaver() {
    let _alone = one_at_a_time();
    let Some(python) = python() else { return };
    let Some(jars) = jdbc_jars() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    let out = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .args(["demo", "init"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    let server = start(&lake.join("clearice.toml"), tmp.path());
    let url = format!(
        "jdbc:arrow-flight-sql://{}/?useEncryption=false",
        server.addr
    );
    for jar in &jars {
        let token = bearer_token(&python, &server.addr, "support");
        let v = jdbc_client(jar, &[&url, "full", &token]);
        let get = |k: &str| {
            v.get(k)
                .map(String::as_str)
                .unwrap_or_else(|| panic!("{k}: {v:?}"))
        };
        let which = jar.display();
        assert!(get("product").starts_with("ClearIce "), "{which}");
        // DataFusion's empty in-memory catalog is not listed.
        assert_eq!(get("catalogs"), "[lake]", "{which}");
        assert_eq!(get("schemas"), "[sales]", "{which}");
        assert_eq!(get("tables"), "[customers, orders]", "{which}");
        assert!(
            get("columns").contains("balance:DECIMAL") && get("columns").contains("tags:ARRAY"),
            "{which}"
        );
        assert_eq!(get("primary_keys"), "[]");
        assert_eq!(
            get("session_catalog_count"),
            "100000",
            "{which}: catalog=lake"
        );
        let row = get("row");
        for want in [
            "id=Long:1000001",
            "ssn=String:609-11-1603",
            "birth_date=Date:1982-08-31",
            "balance=BigDecimal:489247.72",
            "tags=ArrowFlightJdbcArray:[\"vip\"]",
        ] {
            assert!(row.contains(want), "{which}: {want} in {row}");
        }
        assert_eq!(get("balance_decimal"), "489247.72");
        let meta = get("balance_meta");
        assert!(
            meta.starts_with("lake.sales.customers ") && meta.ends_with("(12,2)"),
            "{which}: {meta}"
        );
        assert_eq!(get("amount"), "3593.99");
        assert_eq!(get("null_is_null"), "true");
        assert_eq!(get("timestamp"), "2025-01-05 10:00:00.0");
        assert_eq!(get("timestamp_tz"), "true");
        assert_eq!(
            get("prepared"),
            "[1000002/231-68-8653, 1000003/735-64-8852]"
        );
        assert_eq!(get("max_rows"), "5");
        assert!(
            get("cancel").starts_with("cancelled after"),
            "{which}: {}",
            get("cancel")
        );
        assert_eq!(get("token"), "1", "{which}: token=");
        assert_eq!(get("analyst_ssn"), "XXX-XX-1603");
        assert_eq!(
            get("analyst_unqualified"),
            "XXX-XX-1603",
            "{which}: default catalog + schema header"
        );
        let denied = get("denied");
        assert!(
            denied.contains("access denied") && denied.contains("card_number"),
            "{denied}"
        );
        let by_path = get("file_by_path");
        assert!(
            by_path.contains("may not read '/etc/passwd.csv' by path"),
            "{by_path}"
        );
        assert!(!by_path.contains("External error"), "{by_path}");
        assert!(get("wrong_password").contains("invalid user name or password"));
        eprintln!("{which}: close with catalog= -> {}", get("close"));
    }
}

/// The JDBC driver over TLS (`tlsRootCerts`) with a client certificate (mTLS).
#[test]
fn jdbc_driver_connects_with_tls_and_a_client_certificate() {
    let _alone = one_at_a_time();
    let Some(python) = python() else { return };
    let Some(jars) = jdbc_jars() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (server, lake, _) = tls_server(&python, tmp.path(), "tls_client_ca = \"clients-ca.pem\"\n");
    for jar in &jars {
        let url = format!(
            "jdbc:arrow-flight-sql://{}/?useEncryption=true&tlsRootCerts={}&clientCertificate={}&clientKey={}",
            server.addr.replace("127.0.0.1", "localhost"),
            lake.join("server.pem").display(),
            lake.join("client.pem").display(),
            lake.join("client.key").display()
        );
        let v = jdbc_client(jar, &[&url, "tls"]);
        assert_eq!(v["tls_ssn"], "XXX-XX-1603", "{}: {v:?}", jar.display());
    }
}
