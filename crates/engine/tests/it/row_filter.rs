//! Row filters over the demo lake: each principal sees exactly the rows its rule grants,
//! whatever the statement (counts, groups, joins, EXISTS, windows, a predicate that would
//! fail on a hidden row, time travel), checked against the same statement over the
//! filtered rows as admin sees them without a filter; nothing outside the filter shows in
//! EXPLAIN ANALYZE or metadata tables; ALTER under a filter is refused; audited.

use std::path::Path;
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use datafusion::arrow::util::pretty::pretty_format_batches;
use serde_json::Value;

use crate::common::*;

const FILTERS: &str = "\n[tables.\"lake.sales.customers\".row_filter]\n\
    analyst = \"\\\"country\\\" = principal_attr('country')\"\n\
    \"user:admin\" = \"id % 2 = 0\"\n";

async fn open(config: &Path) -> Arc<Engine> {
    Arc::new(Engine::open(Config::load(config).unwrap()).await.unwrap())
}

/// The demo lake twice: under the demo policy (the oracle) and with row filters (the
/// analyst's attribute country = FR; admin: even ids; support: no rule, so no rows).
async fn lakes(tmp: &Path) -> (Arc<Engine>, Arc<Engine>) {
    let config = demo::init(&tmp.join("lake")).await.unwrap();
    let dir = config.parent().unwrap();
    let policy = std::fs::read_to_string(dir.join("policy.toml")).unwrap();
    let filtered = policy.replace(
        "analyst = { roles = [\"analyst\"] }",
        "analyst = { roles = [\"analyst\"], attributes = { country = \"FR\" } }",
    ) + FILTERS;
    assert_ne!(filtered, policy.clone() + FILTERS, "attributes not set");
    std::fs::write(dir.join("filtered.toml"), filtered).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let filtered_config = dir.join("filtered-config.toml");
    std::fs::write(
        &filtered_config,
        text.replace("path = \"policy.toml\"", "path = \"filtered.toml\"")
            .replace("path = \"audit.jsonl\"", "path = \"filtered-audit.jsonl\""),
    )
    .unwrap();
    (open(&config).await, open(&filtered_config).await)
}

