//! The clearice:// SQLAlchemy dialect on its own (writes, reflection, every time grain of the
//! Superset engine spec, the URL's refusals), and Apache Superset 6.1 itself against a real
//! `clearice serve`, through the repository's
//! SQLAlchemy dialect and engine spec (integrations/clearice-sqlalchemy): two database
//! connections (admin, analyst), catalog/schema/table browsing, physical datasets and their
//! samples, SQL Lab, time-grain charts through the REST API compared with the aggregation
//! computed from the raw rows, and SQL Lab driven in headless Chromium with a screenshot.
//! Superset's metadata lives in the test's PostgreSQL (CLEARICE_PG_URI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{demo_lake, run_ok, start};

/// What the test needs from scripts/test.sh: Superset's Python, PostgreSQL, Chromium.
fn fixtures() -> Option<(String, String)> {
    let python = std::env::var("CLEARICE_SUPERSET_PYTHON").ok();
    let pg = std::env::var("CLEARICE_PG_URI").ok();
    let exists = |var: &str, default: &str| {
        Path::new(&std::env::var(var).unwrap_or_else(|_| default.into())).exists()
    };
    let chromium = exists("CLEARICE_CHROMIUM", "/usr/bin/chromium")
        && exists("CLEARICE_CHROMEDRIVER", "/usr/bin/chromedriver");
    match (python, pg, chromium) {
        (Some(python), Some(pg), true) => Some((python, pg)),
        missing => {
            assert!(
                std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
                "Superset fixtures missing (python, PostgreSQL, Chromium): {missing:?}"
            );
            None
        }
    }
}

/// `{"2025-01-01": [total, count]}` of a chart, totals as exact cents.
fn months(v: &Value) -> BTreeMap<String, (Option<i64>, i64)> {
    let cents = |t: &Value| -> Option<i64> {
        match t {
            Value::Null => None,
            Value::String(s) => Some(decimal_cents(s)),
            // Superset returns SUM(DECIMAL) as a JSON number: exact to the cent below 2^53
            Value::Number(n) => Some((n.as_f64().unwrap() * 100.0).round() as i64),
            other => panic!("total {other}"),
        }
    };
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, r)| (k.clone(), (cents(&r[0]), r[1].as_i64().unwrap())))
        .collect()
}

/// "-12.3" -> -1230 (the oracle's sums are exact decimals with at most two places).
fn decimal_cents(s: &str) -> i64 {
    let (sign, digits) = s.strip_prefix('-').map_or((1, s), |d| (-1, d));
    let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
    assert!(frac.len() <= 2, "{s}");
    let frac = format!("{frac:0<2}");
    sign * (int.parse::<i64>().unwrap() * 100 + frac.parse::<i64>().unwrap())
}

