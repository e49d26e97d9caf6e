//! The TPC-H benchmark (`benches/tpch/run.py`) at scale factor 0.01, with the debug
//! binaries `cargo test --workspace` built: ClearIce over the PME-encrypted Iceberg tables
//! (in process and through its CLI), over their plaintext twins, and bare DataFusion must
//! each return DuckDB's answer to all 22 queries, in the queries' order; so must ClearIce as
//! the coordinator of three `clearice worker` processes over mutual TLS, and as `analyst`
//! (masked columns) the cluster must answer as one process does. The harness exits non-zero
//! on any difference; timings are not checked.

use std::path::Path;
use std::process::Command;

#[test]
fn every_engine_answers_the_22_tpch_queries_as_duckdb_does() {
    let Some(python) = std::env::var_os("CLEARICE_PYTHON") else {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_PYTHON is not set"
        );
        eprintln!("\n*** SKIPPED: CLEARICE_PYTHON not set; run ./scripts/test.sh ***\n");
        return;
    };
    let compare = Path::new(env!("CARGO_BIN_EXE_compare"));
    let bin_dir = compare.parent().expect("binary directory");
    assert!(
        bin_dir.join("clearice").exists(),
        "{} has no `clearice` binary: run `cargo test --workspace`",
        bin_dir.display()
    );
    let work = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tpch/run.py");
    let out = Command::new(python)
        .arg(&script)
        .args(["--sf", "0.01", "--runs", "1", "--cluster", "3", "--bin-dir"])
        .arg(bin_dir)
        .arg("--work")
        .arg(work.path().join("data"))
        .output()
        .expect("run the harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "harness failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // One row per query and the totals, for every engine.
    for q in 1..=22 {
        assert!(
            stdout.contains(&format!("| q{q} |")),
            "no q{q} in:\n{stdout}"
        );
    }
    for needle in [
        "ClearIce enc",
        "ClearIce plain",
        "ClearIce CLI enc",
        "DataFusion plain",
        "DuckDB plain",
        "ClearIce 3 workers enc",
        "| **total** |",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in:\n{stdout}");
    }
}