async fn rows(engine: &Engine, principal: &str, sql: &str) -> Result<Vec<Vec<Value>>, String> {
    match query(&engine.session(principal), sql).await {
        Ok(b) => Ok(json_rows(&b)),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_sees_exactly_the_rows_its_filter_grants() {
    let tmp = tempfile::tempdir().unwrap();
    let (oracle, filtered) = lakes(tmp.path()).await;
    // Statements over `{t}`: as the filtered principal over the table, and as the
    // oracle's admin over the rows the filter keeps.
    let statements = [
        "SELECT count(*) FROM {t}",
        "SELECT country, count(*), sum(id) FROM {t} GROUP BY country ORDER BY country",
        "SELECT id, name FROM {t} ORDER BY id LIMIT 5",
        "SELECT count(*) FROM lake.sales.orders o JOIN {t} c ON o.customer_id = c.id",
        "SELECT EXISTS (SELECT 1 FROM {t} WHERE country = 'DE')",
        "SELECT CAST(max(n) AS BIGINT) FROM (SELECT row_number() OVER (ORDER BY id) AS n FROM {t})",
        "SELECT min(id), max(id) FROM {t} WHERE id IN (SELECT id FROM {t} WHERE id % 3 = 0)",
    ];
    for (principal, kept) in [
        ("analyst", "country = 'FR'"),
        ("admin", "id % 2 = 0"),
        ("support", "false"),
    ] {
        for s in statements {
            let got = rows(
                &filtered,
                principal,
                &s.replace("{t}", "lake.sales.customers"),
            )
            .await;
            let oracle_table = format!("(SELECT * FROM lake.sales.customers WHERE {kept})");
            let want = rows(&oracle, "admin", &s.replace("{t}", &oracle_table)).await;
            // The analyst's own columns are masked the same way on both sides only for
            // the columns these statements read in plaintext (id, country, balance, name).
            assert_eq!(got, want, "{principal}: {s}");
        }
    }
    // A predicate that fails on a hidden row does not fail: the analyst sees no DE row
    // (DataFusion merges the predicates of a plain subquery, so the oracle cannot say).
    let divide = "SELECT count(*) FROM lake.sales.customers WHERE 1 / (CASE WHEN country = 'DE' THEN 0 ELSE 1 END) = 1";
    assert!(
        rows(&oracle, "admin", divide).await.is_err(),
        "the oracle has DE rows"
    );
    assert!(rows(&filtered, "analyst", divide).await.is_ok());
    // Time travel is filtered too.
    let snapshot = rows(
        &oracle,
        "admin",
        "SELECT snapshot_id FROM lake.sales.\"customers$snapshots\" ORDER BY committed_at LIMIT 1",
    )
    .await
    .unwrap()[0][0]
        .clone();
    let travelled = rows(
        &filtered,
        "analyst",
        &format!("SELECT DISTINCT country FROM lake.sales.customers FOR VERSION AS OF {snapshot}"),
    )
    .await
    .unwrap();
    assert_eq!(travelled, vec![vec![Value::from("FR")]]);

    // EXPLAIN names the filter; EXPLAIN ANALYZE counts only the rows it keeps.
    let analyst = filtered.session("analyst");
    let plan = pretty_format_batches(
        &query(
            &analyst,
            "EXPLAIN SELECT count(*) FROM lake.sales.customers",
        )
        .await
        .unwrap(),
    )
    .unwrap()
    .to_string();
    assert!(
        plan.contains("RowFilterExec: row_filter of role analyst: \"country\" = 'FR'"),
        "{plan}"
    );
    let fr = rows(
        &oracle,
        "admin",
        "SELECT count(*) FROM lake.sales.customers WHERE country = 'FR'",
    )
    .await
    .unwrap()[0][0]
        .as_i64()
        .unwrap();
    let total = rows(
        &oracle,
        "admin",
        "SELECT count(*) FROM lake.sales.customers",
    )
    .await
    .unwrap()[0][0]
        .as_i64()
        .unwrap();
    assert!(fr > 0 && fr < total);
    let analyzed = pretty_format_batches(
        &query(
            &analyst,
            "EXPLAIN ANALYZE SELECT count(*) FROM lake.sales.customers",
        )
        .await
        .unwrap(),
    )
    .unwrap()
    .to_string();
    let counts: Vec<i64> = analyzed
        .split("output_rows=")
        .skip(1)
        .map(|s| {
            s.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(!counts.is_empty(), "{analyzed}");
    assert!(
        counts.iter().all(|n| *n <= fr),
        "{counts:?} vs {fr}: {analyzed}"
    );
    assert!(!analyzed.contains(&total.to_string()), "{analyzed}");

    // Metadata tables count rows outside the filter: denied, in one line.
    let err = query_err(
        &analyst,
        "SELECT sum(record_count) FROM lake.sales.\"customers$files\"",
    )
    .await;
    assert!(
        err.contains("metadata tables count rows outside the row_filter of role analyst")
            && err.contains("lake.sales.customers"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // A write under a row filter changes only rows it shows (`row_filter_writes.rs`):
    // admin's filter hides odd ids.
    let deleted = query(
        &filtered.session("admin"),
        "DELETE FROM lake.sales.customers WHERE id = 1000001",
    )
    .await
    .unwrap();
    assert_eq!(crate::row_filter_writes::count(&deleted), 0);
    assert_eq!(
        rows(
            &oracle,
            "admin",
            "SELECT count(*) FROM lake.sales.customers"
        )
        .await
        .unwrap()[0][0],
        Value::from(total)
    );

    let err = query_err(
        &filtered.session("admin"),
        "ALTER TABLE lake.sales.customers RENAME COLUMN name TO name2",
    )
    .await;
    assert!(err.contains("row filter"), "{err}");

    // Audited with the rule.
    let audit = std::fs::read_to_string(tmp.path().join("lake/filtered-audit.jsonl")).unwrap();
    assert!(
        audit.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["user"] == "analyst"
                && r["row_filter"] == "row_filter of role analyst: \"country\" = 'FR'"
        }),
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_a_row_filter_reads_are_neither_renamed_nor_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, filtered) = lakes(tmp.path()).await;
    let dir = tmp.path().join("lake");
    // admin reads every row: it may change the table, but not the filter's columns.
    let text = std::fs::read_to_string(dir.join("filtered.toml"))
        .unwrap()
        .replace("id % 2 = 0", "true");
    std::fs::write(dir.join("filtered.toml"), text).unwrap();
    let engine = open(&dir.join("filtered-config.toml")).await;
    let admin = engine.session("admin");
    for sql in [
        "ALTER TABLE lake.sales.customers RENAME COLUMN country TO country_x",
        "ALTER TABLE lake.sales.customers RENAME COLUMN name TO country",
        "ALTER TABLE lake.sales.customers DROP COLUMN country",
    ] {
        let err = query_err(&admin, sql).await;
        assert!(
            err.contains("country") && err.contains("lake.sales.customers"),
            "{sql}: {err}"
        );
    }
    let n = json_rows(
        &query(
            &admin,
            "SELECT count(*) FROM lake.sales.customers WHERE country IS NOT NULL",
        )
        .await
        .unwrap(),
    );
    assert!(n[0][0].as_i64().unwrap() > 0);
    drop(filtered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_filter_that_does_not_parse_denies_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, filtered) = lakes(tmp.path()).await;
    let dir = tmp.path().join("lake");
    let original = std::fs::read_to_string(dir.join("filtered.toml")).unwrap();
    for (bad, named) in [
        ("no_such_column = 1", "no_such_column"),
        // Text after a whole predicate is an error, not ignored.
        ("id % 2 = 0 AMD NOT id = 3", "does not parse"),
        ("id % 2 = 0, id = 3", "does not parse"),
    ] {
        std::fs::write(
            dir.join("filtered.toml"),
            original.replace("id % 2 = 0", bad),
        )
        .unwrap();
        let engine = open(&dir.join("filtered-config.toml")).await;
        let err = query_err(
            &engine.session("admin"),
            "SELECT count(*) FROM lake.sales.customers",
        )
        .await;
        assert!(
            err.contains("row_filter of user:admin") && err.contains(named),
            "{bad}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    drop(filtered);
}