#[test]
fn superset_serves_physical_datasets_sql_lab_and_time_grain_charts_under_the_policy() {
    let Some((python, pg)) = fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lake = demo_lake(tmp.path());
    // Superset lists a table's columns and reads them all for samples: the analyst's
    // denied card_number is hidden rather than failing the dataset.
    let policy = lake.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(text.contains("on_missing_key = \"error\"\n"));
    std::fs::write(
        &policy,
        text.replace(
            "on_missing_key = \"error\"\n",
            "on_missing_key = \"error\"\nhide_inaccessible_columns = true\n",
        ),
    )
    .unwrap();
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let work = tmp.path().join("superset");
    std::fs::create_dir(&work).unwrap();
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/superset_e2e.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(&server.addr)
        .arg(&work)
        .arg(&pg)
        .output()
        .unwrap();
    let log = std::fs::read_to_string(work.join("superset.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "Superset run failed: {}\n--- superset.log (end) ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        &log[log.len().saturating_sub(6000)..]
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();

    for user in ["admin", "analyst"] {
        let u = &v[user];
        assert_eq!(u["backend"], "clearice", "{user}");
        assert_eq!(u["catalogs"], serde_json::json!(["lake"]), "{user}");
        assert!(
            u["schemas"]
                .as_array()
                .unwrap()
                .contains(&Value::from("sales")),
            "{user}: {}",
            u["schemas"]
        );
        assert_eq!(
            u["tables"],
            serde_json::json!(["customers", "orders"]),
            "{user}"
        );
        // physical datasets: typed columns, dates temporal
        let orders = &u["orders_columns"];
        assert_eq!(
            orders["amount"]["type"], "DECIMAL(12, 2)",
            "{user}: {orders}"
        );
        assert_eq!(orders["order_date"]["type"], "DATE");
        assert_eq!(orders["order_date"]["is_dttm"], true);
        assert_eq!(orders["order_id"]["type"], "BIGINT");
        assert_eq!(u["customers_columns"]["birth_date"]["is_dttm"], true);
        assert_eq!(u["orders_samples"]["rows"], 1000, "{user}");
        assert_eq!(u["customers_samples"]["rows"], 1000, "{user}");
        assert_eq!(u["sqllab_types"]["balance"], "DECIMAL(12, 2)", "{user}");
        assert_eq!(u["sqllab_three_part"], serde_json::json!([{"n": 200000}]));
        assert_eq!(u["sqllab"][0]["id"], 1000001);
        // Superset's SQL: DataFusion's date_trunc, the range as DATE literals
        let q = u["chart_range_query"].as_str().unwrap();
        assert!(
            q.contains("date_trunc('month', order_date)")
                && q.contains("order_date >= DATE '2025-01-01'")
                && q.contains("order_date < DATE '2025-03-01'"),
            "{q}"
        );
        // the chart equals the aggregation of the raw rows, month by month
        let chart = months(&u["chart"]);
        let oracle = months(&u["oracle"]);
        assert_eq!(chart, oracle, "{user}");
        assert!(chart.len() >= 2, "{user}: {chart:?}");
        let range = months(&u["chart_range"]);
        let expected: BTreeMap<_, _> = oracle
            .into_iter()
            .filter(|(m, _)| m.as_str() >= "2025-01-01" && m.as_str() < "2025-03-01")
            .collect();
        assert_eq!(range, expected, "{user}");
        assert!(!range.is_empty());
        let png = std::fs::read(u["ui"]["screenshot"].as_str().unwrap()).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
            "{user}: screenshot of {} bytes",
            png.len()
        );
    }
    let (admin, analyst) = (&v["admin"], &v["analyst"]);
    // the policy, through Superset: plaintext for admin, masks for the analyst
    assert_eq!(admin["sqllab"][0]["ssn"], "609-11-1603");
    assert_eq!(analyst["sqllab"][0]["ssn"], "XXX-XX-1603");
    assert_eq!(analyst["sqllab"][0]["email"], v["email_sha256"]);
    assert_ne!(admin["sqllab"][0]["email"], analyst["sqllab"][0]["email"]);
    // balance is plaintext for both
    assert_eq!(
        admin["sqllab"][0]["balance"],
        analyst["sqllab"][0]["balance"]
    );
    // hidden for the analyst: card_number (denied) and phone (hide) are not columns
    assert!(admin["orders_columns"].get("card_number").is_some());
    assert!(analyst["orders_columns"].get("card_number").is_none());
    assert!(analyst["customers_columns"].get("phone").is_none());
    let samples = |u: &Value| u["orders_samples"]["columns"].clone();
    assert!(
        samples(admin)
            .as_array()
            .unwrap()
            .contains(&"card_number".into())
    );
    assert!(
        !samples(analyst)
            .as_array()
            .unwrap()
            .contains(&"card_number".into())
    );
    assert_eq!(admin["card_number"], "read");
    let refused = analyst["card_number"].to_string();
    assert!(refused.contains("No field named card_number"), "{refused}");
    // SQL Lab in the browser shows each principal's value and not the other's
    let page = |u: &Value| u["ui"]["page"].as_str().unwrap().to_owned();
    assert!(page(admin).contains("609-11-1603") && !page(admin).contains("XXX-XX-1603"));
    assert!(page(analyst).contains("XXX-XX-1603") && !page(analyst).contains("609-11-1603"));
    // a mask in a chart: birth_date truncated to the year leaves January only
    assert_eq!(analyst["birth_months"], serde_json::json!(["01"]));
    assert!(admin["birth_months"].as_array().unwrap().len() > 1);
    // amounts are plaintext for the analyst: the same chart
    assert_eq!(months(&admin["chart"]), months(&analyst["chart"]));
}

#[test]
fn the_clearice_dialect_writes_reflects_and_buckets_time_as_expected() {
    let Some((python, _)) = fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lake = demo_lake(tmp.path());
    let server = start(
        &lake.join("clearice.toml"),
        &["serve"],
        &tmp.path().join("addr"),
    );
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/clearice_dialect_client.py");
    let out = run_ok(Command::new(&python).arg(script).arg(&server.addr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // every time grain of the engine spec, run by ClearIce, against the bucket computed in
    // Python (on a TIMESTAMP, and on a DATE for the day-and-longer grains)
    let grains = v["grains"].as_object().unwrap();
    assert_eq!(grains.len(), 21, "{grains:?}");
    for (grain, r) in grains {
        assert_eq!(r["got"], r["expected"], "grain {grain}");
    }
    assert_eq!(v["executemany_rowcount"], 2);
    assert_eq!(v["insert_rowcount"], 2);
    assert_eq!(v["count_query"], serde_json::json!([[4]]));
    assert_eq!(
        v["reflected"],
        serde_json::json!({"id": "BIGINT", "name": "VARCHAR", "at": "TIMESTAMP"})
    );
    assert_eq!(v["core_rows"], serde_json::json!([[2, "b"], [11, "a"]]));
    assert_eq!(v["tables"], serde_json::json!(["t"]));
    assert_eq!(v["tables_after_drop"], serde_json::json!([]));
    assert_eq!(v["analyst_ssn"], "XXX-XX-1603");
    assert_eq!(v["analyst_default_catalog"], "lake");
    let refusal = |k: &str| v["refusals"][k].as_str().unwrap().to_owned();
    assert!(
        refusal("token").contains("Secure Extra"),
        "{}",
        refusal("token")
    );
    assert!(refusal("unknown").contains("unknown parameter(s) tsl"));
    assert!(refusal("skip_verify_without_tls").contains("need tls=true"));
    assert!(refusal("no_user").contains("give a user and password"));
    assert!(refusal("ca_not_a_file").contains("not a PEM file of at most 1 MiB"));
    assert!(refusal("bad_password").contains("invalid user name or password"));
    assert!(!out.stdout.windows(6).any(|w| w == b"secret"));
    // inside Superset: Secure Extra's token joins the Root certificate; no files, no
    // unverified TLS through connect_args
    assert_eq!(
        v["superset"]["merged"],
        serde_json::json!({"connect_args": {"tls_root_certs_pem": "PEM", "token": "tok"}})
    );
    for key in ["tls_root_certs", "tls_skip_verify"] {
        let refused = v["superset"][key].as_str().unwrap();
        assert!(
            refused.contains("cannot be set in Superset"),
            "{key}: {refused}"
        );
    }
}
