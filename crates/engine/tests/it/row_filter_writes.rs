//! Writes under a row filter, over the demo lake (admin's filter: even ids): DELETE and
//! UPDATE change exactly the rows the filter shows, checked against every row of the
//! table as the unfiltered admin of the same lake reads it before and after; the
//! statement is never evaluated on a hidden row; an UPDATE may not set a column the filter
//! reads; every row an INSERT writes must pass the filter; the other writes stay refused;
//! a refused write leaves the table as it was; the write's audit record names the filter.

use std::path::Path;
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use serde_json::Value;

use crate::common::*;

const T: &str = "lake.sales.customers";

async fn open(config: &Path) -> Arc<Engine> {
    Arc::new(Engine::open(Config::load(config).unwrap()).await.unwrap())
}

/// Every row (id, name, country, ssn) as the unfiltered admin reads it.
async fn all_rows(oracle: &Engine) -> Vec<Vec<Value>> {
    let sql = format!("SELECT id, name, country, ssn FROM {T} ORDER BY id");
    json_rows(&query(&oracle.session("admin"), &sql).await.unwrap())
}

fn id(row: &[Value]) -> i64 {
    row[0].as_i64().unwrap()
}

fn visible(row: &[Value]) -> bool {
    id(row) % 2 == 0
}

/// Runs `sql` as the filtered admin; the count it reports.
async fn write(filtered: &Engine, sql: &str) -> i64 {
    let b = query(&filtered.session("admin"), sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    count(&b)
}

/// The one `count` a write reports.
pub(crate) fn count(b: &[datafusion::arrow::array::RecordBatch]) -> i64 {
    use datafusion::arrow::array::AsArray;
    let c = datafusion::arrow::compute::cast(
        b[0].column(0),
        &datafusion::arrow::datatypes::DataType::Int64,
    )
    .unwrap();
    c.as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_under_a_row_filter_change_only_the_rows_it_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let config = demo::init(&tmp.path().join("lake")).await.unwrap();
    let dir = config.parent().unwrap();
    let policy = std::fs::read_to_string(dir.join("policy.toml")).unwrap()
        + &format!("\n[tables.\"{T}\".row_filter]\n\"user:admin\" = \"id % 2 = 0\"\n");
    std::fs::write(dir.join("filtered.toml"), policy).unwrap();
    let filtered_config = dir.join("filtered-config.toml");
    std::fs::write(
        &filtered_config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("path = \"policy.toml\"", "path = \"filtered.toml\"")
            .replace("path = \"audit.jsonl\"", "path = \"filtered-audit.jsonl\""),
    )
    .unwrap();
    let (oracle, filtered) = (open(&config).await, open(&filtered_config).await);

    // DELETE: the visible French rows go, the hidden ones stay.
    let before = all_rows(&oracle).await;
    let n = write(&filtered, &format!("DELETE FROM {T} WHERE country = 'FR'")).await;
    let gone = |r: &Vec<Value>| visible(r) && r[2] == "FR";
    let want: Vec<_> = before.iter().filter(|r| !gone(r)).cloned().collect();
    assert_eq!(n as usize, before.len() - want.len());
    assert!(n > 0 && before.iter().any(|r| !visible(r) && r[2] == "FR"));
    assert_eq!(all_rows(&oracle).await, want);

    // UPDATE: the visible German rows renamed, the hidden ones as they were.
    let before = want;
    let n = write(
        &filtered,
        &format!("UPDATE {T} SET name = 'renamed' WHERE country = 'DE'"),
    )
    .await;
    let changed = |r: &Vec<Value>| visible(r) && r[2] == "DE";
    let want: Vec<_> = before
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if changed(&r) {
                r[1] = Value::from("renamed");
            }
            r
        })
        .collect();
    assert_eq!(n as usize, before.iter().filter(|r| changed(r)).count());
    assert_eq!(all_rows(&oracle).await, want);

    // A subquery over the table reads it under the filter too.
    let before = want;
    let n = write(
        &filtered,
        &format!(
            "UPDATE {T} SET name = 'sub' WHERE id IN (SELECT id + 1 FROM {T} WHERE country = 'US')"
        ),
    )
    .await;
    // Visible US ids are even, so id + 1 is odd: no visible row matches.
    assert_eq!(n, 0);
    assert_eq!(all_rows(&oracle).await, before);

    // An UPDATE of a column the filter reads, INSERT OVERWRITE, TRUNCATE, DROP and MERGE
    // are refused before any work.
    for (sql, says) in [
        (
            format!("UPDATE {T} SET id = id + 1 WHERE country = 'SE'"),
            "which the principal's row filter reads",
        ),
        (
            format!("INSERT OVERWRITE {T} SELECT * FROM {T}"),
            "only INSERT, UPDATE and DELETE are supported",
        ),
        (
            format!("TRUNCATE {T}"),
            "only INSERT, UPDATE and DELETE are supported",
        ),
        // Dropping the table would remove the hidden rows too.
        (
            format!("DROP TABLE {T}"),
            "reads the table under a row filter",
        ),
        (
            format!(
                "MERGE INTO {T} t USING (SELECT 2 AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE"
            ),
            "only INSERT, UPDATE and DELETE are supported",
        ),
    ] {
        let e = query_err(&filtered.session("admin"), &sql).await;
        assert!(e.contains(says), "{sql}: {e}");
    }
    assert_eq!(all_rows(&oracle).await, before);

    // INSERT: rows the filter shows go in; a statement with one it does not show fails
    // whole and leaves the table as it was.
    let n = write(
        &filtered,
        &format!("INSERT INTO {T} (id, name, country) VALUES (3000000, 'even', 'FR')"),
    )
    .await;
    assert_eq!(n, 1);
    let before = all_rows(&oracle).await;
    assert!(before.iter().any(|r| id(r) == 3000000));
    let e = query_err(
        &filtered.session("admin"),
        &format!("INSERT INTO {T} (id, name, country) VALUES (3000002, 'even', 'FR'), (3000003, 'odd', 'FR')"),
    )
    .await;
    assert!(
        e.contains("of a row its row filter does not show")
            && e.contains("row_filter of user:admin"),
        "{e}"
    );
    assert!(!e.contains("3000003") && !e.contains("odd"), "{e}");
    assert_eq!(all_rows(&oracle).await, before);

    // A condition that fails on a hidden row (id 1000001 is odd) does not fail: the
    // statement is evaluated on the visible rows only.
    let fails = format!("SELECT count(*) FROM {T} WHERE 100 / (id - 1000001) >= 0");
    assert!(
        query(&oracle.session("admin"), &fails).await.is_err(),
        "the fixture changed: no row 1000001"
    );
    let n = write(
        &filtered,
        &format!("DELETE FROM {T} WHERE 100 / (id - 1000001) >= 0"),
    )
    .await;
    // (id 1000000 is visible, and 100 / -1 < 0.)
    let matches = |r: &Vec<Value>| visible(r) && 100 / (id(r) - 1000001) >= 0;
    let want: Vec<_> = before.iter().filter(|r| !matches(r)).cloned().collect();
    assert_eq!(n as usize, before.len() - want.len());
    assert_eq!(all_rows(&oracle).await, want);

    // The writes' audit records name the filter.
    let audit = std::fs::read_to_string(dir.join("filtered-audit.jsonl")).unwrap();
    assert!(
        audit.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["action"] == "delete" && r["row_filter"] == "row_filter of user:admin: id % 2 = 0"
        }),
        "{audit}"
    );
}
