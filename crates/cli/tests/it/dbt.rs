//! dbt-core with the `dbt-clearice` adapter (integrations/dbt-clearice) against a real
//! `clearice serve`, as a `pipeline` principal: seeds, a table model, incremental `merge`
//! and `append` models run twice, generic tests, `dbt docs generate`, and models the policy
//! refuses; what it built is read back with PyIceberg + PyArrow and the gold table compared
//! with DuckDB computing it from the plaintext.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{demo_lake, python, run_ok, start};

/// What the pipeline principal may do on the demo lake: read as the analyst, create
/// schemas and tables, copy the sales tables' protected columns it reads in plaintext; the
/// tables the project builds protect them again.
const PIPELINE_POLICY: &str = r#"
[tables."lake.dbt_silver.stg_customers"]
footer_key = "footer_key"

[tables."lake.dbt_silver.stg_customers".columns.balance]
master_key = "finance_key"
write = ["user:pipeline"]
access = { admin = "plaintext", analyst = "plaintext" }

[tables."lake.dbt_gold.customer_orders"]
footer_key = "footer_key"

[tables."lake.dbt_gold.customer_orders".columns.total]
master_key = "finance_key"
write = ["user:pipeline"]
access = { admin = "plaintext", analyst = "plaintext" }
"#;

fn project() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integrations/dbt-clearice/tests/project")
}

