//! Tables as Spark leaves them (written by `tests/python/spark_tables.py`: pyspark 4.1 with
//! Iceberg's Spark runtime; `scripts/test.sh` sets `CLEARICE_SPARK_LAKE`): ClearIce's rows
//! at every snapshot of every table equal Spark's own answers, with position deletes,
//! deletion vectors, equality deletes and PME-encrypted data and delete files. Time travel
//! by id, by timestamp and by ref; a query reads one snapshot while PyIceberg commits.

use std::path::PathBuf;

use serde_json::Value;

use crate::common::{engine, interop_dir, json_rows, python, query, query_err, run_python};

fn spark_lake() -> Option<PathBuf> {
    let p = std::env::var_os("CLEARICE_SPARK_LAKE").map(PathBuf::from);
    if p.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_SPARK_LAKE is not set (scripts/test.sh writes the Spark lake)"
        );
        eprintln!("\n*** SKIPPED: CLEARICE_SPARK_LAKE not set; run ./scripts/test.sh ***\n");
    }
    p
}

fn config(lake: &std::path::Path, keyring: &std::path::Path, audit: &std::path::Path) -> String {
    format!(
        "[catalogs.spark]\ntype = \"sql\"\nuri = \"sqlite://{l}/catalog.db\"\nwarehouse = \"file://{l}/warehouse\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{k}\"\n[audit]\npath = \"{a}\"\n",
        l = lake.display(),
        k = keyring.display(),
        a = audit.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snapshot_equals_sparks_answer() {
    let (Some(lake), Some(interop)) = (spark_lake(), interop_dir()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let engine = engine(
        dir.path(),
        &config(&lake, &interop.join("keyring.json"), &audit),
    )
    .await;
    let ctx = engine.session("admin");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(lake.join("expected.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    for (table, e) in expected.as_object().unwrap() {
        let snapshots = e["snapshots"].as_array().unwrap();
        for (i, s) in snapshots.iter().enumerate() {
            let id = s["snapshot_id"].as_i64().unwrap();
            let cols: Vec<String> = s["columns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| format!("\"{}\"", c.as_str().unwrap()))
                .collect();
            let sql = format!(
                "SELECT {} FROM spark.db.{table} FOR VERSION AS OF {id} ORDER BY id",
                cols.join(", ")
            );
            let got = json_rows(&query(&ctx, &sql).await.unwrap());
            let want: Vec<Vec<Value>> = serde_json::from_value(s["rows"].clone()).unwrap();
            assert_eq!(
                got.len(),
                want.len(),
                "{table} at snapshot {i} ({id}): row count"
            );
            assert_eq!(got, want, "{table} at snapshot {i} ({id})");
            // Spark's syntax, by the commit time: the snapshot current then (the last one
            // committed in that millisecond).
            let ms = s["committed_at_ms"].as_i64().unwrap();
            let at = snapshots
                .iter()
                .rposition(|o| o["committed_at_ms"].as_i64().unwrap() <= ms)
                .unwrap();
            let ts = chrono::DateTime::from_timestamp_millis(ms)
                .unwrap()
                .format("%Y-%m-%d %H:%M:%S%.3f");
            let n = json_rows(
                &query(
                    &ctx,
                    &format!("SELECT count(*) FROM spark.db.{table} TIMESTAMP AS OF '{ts}'"),
                )
                .await
                .unwrap(),
            );
            assert_eq!(
                n[0][0].as_i64().unwrap() as usize,
                snapshots[at]["rows"].as_array().unwrap().len(),
                "{table} as of {ts}"
            );
            checked += 1;
        }
        // The current snapshot without time travel is the last one.
        let last = snapshots.last().unwrap();
        let n = json_rows(
            &query(&ctx, &format!("SELECT count(*) FROM spark.db.{table}"))
                .await
                .unwrap(),
        );
        assert_eq!(
            n[0][0].as_i64().unwrap() as usize,
            last["rows"].as_array().unwrap().len(),
            "{table} now"
        );
    }
    assert!(checked >= 20, "only {checked} snapshots checked");
    // Refs as Spark reads them.
    for (r, n) in expected["mor"]["ref_counts"].as_object().unwrap() {
        let got = json_rows(
            &query(
                &ctx,
                &format!("SELECT count(*) FROM spark.db.mor FOR VERSION AS OF '{r}'"),
            )
            .await
            .unwrap(),
        );
        assert_eq!(got[0][0], *n, "ref {r}");
    }
    // Delete files of each kind were really there (the fixture did what it says).
    let kinds = json_rows(
        &query(
            &ctx,
            "SELECT DISTINCT content, file_format FROM spark.db.\"dv$files\" ORDER BY content",
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        kinds,
        vec![
            vec![Value::from(0), "PARQUET".into()],
            vec![Value::from(1), "PUFFIN".into()]
        ]
    );
    // The audit record names the snapshot the query read.
    let old = expected["mor"]["snapshots"][1]["snapshot_id"]
        .as_i64()
        .unwrap();
    query(
        &ctx,
        &format!("SELECT count(*) FROM spark.db.mor FOR VERSION AS OF {old}"),
    )
    .await
    .unwrap();
    let text = std::fs::read_to_string(&audit).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["table"], "spark.db.mor");
    assert_eq!(last["snapshot_id"], old, "{last}");
    // Unknown snapshots fail in one line naming the table.
    let e = query_err(&ctx, "SELECT * FROM spark.db.eq FOR VERSION AS OF 7").await;
    assert!(
        e.contains("table 'spark.db.eq': no snapshot 7 (snapshots: "),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// A query reads the snapshot it was planned on from start to end, while PyIceberg
/// commits appends to the same table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reads_one_snapshot_while_pyiceberg_appends() {
    use futures::StreamExt;
    let Some(py) = python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let d = lake.display().to_string();
    let created = run_python(&py, "consistency.py", &["create", &d]);
    assert_eq!(created["rows"], 40_000);
    let toml = format!(
        "[catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{d}/catalog.db\"\nwarehouse = \"file://{d}/warehouse\"\n"
    );
    let engine = engine(dir.path(), &toml).await;
    let ctx = engine.session("admin");
    // Small batches: the stream is read while the writer commits.
    query(&ctx, "SET datafusion.execution.batch_size = 1000")
        .await
        .unwrap();
    let mut stream = ctx
        .sql_stream("SELECT id FROM lake.db.events")
        .await
        .unwrap();
    let mut rows = 0;
    let mut appended = false;
    while let Some(b) = stream.next().await {
        rows += b.unwrap().num_rows();
        if !appended {
            // Two commits while the query is running (PyIceberg, another process).
            let r = run_python(&py, "consistency.py", &["append", &d, "2"]);
            assert_eq!(r["rows"], 60_000);
            appended = true;
        }
    }
    assert!(appended);
    assert_eq!(
        rows, 40_000,
        "the running query saw rows of a later snapshot"
    );
    // The next query sees the new snapshot.
    let n = json_rows(
        &query(&ctx, "SELECT count(*) FROM lake.db.events")
            .await
            .unwrap(),
    );
    assert_eq!(n[0][0], 60_000);
    // A self-join in one statement reads one snapshot on both sides.
    let n = json_rows(
        &query(
            &ctx,
            "SELECT count(*) FROM lake.db.events a JOIN lake.db.events b ON a.id = b.id",
        )
        .await
        .unwrap(),
    );
    assert_eq!(n[0][0], 60_000);
}
