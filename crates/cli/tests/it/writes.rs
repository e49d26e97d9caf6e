//! SQL writes as pipelines run them: `clearice -f` files building an encrypted table that
//! PyIceberg, PyArrow and Spark (parquet-java's key tools) read back with the keys; the
//! files' column keys and the
//! manifests' bounds; a write killed before its commit; concurrent INSERTs; ADBC
//! `executeUpdate` against `clearice serve`; the audit records of writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{python, run_ok, start};

/// The policy of the table the pipeline builds (appended to the demo policy).
const PEOPLE_POLICY: &str = r#"
[tables."lake.etl.people"]
footer_key = "footer_key"
write = ["admin"]

[tables."lake.etl.people".columns.ssn]
master_key = "pii_key"
write = ["admin"]
access = { admin = "plaintext", analyst = "show_last_4" }

[tables."lake.etl.people".columns.salary]
master_key = "finance_key"
write = ["admin"]
access = { admin = "plaintext", analyst = "plaintext" }
"#;

/// A demo lake whose policy also protects `lake.etl.people`.
fn lake(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .args(["demo", "init"])
            .arg(&lake),
    );
    let policy = lake.join("policy.toml");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str(PEOPLE_POLICY);
    std::fs::write(&policy, text).unwrap();
    lake
}