/// `dbt ARGS` on the project with the test's profile; its output (stdout + stderr).
fn dbt(exe: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out: Output = Command::new(exe)
        .args(args)
        .arg("--project-dir")
        .arg(project())
        .arg("--profiles-dir")
        .arg(dir)
        .env("DBT_TARGET_PATH", dir.join("target"))
        .env("DBT_LOG_PATH", dir.join("logs"))
        .env("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_dbt_project_builds_encrypted_tables_under_the_policy() {
    let Some(python) = python() else { return };
    let Some(exe) = std::env::var_os("CLEARICE_DBT").map(PathBuf::from) else {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_DBT (dbt with dbt-clearice, set by scripts/test.sh) is not set"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lake = demo_lake(tmp.path());
    let policy = lake.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    assert_eq!(text.matches("export = [\"admin\"]").count(), 2);
    let text = text
        .replace(
            "support = { roles = [\"support\"] }",
            "support = { roles = [\"support\"] }\npipeline = { roles = [\"analyst\"] }",
        )
        .replace(
            "create = [\"admin\"]",
            "create = [\"admin\", \"user:pipeline\"]",
        )
        .replace(
            "export = [\"admin\"]",
            "export = [\"admin\", \"user:pipeline\"]",
        );
    std::fs::write(&policy, format!("{text}{PIPELINE_POLICY}")).unwrap();
    let config = lake.join("clearice.toml");
    let users = clearice_demo::server_users(&["pipeline"]).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}{users}")).unwrap();
    let server = start(&config, &["serve"], &tmp.path().join("addr"));
    let (host, port) = server.addr.rsplit_once(':').unwrap();
    std::fs::write(
        tmp.path().join("profiles.yml"),
        format!(
            "clearice:\n  target: pipeline\n  outputs:\n    pipeline:\n      type: clearice\n      host: {host}\n      port: {port}\n      user: pipeline\n      password: pipeline\n      catalog: lake\n      schema: dbt\n      threads: 2\n"
        ),
    )
    .unwrap();
    let dir = tmp.path();
    let ok = |args: &[&str]| {
        let (ok, out) = dbt(&exe, dir, args);
        assert!(ok, "dbt {args:?} failed:\n{out}");
        out
    };
    ok(&["debug"]);
    ok(&["seed"]);
    ok(&["run", "--vars", "{max_id: 1000200, run: 1}"]);
    ok(&["snapshot", "--vars", "{run: 1}"]);
    // The second run merges into the gold table (rows updated and added) and appends; the
    // snapshot closes every tier of run 1 and opens run 2's, and a third changes nothing.
    ok(&["run", "--vars", "{max_id: 1000400, run: 2}"]);
    ok(&["snapshot", "--vars", "{run: 2}"]);
    ok(&["snapshot", "--vars", "{run: 2}"]);
    // A table model whose query now fails leaves the table it built before.
    let (broke, out) = dbt(
        &exe,
        dir,
        &[
            "run",
            "--select",
            "stg_customers",
            "--vars",
            "{break: true}",
        ],
    );
    assert!(!broke && out.contains("no_such_column"), "{out}");
    let tested = ok(&["test"]);
    assert!(tested.contains("PASS=6"), "{tested}");
    ok(&["docs", "generate"]);
    let catalog: Value =
        serde_json::from_slice(&std::fs::read(dir.join("target/catalog.json")).unwrap()).unwrap();
    let columns = &catalog["nodes"]["model.clearice_demo.customer_orders"]["columns"];
    for c in ["id", "region", "orders", "total"] {
        assert!(
            columns.get(c).is_some(),
            "docs catalog lacks {c}: {columns}"
        );
    }

    // What the policy refuses fails the model in one line naming the column; a view model
    // fails saying views are not supported.
    let (ok_refused, out) = dbt(
        &exe,
        dir,
        &["run", "--select", "refused", "--vars", "{refused: true}"],
    );
    assert!(!ok_refused, "{out}");
    assert!(
        out.contains("access denied: column 'card_number' of table 'lake.sales.orders' is denied to principal 'pipeline'"),
        "{out}"
    );
    assert!(
        out.contains("column 'ssn' of table 'lake.sales.customers' is masked for this principal"),
        "{out}"
    );
    assert!(
        out.contains("materialized='view' is not supported"),
        "{out}"
    );

    // Read back with PyIceberg + PyArrow; the gold table against DuckDB.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_dbt.py");
    let read = run_ok(
        Command::new(python)
            .arg(script)
            .arg(lake.join("catalog.db"))
            .arg(lake.join("warehouse"))
            .arg(lake.join("keyring.json"))
            .arg(project().join("seeds/regions.csv"))
            .arg("1000400"),
    );
    let v: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(
        v["tables"],
        serde_json::json!({"dbt_ref": ["regions"], "dbt_silver": ["stg_customers"], "dbt_gold": ["customer_orders", "order_log", "order_total"], "dbt_snap": ["customer_tiers"]}),
        "refused models left no table, the snapshot's staging table was dropped"
    );
    // Type-2 history: per customer, tier 1 closed when tier 2 opened, tier 2 current.
    let history = v["dbt_snap.customer_tiers"].as_array().unwrap();
    assert_eq!(history.len(), 20, "{history:?}");
    for pair in history.chunks(2) {
        let (old, new) = (&pair[0], &pair[1]);
        assert_eq!(old["id"], new["id"], "{pair:?}");
        assert_eq!(
            (old["tier"].as_i64(), new["tier"].as_i64()),
            (Some(1), Some(2))
        );
        assert!(!old["dbt_valid_to"].is_null(), "{pair:?}");
        assert_eq!(old["dbt_valid_to"], new["dbt_valid_from"], "{pair:?}");
        assert!(new["dbt_valid_to"].is_null(), "{pair:?}");
        assert_ne!(old["dbt_scd_id"], new["dbt_scd_id"]);
    }
    let gold = v["gold"].as_array().unwrap();
    assert!(gold.len() > 300, "{}", gold.len());
    assert_eq!(
        v["gold"], v["expected"],
        "gold table != DuckDB over the plaintext"
    );
    let mut runs: Vec<i64> = v["dbt_gold.order_log"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_i64().unwrap())
        .collect();
    runs.sort_unstable();
    assert_eq!(runs, [1, 2], "appended twice");
    assert_eq!(
        v["dbt_gold.order_total"]["rows"],
        serde_json::json!([{"orders": 200000, "run": 2}]),
        "overwritten"
    );
    assert_eq!(v["dbt_ref.regions"]["rows"].as_array().unwrap().len(), 21);
    assert_eq!(
        v["dbt_silver.stg_customers"]["rows"]
            .as_array()
            .unwrap()
            .len(),
        100_000,
        "the failed run kept the table"
    );
    // Protected columns are encrypted by the policy: no key, no read (the seed is plain).
    for t in ["dbt_gold.customer_orders", "dbt_silver.stg_customers"] {
        let without: Vec<&Value> = v[t]["without_keys"].as_array().unwrap().iter().collect();
        assert!(
            !without.is_empty() && without.iter().all(|r| *r != "read"),
            "{t}: {without:?}"
        );
    }
    assert!(
        v["dbt_ref.regions"]["without_keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r == "read")
    );
}
