//! The policy differential fuzz test: random SELECTs run over ADBC against a real
//! `clearice serve` as each demo principal, and in DuckDB over views that apply that
//! principal's policy to the admin's plaintext (tests/python/differential_policy.py).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::{python, run_ok, start};

/// The row filters of the differential's policy.
const ROW_FILTERS: &str = r#"
[tables."lake.sales.customers".row_filter]
"user:admin" = "true"
analyst = "country = principal_attr('country') OR id % 4 = 0"
support = "id % 3 <> 1"

[tables."lake.sales.orders".row_filter]
"user:admin" = "true"
analyst = "status <> 'returned' AND customer_id % 2 = 0"
support = "amount < 5000"
"#;

/// Generated SELECTs (projections, filters, joins, aggregates, windows, ORDER BY + LIMIT,
/// subqueries, functions over masked columns, time travel) as admin, analyst and support
/// agree with DuckDB over the principal's masked views of the rows its row filter lets
/// through, or both refuse (a denied column
/// with a denial, a hidden one as not found); no plaintext of a column the principal
/// sees masked, hidden or denied reaches a result, an error or the principal's audit lines.
#[test]
fn policy_differential_matches_duckdb_and_leaks_nothing() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lake = tmp.path().join("lake");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .args(["demo", "init"])
            .arg(&lake),
    );
    // Row filters on both tables (admin's `true`: every row, no filter), one through the
    // analyst's attribute; the oracle applies them to DuckDB's views.
    let policy = lake.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let with_attribute = text.replace(
        "analyst = { roles = [\"analyst\"] }",
        "analyst = { roles = [\"analyst\"], attributes = { country = \"DE\" } }",
    );
    assert_ne!(with_attribute, text, "the demo policy's users changed");
    // The orders table hides what it denies (card_number, to the analyst): absent from
    // `SELECT *`, not found when named; the customers table still denies.
    let hiding = with_attribute.replace(
        "[tables.\"lake.sales.orders\"]\n",
        "[tables.\"lake.sales.orders\"]\nhide_inaccessible_columns = true\n",
    );
    assert_ne!(
        hiding, with_attribute,
        "the demo policy's orders table changed"
    );
    std::fs::write(&policy, hiding + ROW_FILTERS).unwrap();
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/differential_policy.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.addr)
        .arg(&lake)
        .args(["11,12,13", "110"])
        .output()
        .unwrap();
    drop(server);
    assert!(
        out.status.success(),
        "differential client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{v:#}");
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    assert_eq!(v["leaks"], serde_json::json!([]), "{v}");
    assert!(v["queries"].as_u64().unwrap() >= 300, "{v}");
    // Every principal's view of both tables was checked against the DuckDB mask forms.
    assert_eq!(v["mask_checks"], 6, "{v}");
    for p in ["admin", "analyst", "support"] {
        assert!(v["executed"][p].as_u64().unwrap() >= 50, "{p}: {v}");
        // The audit check saw this principal's lines.
        assert!(v["audit_lines"][p].as_u64().unwrap() >= 50, "{p}: {v}");
    }
    // The row filters bite: admin sees every row; analyst and support see some rows of each
    // table, not all, and the leak check looks for values of the rows kept from them.
    for t in ["customers", "orders"] {
        let all = v["all_rows"][t].as_u64().unwrap();
        assert_eq!(v["visible_rows"]["admin"][t].as_u64(), Some(all), "{v}");
        for p in ["analyst", "support"] {
            let n = v["visible_rows"][p][t].as_u64().unwrap();
            assert!(n > 0 && n < all, "{p} sees {n} of {all} rows of {t}: {v}");
        }
    }
    for p in ["analyst", "support"] {
        assert!(
            v["filtered_out_values"][p].as_u64().unwrap() > 1000,
            "{p}: {v}"
        );
    }
    // The restricted principals had queries refused for naming denied or hidden columns.
    for p in ["analyst", "support"] {
        assert!(v["refused"][p].as_u64().unwrap() >= 10, "{p}: {v}");
    }
}
