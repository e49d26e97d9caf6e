//! AWS KMS as ClearIce's KMS, against an AWS-compatible KMS endpoint on loopback
//! (`moto_server`, started here and stopped afterwards): PyArrow writes PME files whose
//! keys AWS KMS wraps; ClearIce reads them, rotates the side file's wrapping through the
//! KMS, and names the KMS when it is unreachable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{python, run_ok};

struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const AWS_ENV: [(&str, &str); 4] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
];

fn start_moto(python: &str) -> (Moto, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Path::new(python).with_file_name("moto_server");
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", server.display()));
    let moto = Moto(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "moto_server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (moto, format!("http://127.0.0.1:{port}"))
}

/// moto's KMS on loopback, and the fixture's keys and files (tests/python/aws_kms_fixture.py)
/// in a new directory: the server, its endpoint, the directory, the keys by name.
fn aws_fixture(python: &str) -> (Moto, String, tempfile::TempDir, Value) {
    let (moto, endpoint) = start_moto(python);
    let tmp = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new(python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/aws_kms_fixture.py"))
            .arg(&endpoint)
            .arg(tmp.path())
            .envs(AWS_ENV),
    );
    let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
    (moto, endpoint, tmp, keys)
}

fn clearice(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clearice"))
        .arg("--config")
        .arg(config)
        .args(["--user", "tester", "--format", "json", "-q"])
        .args(args)
        .envs(AWS_ENV)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn aws_kms_unwraps_pyarrow_keys_rotates_side_files_and_names_itself_when_down() {
    let Some(python) = python() else { return };
    let (moto, endpoint, tmp, keys) = aws_fixture(&python);
    let pii = keys["pii"].as_str().unwrap();
    let config = tmp.path().join("clearice.toml");
    std::fs::write(
        &config,
        format!("[kms]\ntype = \"aws\"\nendpoint = \"{endpoint}\"\n"),
    )
    .unwrap();
    let file: PathBuf = tmp.path().join("aws.parquet");
    let ext: PathBuf = tmp.path().join("ext/aws_ext.parquet");
    let query = |f: &Path| {
        format!(
            "SELECT count(*) AS n, min(ssn) AS lo, max(ssn) AS hi FROM '{}'",
            f.display()
        )
    };
    let expected = serde_json::json!([{"n": 1000, "lo": "000-00-0000", "hi": "999-00-0999"}]);
    for f in [&file, &ext] {
        let rows: Value =
            serde_json::from_str(&ok(&clearice(&config, &["-c", &query(f)]))).unwrap();
        assert_eq!(rows, expected, "{}", f.display());
    }

    // Rotation: the side file's records under the PII key are re-wrapped through the
    // KMS (Decrypt, then Encrypt with its current key material); data files untouched.
    let side = tmp
        .path()
        .join("ext/_KEY_MATERIAL_FOR_aws_ext.parquet.json");
    let before = std::fs::read_to_string(&side).unwrap();
    let data_before = std::fs::read(&ext).unwrap();
    let report = ok(&clearice(
        &config,
        &[
            "keys",
            "rotate",
            "--master-key",
            pii,
            tmp.path().join("ext").to_str().unwrap(),
        ],
    ));
    assert!(
        report.contains("re-wrapped 1 key(s) in 1 side file(s)"),
        "{report}"
    );
    let after = std::fs::read_to_string(&side).unwrap();
    let wrapped = |text: &str| -> Vec<String> {
        let map: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
        map.values()
            .map(|m| {
                let m: Value = serde_json::from_str(m.as_str().unwrap()).unwrap();
                format!("{}|{}", m["masterKeyID"], m["wrappedKEK"])
            })
            .collect()
    };
    let (old, new) = (wrapped(&before), wrapped(&after));
    let old_pii: Vec<_> = old.iter().filter(|w| w.contains(pii)).collect();
    assert_eq!(old_pii.len(), 1);
    assert!(!new.contains(old_pii[0]), "old wrapping still present");
    assert_eq!(std::fs::read(&ext).unwrap(), data_before);
    let rows: Value = serde_json::from_str(&ok(&clearice(&config, &["-c", &query(&ext)]))).unwrap();
    assert_eq!(rows, expected);

    // Unreachable KMS: one line naming the KMS and the endpoint, exit code 8.
    drop(moto);
    let out = clearice(&config, &["-c", &query(&file)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{err}");
    assert!(
        err.contains("KMS 'aws' call for master key") && err.contains(&endpoint),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// A table Iceberg encrypts itself under a table key AWS KMS holds: created, written
/// (INSERT, DELETE) and read back by separate processes, each unwrapping the table's key
/// encryption keys through the KMS endpoint; with the KMS gone, the table is not read.
#[test]
fn a_table_iceberg_encrypts_under_an_aws_kms_key_is_written_and_read_back() {
    let Some(python) = python() else { return };
    let (moto, endpoint, tmp, keys) = aws_fixture(&python);
    let key = keys["pii"].as_str().unwrap();
    let lake = tmp.path().join("lake");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .args(["demo", "init"])
            .arg(&lake),
    );
    // The demo lake with AWS KMS instead of its keyring, and a policy naming the table.
    let config = lake.join("clearice.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n",
        &format!("[kms]\ntype = \"aws\"\nendpoint = \"{endpoint}\"\n"),
    );
    assert!(text.contains("type = \"aws\""), "{text}");
    std::fs::write(&config, text).unwrap();
    let policy = lake.join("policy.toml");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    for c in ["id", "s"] {
        text.push_str(&format!(
            "\n[tables.\"lake.sales.aws_t\".columns.{c}]\naccess = {{ admin = \"plaintext\" }}\nwrite = [\"admin\"]\n"
        ));
    }
    std::fs::write(&policy, text).unwrap();
    let admin = |sql: &str| {
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .arg("--config")
            .arg(&config)
            .args(["--user", "admin", "--format", "json", "-q", "-c", sql])
            .envs(AWS_ENV)
            .output()
            .unwrap()
    };
    for sql in [
        format!(
            "CREATE TABLE lake.sales.aws_t (id BIGINT, s VARCHAR) WITH (\"encryption.key-id\" = '{key}')"
        ),
        "INSERT INTO lake.sales.aws_t VALUES (1, 'a'), (2, 'b'), (3, 'c')".to_owned(),
        "DELETE FROM lake.sales.aws_t WHERE id = 2".to_owned(),
    ] {
        ok(&admin(&sql));
    }
    let read = "SELECT id, s FROM lake.sales.aws_t ORDER BY id";
    let rows: Value = serde_json::from_str(&ok(&admin(read))).unwrap();
    assert_eq!(
        rows,
        serde_json::json!([{"id": 1, "s": "a"}, {"id": 3, "s": "c"}])
    );
    // The table's metadata names the AWS key and holds key encryption keys it wrapped.
    let metadata = std::fs::read_dir(lake.join("warehouse"))
        .unwrap()
        .flat_map(|ns| std::fs::read_dir(ns.unwrap().path()).unwrap())
        .map(|t| t.unwrap().path())
        .find(|t| t.to_string_lossy().contains("aws_t"))
        .unwrap();
    let newest = std::fs::read_dir(metadata.join("metadata"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".metadata.json"))
        .max()
        .unwrap();
    let md: Value = serde_json::from_str(&std::fs::read_to_string(newest).unwrap()).unwrap();
    assert_eq!(md["properties"]["encryption.key-id"], key);
    assert!(
        !md["encryption-keys"].as_array().unwrap().is_empty(),
        "{md}"
    );
    // Without the KMS: refused in one line, no rows.
    drop(moto);
    let out = admin(read);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("aws_t"), "{err}");
}
