//! Files written by ClearIce read back with PyArrow's own PME implementation
//! (Arrow C++ key tools) and the keyring KMS: same rows and values as ClearIce reads.

use std::path::Path;
use std::process::Command;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use serde_json::Value;

use crate::common::*;

#[tokio::test]
async fn pyarrow_reads_files_written_by_clearice() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = demo::init(&dir).await.unwrap();
    let engine = Engine::open(Config::load(&config).unwrap()).await.unwrap();
    let ctx = engine.session("admin");
    let data = dir.join("warehouse/sales/customers/data");
    let mut files: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_back.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(dir.join("keyring.json"))
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PyArrow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got.len(), files.len());
    for (f, py) in files.iter().zip(&got) {
        let sql = format!(
            "SELECT count(*), CAST(sum(balance) AS VARCHAR), count(ssn), first_value(ssn ORDER BY id), \
             first_value(email ORDER BY id) FROM '{}'",
            f.display()
        );
        let ours = json_rows(&query(&ctx, &sql).await.unwrap()).remove(0);
        assert_eq!(py["rows"], ours[0], "{}", f.display());
        assert_eq!(py["sum_balance"], ours[1], "{}", f.display());
        assert_eq!(py["count_ssn"], ours[2], "{}", f.display());
        assert_eq!(py["first_ssn"], ours[3], "{}", f.display());
        assert_eq!(py["first_email"], ours[4], "{}", f.display());
        let ids: Vec<String> = serde_json::from_value(py["field_ids"].clone()).unwrap();
        assert_eq!(
            &ids[..4],
            ["1", "2", "3", "4"],
            "Iceberg field ids in {}",
            f.display()
        );
    }
}