/// Runs `tests/python/SCRIPT ARGS` with the test venv's Python; its JSON output.
fn client(python: &str, script: &str, args: &[&str]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = Command::new(python).arg(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn clearice(lake: &Path, user: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_clearice"));
    c.arg("--config")
        .arg(lake.join("clearice.toml"))
        .args(["--user", user, "--quiet"]);
    c
}

fn sql(lake: &Path, user: &str, sql: &str) -> Output {
    clearice(lake, user)
        .args(["--format", "csv", "-c", sql])
        .output()
        .unwrap()
}

fn sql_ok(lake: &Path, sql_text: &str) -> String {
    let out = sql(lake, "admin", sql_text);
    assert!(
        out.status.success(),
        "{sql_text}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn count(lake: &Path, table: &str) -> i64 {
    sql_ok(lake, &format!("SELECT count(*) AS n FROM {table}"))
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn snapshots(lake: &Path, table: &str) -> Vec<String> {
    let (ns, t) = table.rsplit_once('.').unwrap();
    sql_ok(
        lake,
        &format!("SELECT snapshot_id FROM {ns}.\"{t}$snapshots\" ORDER BY committed_at"),
    )
    .lines()
    .skip(1)
    .map(str::to_owned)
    .collect()
}

const CREATE: &str = "
CREATE SCHEMA IF NOT EXISTS lake.etl;
CREATE TABLE lake.etl.people (id BIGINT NOT NULL, name VARCHAR, ssn VARCHAR, salary DOUBLE, dept VARCHAR)
  PARTITIONED BY (dept);
";

const LOAD: &str = "
INSERT INTO lake.etl.people
SELECT id, name, ssn, balance, country FROM lake.sales.customers WHERE id < 1000200;
";

const CHANGE: &str = "
UPDATE lake.etl.people SET salary = salary + 1, name = upper(name) WHERE dept = 'DE';
DELETE FROM lake.etl.people WHERE id % 10 = 0;
INSERT INTO lake.etl.people VALUES (1, 'new', '000-00-0001', 10.5, 'XX');
CREATE TABLE lake.etl.changes AS
  SELECT id, 'merged' AS name, CAST(NULL AS VARCHAR) AS ssn, balance AS salary, country AS dept
  FROM lake.sales.customers WHERE id BETWEEN 1000190 AND 1000210;
MERGE INTO lake.etl.people t USING lake.etl.changes s ON t.id = s.id
  WHEN MATCHED THEN UPDATE SET name = s.name
  WHEN NOT MATCHED THEN INSERT (id, name, ssn, salary, dept) VALUES (s.id, s.name, s.ssn, s.salary, s.dept);
";

#[test]
fn a_pipeline_of_sql_files_builds_an_encrypted_table_python_and_spark_read_back() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    for (name, text) in [
        ("01_create", CREATE),
        ("02_load", LOAD),
        ("03_change", CHANGE),
    ] {
        let file = tmp.path().join(format!("{name}.sql"));
        std::fs::write(&file, text).unwrap();
        let out = run_ok(
            clearice(&lake, "admin")
                .args(["--format", "csv", "-f"])
                .arg(&file),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        if name == "02_load" {
            // the INSERT reports its rows
            assert_eq!(stdout.trim(), "count\n200", "{name}");
        }
    }
    // A failing file stops at its first error with a non-zero exit code; the table is as
    // it was (the statement before it committed, the failed one left nothing).
    let before = snapshots(&lake, "lake.etl.people");
    let bad = tmp.path().join("04_bad.sql");
    std::fs::write(
        &bad,
        "INSERT INTO lake.etl.people (name) VALUES ('no id');\nDELETE FROM lake.etl.people;\n",
    )
    .unwrap();
    let out = clearice(&lake, "admin")
        .arg("-f")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("column 'id' is required (NOT NULL) but the statement writes NULL"),
        "{out:?}"
    );
    assert_eq!(snapshots(&lake, "lake.etl.people"), before);
    // A principal without write permission is refused before anything is written.
    let files_before = data_files(&lake);
    let out = sql(
        &lake,
        "analyst",
        "INSERT INTO lake.etl.people VALUES (2, 'x', NULL, NULL, 'XX')",
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(data_files(&lake), files_before);

    // What ClearIce reads ...
    let out = clearice(&lake, "admin")
        .args([
            "--format",
            "ndjson",
            "-c",
            "SELECT id, name, ssn, CAST(round(salary * 100) AS BIGINT) AS cents, dept \
             FROM lake.etl.people ORDER BY id",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ours: Vec<Vec<Value>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            ["id", "name", "ssn", "cents", "dept"]
                .iter()
                .map(|c| r.get(*c).cloned().unwrap_or(Value::Null))
                .collect()
        })
        .collect();
    // 200 loaded, 20 deleted, 1 inserted, 12 merged in (1000190 was deleted, 200..210 new)
    assert_eq!(ours.len(), 200 - 20 + 1 + 12);
    assert_eq!(ours.iter().filter(|r| r[1] == "merged").count(), 21);
    assert!(ours.iter().any(|r| r[1] == "new"));
    let de: Vec<&Vec<Value>> = ours.iter().filter(|r| r[4] == "DE").collect();
    assert!(!de.is_empty());
    assert!(
        de.iter().all(|r| r[1]
            .as_str()
            .is_none_or(|n| n == "merged" || n == n.to_uppercase())),
        "UPDATE ... WHERE dept = 'DE' upper-cased the names"
    );
    // ... is what PyIceberg (catalog, manifests) and PyArrow (PME, the keyring KMS) read.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_written.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(lake.join("catalog.db"))
        .arg(format!("file://{}", lake.join("warehouse").display()))
        .arg(lake.join("keyring.json"))
        .arg("etl.people")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PyIceberg/PyArrow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: Value = serde_json::from_slice(&out.stdout).unwrap();
    let theirs: Vec<Vec<Value>> = serde_json::from_value(py["rows"].clone()).unwrap();
    assert_eq!(theirs, ours);
    // ... and what Spark reads with parquet-java's key tools (PropertiesDrivenCryptoFactory
    // and a KMS client over the same keyring).
    let files: Vec<String> = serde_json::from_value(py["files"].clone()).unwrap();
    let spark = spark_read(&python, tmp.path(), &lake.join("keyring.json"), &files);
    assert_eq!(spark, ours, "Spark read other rows");
    // Manifests: bounds of the plaintext columns only.
    let bounds: Vec<String> = serde_json::from_value(py["bounds"].clone()).unwrap();
    assert!(bounds.contains(&"id".to_owned()), "{bounds:?}");
    assert!(
        !bounds.iter().any(|b| b == "ssn" || b == "salary"),
        "bounds of encrypted columns in the manifests: {bounds:?}"
    );
    let ops: Vec<String> = serde_json::from_value(py["snapshots"].clone()).unwrap();
    assert_eq!(
        ops,
        ["append", "overwrite", "overwrite", "append", "overwrite"],
        "{ops:?}"
    );
    // Footers: every data file's columns under the policy's keys.
    let keys = column_keys(&lake, &files);
    for (file, cols) in keys {
        let key = |c: &str| {
            cols.iter()
                .find(|(n, _)| n == c)
                .and_then(|(_, k)| k.clone())
        };
        assert_eq!(key("ssn").as_deref(), Some("pii_key"), "{file}");
        assert_eq!(key("salary").as_deref(), Some("finance_key"), "{file}");
        assert_eq!(key("id"), None, "{file}");
        assert_eq!(key("dept"), None, "{file}");
    }
    // Audit: each write with its action, rows and the snapshot it committed.
    let audit = std::fs::read_to_string(lake.join("audit.jsonl")).unwrap();
    let writes: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["table"] == "lake.etl.people" && r["action"] != "query")
        .collect();
    let insert = writes
        .iter()
        .find(|r| r["action"] == "insert" && r["rows"] == 200)
        .expect("audit record of the INSERT");
    assert!(insert["snapshot_id"].is_i64(), "{insert}");
    assert_eq!(insert["allowed"], true);
    let update = writes.iter().find(|r| r["action"] == "update").unwrap();
    assert!(update["rows"].as_u64().unwrap() > 0, "{update}");
    let refused = writes
        .iter()
        .find(|r| r["user"] == "analyst")
        .expect("audit record of the refused write");
    assert_eq!(refused["allowed"], false);
    assert!(
        writes
            .iter()
            .any(|r| r["action"] == "create_table" && r["allowed"] == true)
    );
}

/// The rows of `files` as Spark reads them, decrypting with parquet-java's key tools.
fn spark_read(python: &str, tmp: &Path, keyring: &Path, files: &[String]) -> Vec<Vec<Value>> {
    let jars = run_ok(Command::new(python).args([
        "-c",
        "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))",
    ]));
    let jars = String::from_utf8(jars.stdout).unwrap().trim().to_owned();
    let classes = tmp.join("kms-classes");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/kms/KeyringKmsClient.java");
    run_ok(
        Command::new("javac")
            .args(["-cp", &format!("{jars}/*"), "-d"])
            .arg(&classes)
            .arg(source),
    );
    let jar = tmp.join("keyring-kms.jar");
    run_ok(
        Command::new("jar")
            .arg("cf")
            .arg(&jar)
            .arg("-C")
            .arg(&classes)
            .arg("."),
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/spark_read_written.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&jar)
        .arg(keyring)
        .args(files.iter().map(|f| f.trim_start_matches("file://")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "Spark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(v["rows"].clone()).unwrap()
}

/// Data files under the table's directory.
fn data_files(lake: &Path) -> Vec<PathBuf> {
    let dir = lake.join("warehouse/etl/people/data");
    let mut out = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The master key of each column of each file, as the engine reads the footers.
/// Each column of a file with its master key id (`None`: plaintext or the footer key).
type FileKeys = Vec<(String, Option<String>)>;

fn column_keys(lake: &Path, files: &[String]) -> Vec<(String, FileKeys)> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let config = clearice_engine::Config::load(&lake.join("clearice.toml")).unwrap();
        let engine = clearice_engine::Engine::open(config).await.unwrap();
        let mut out = Vec::new();
        for f in files {
            out.push((f.clone(), engine.file_column_keys(f).await.unwrap()));
        }
        out
    })
}

#[test]
fn a_write_killed_before_its_commit_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    sql_ok(&lake, CREATE);
    sql_ok(&lake, LOAD);
    let before = snapshots(&lake, "lake.etl.people");
    let marker = tmp.path().join("paused");
    let mut child = clearice(&lake, "admin")
        .args(["-c", LOAD])
        .env("CLEARICE_TEST_PAUSE_BEFORE_COMMIT", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the write did not pause"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its data files are written...
    let written = std::fs::read_to_string(&marker).unwrap();
    for f in written.lines() {
        assert!(Path::new(f.trim_start_matches("file://")).exists(), "{f}");
    }
    // ... and the process dies before committing them.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(snapshots(&lake, "lake.etl.people"), before);
    assert_eq!(count(&lake, "lake.etl.people"), 200);
}

#[test]
fn concurrent_inserts_all_land() {
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    sql_ok(&lake, CREATE);
    let writers: Vec<_> = (0..4)
        .map(|i| {
            clearice(&lake, "admin")
                .args([
                    "-c",
                    &format!(
                        "INSERT INTO lake.etl.people SELECT id + {i} * 1000000, name, ssn, balance, country \
                         FROM lake.sales.customers WHERE id < 1000050"
                    ),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for w in writers {
        let out = w.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(count(&lake, "lake.etl.people"), 200);
    assert_eq!(snapshots(&lake, "lake.etl.people").len(), 4);
    assert_eq!(
        sql_ok(&lake, "SELECT count(DISTINCT id) AS n FROM lake.etl.people")
            .lines()
            .nth(1),
        Some("200")
    );
}

#[test]
fn adbc_execute_update_returns_row_counts() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let v = client(&python, "adbc_writes.py", &[&server.addr]);
    assert_eq!(v["insert"], 3, "{v}");
    assert_eq!(v["ctas"], 10, "{v}");
    assert_eq!(v["prepared"], 2, "{v}");
    assert_eq!(v["update"], 2, "{v}");
    assert_eq!(v["delete"], 1, "{v}");
    assert_eq!(
        v["rows"],
        serde_json::json!([[2, "b"], [3, "c"], [4, "z"], [5, "z"]])
    );
    // Bulk ingest: created, appended to, refused when it exists and mode is create.
    assert_eq!(v["ingest_create"], 3, "{v}");
    assert_eq!(v["ingest_append"], 3, "{v}");
    assert_eq!(v["ingested"], serde_json::json!([6, 12]), "{v}");
    let again = v["ingest_again"]
        .as_str()
        .expect("create on an existing table fails");
    assert!(again.contains("already exists"), "{again}");
    let refused = v["analyst_ingest"]
        .as_str()
        .expect("the analyst's ingest is refused");
    assert!(refused.contains("write denied"), "{refused}");
    let refused = v["analyst"]
        .as_str()
        .expect("the analyst's INSERT is refused");
    assert!(refused.contains("write denied"), "{refused}");
    assert!(refused.contains("PermissionDenied"), "{refused}");
    drop(server);
    // Writes over Flight are audited with the client's address and the rows written.
    let audit = std::fs::read_to_string(lake.join("audit.jsonl")).unwrap();
    let insert = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["table"] == "lake.adbc.t" && r["action"] == "insert" && r["rows"] == 3)
        .expect("audit record of the Flight INSERT");
    assert!(
        insert["client"].as_str().unwrap().contains("127.0.0.1"),
        "{insert}"
    );
}

/// Random UPDATE / DELETE / MERGE / INSERT statements (subqueries, NULLs, CASE, AND/OR/NOT)
/// over ADBC against a real `clearice serve` and in DuckDB on the same rows: after each
/// statement the reported count and the table are equal, or ClearIce refused it in one
/// line and changed nothing (tests/python/differential_writes.py).
#[test]
fn differential_writes_match_duckdb() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let v = client(
        &python,
        "differential_writes.py",
        &[&server.addr, "11,23,37,41,59", "110"],
    );
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    assert!(v["statements"].as_u64().unwrap() >= 550, "{v}");
    // Most statements run (refusals are the correlated subqueries, and the statement
    // kinds ClearIce cannot run exactly): each kind ran many times.
    for kind in ["DELETE", "UPDATE", "INSERT", "MERGE"] {
        assert!(
            v["executed"][kind].as_u64().unwrap_or(0) >= 40,
            "{kind}: {v}"
        );
    }
    let refused: u64 = v["refused"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(refused * 4 < v["statements"].as_u64().unwrap(), "{v}");
}

/// [`differential_writes_match_duckdb`] on format 3 tables: DELETE, UPDATE, MERGE and
/// INSERT commit snapshots with row lineage (rows copied keep their ids).
#[test]
fn differential_writes_on_format_3_tables_match_duckdb() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let v = client(
        &python,
        "differential_writes.py",
        &[&server.addr, "5,17", "60", "3"],
    );
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    assert!(v["statements"].as_u64().unwrap() >= 120, "{v}");
    for (kind, least) in [("DELETE", 20), ("UPDATE", 20), ("INSERT", 8), ("MERGE", 6)] {
        assert!(
            v["executed"][kind].as_u64().unwrap_or(0) >= least,
            "{kind}: {v}"
        );
    }
}

/// [`differential_writes_match_duckdb`] as `support` under a row filter on the table:
/// DELETE and UPDATE change only the rows it keeps (their subqueries read only those), an
/// UPDATE setting a column it reads is refused, an INSERT of a row outside it fails and
/// changes nothing; DuckDB computes each from the same rows.
#[test]
fn differential_writes_under_a_row_filter_match_duckdb() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    let filter = "id % 3 <> 0 AND (b IS NULL OR b <> 'zz')";
    let policy = lake.join("policy.toml");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text.push_str(&format!(
        "\n[tables.\"lake.diff.t\"]\nwrite = [\"admin\", \"support\"]\n\n\
         [tables.\"lake.diff.t\".row_filter]\n\"user:admin\" = \"true\"\nsupport = \"{filter}\"\n"
    ));
    std::fs::write(&policy, text).unwrap();
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let v = client(
        &python,
        "differential_writes.py",
        &[&server.addr, "3,29,71", "80", "2", filter],
    );
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    assert!(v["statements"].as_u64().unwrap() >= 200, "{v}");
    for (kind, least) in [("DELETE", 30), ("UPDATE", 15), ("INSERT", 8)] {
        assert!(
            v["executed"][kind].as_u64().unwrap_or(0) >= least,
            "{kind}: {v}"
        );
    }
    for refused in ["UPDATE", "INSERT outside the filter"] {
        assert!(
            v["refused"][refused].as_u64().unwrap_or(0) >= 3,
            "{refused}: {v}"
        );
    }
}

/// Fail closed: a table the policy does not name (registered by a pipeline, here with
/// PyIceberg's `register_table`, also in a nested namespace) never has its encrypted
/// columns decrypted, for any principal; its plaintext columns read; `policy check` lists
/// it.
#[test]
fn tables_the_policy_does_not_name_stay_encrypted() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = lake(tmp.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/register_table.py");
    let out = Command::new(python)
        .arg(script)
        .arg(lake.join("catalog.db"))
        .arg(lake.join("warehouse"))
        .args(["sales.customers", "sales.rogue", "deep.er.rogue"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "register_table: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A nested namespace is one schema named `deep.er`.
    for table in ["lake.sales.rogue", "lake.\"deep.er\".rogue"] {
        for user in ["admin", "analyst", "support"] {
            let out = sql(&lake, user, &format!("SELECT ssn FROM {table} LIMIT 1"));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{table} as {user}: ssn was read");
            assert!(
                err.contains("column 'ssn' is not decrypted in this scan")
                    && err.contains("master key 'pii_key' was not requested"),
                "{table} as {user}: {err}"
            );
            let ids = sql(&lake, user, &format!("SELECT count(id) AS n FROM {table}"));
            assert!(
                ids.status.success(),
                "{}",
                String::from_utf8_lossy(&ids.stderr)
            );
        }
    }
    let check = clearice(&lake, "admin")
        .args(["policy", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{text}");
    for table in ["lake.sales.rogue", "lake.deep.er.rogue"] {
        assert!(
            text.contains(&format!(
                "{table}: not named by the policy, but its columns"
            )),
            "{text}"
        );
    }
}
