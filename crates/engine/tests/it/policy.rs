//! Column policy end to end, through the engine: the decision matrix over the demo lake
//! (written by ClearIce), page pruning, missing keys, audit records, EXPLAIN and standalone
//! files. The policy provider's own tests (the matrix over the PyArrow lake, which keys a
//! scan asks for) are `clearice-access`'s.

use std::path::PathBuf;
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::Engine;
use datafusion::arrow::array::RecordBatch;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::*;

/// A lake to test on: its config text (without [policy]) and column names by type.
struct Lake {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: String,
    table: &'static str,
}

async fn demo_lake() -> Lake {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = demo::init(&dir).await.unwrap();
    let text = std::fs::read_to_string(config).unwrap();
    let config = text[..text.find("[policy]").unwrap()].replace(
        "path = \"keyring.json\"",
        &format!("path = \"{}\"", dir.join("keyring.json").display()),
    );
    Lake {
        dir: tmp.path().to_owned(),
        _tmp: tmp,
        config,
        table: "lake.sales.customers",
    }
}

async fn open_with_policy(lake: &Lake, policy: &str, name: &str) -> Arc<Engine> {
    let dir = lake.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.toml"), policy).unwrap();
    let config = format!(
        "{}\n[policy]\npath = \"policy.toml\"\n[audit]\npath = \"audit.jsonl\"\n",
        lake.config
    );
    engine(&dir, &config).await
}

/// An engine session, as the matrix runs it.
struct Principal(clearice_engine::Session);

impl matrix::Principal for Principal {
    async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        query(&self.0, sql).await.map_err(|e| e.to_string())
    }
}

impl matrix::Lake for Lake {
    type Session = Principal;
    async fn open(&self, policy: &str, name: &str) -> (Principal, Principal) {
        let engine = open_with_policy(self, policy, name).await;
        (
            Principal(engine.session("ua")),
            Principal(engine.session("ub")),
        )
    }
}

/// The matrix over the lake ClearIce wrote (over the PyArrow lake: clearice-access's tests).
#[tokio::test]
async fn decision_matrix_over_the_demo_lake() {
    let lake = demo_lake().await;
    matrix::run_matrix(&lake, lake.table).await;
}

use matrix::NULL_PII;

#[tokio::test]
async fn selective_queries_prune_pages_of_encrypted_files_without_other_keys() {
    let lake = demo_lake().await;
    let engine = open_with_policy(&lake, NULL_PII, "pages").await;
    let r = engine.key_resolver();
    let a = engine.session("ua");
    let rows = json_rows(
        &query(
            &a,
            "SELECT id, count(balance) FROM lake.sales.customers WHERE id = 1012345 GROUP BY id",
        )
        .await
        .unwrap(),
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], Value::from(1_012_345));
    let plan = query(
        &a,
        "EXPLAIN ANALYZE SELECT id, balance FROM lake.sales.customers WHERE id = 1012345",
    )
    .await
    .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    // The page index of the encrypted file prunes pages: `page_index_rows_pruned=N total
    // -> M matched` with M < N.
    let metric = text
        .split("page_index_rows_pruned=")
        .nth(1)
        .unwrap_or_else(|| panic!("no page index pruning: {text}"));
    let numbers: Vec<f64> = metric
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(numbers.len() == 2 && numbers[1] < numbers[0], "{metric}");
    assert!(
        text.contains("crypto_chunks_decrypted") || text.contains("crypto_page_ranges_decrypted"),
        "{text}"
    );
    // ...while the key of the columns it does not read is never requested.
    assert_eq!(r.kms_unwrap_count_for("pii_key"), 0);
}

const BOUND: &str = r#"
[roles]
admin = {}
[users]
root = { roles = ["admin"] }
[tables."lake.sales.bound"]
footer_key = "footer_key"
aad_prefix = "lake.sales.bound"
[tables."lake.sales.bound".columns.k]
master_key = "pii_key"
access = { admin = "plaintext" }
"#;

#[tokio::test]
async fn a_table_policy_aad_prefix_binds_files_to_their_table() {
    use iceberg::spec::{NestedField, PrimitiveType, Type};
    let lake = demo_lake().await;
    let engine = open_with_policy(&lake, BOUND, "bound").await;
    // ClearIce writes the table under the policy: the prefix is in every AAD, not stored.
    let catalog = engine.iceberg_catalog("lake").unwrap();
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "k", Type::Primitive(PrimitiveType::Long)).into(),
        ])
        .build()
        .unwrap();
    let table = catalog
        .create_table(
            &iceberg::NamespaceIdent::new("sales".into()),
            iceberg::TableCreation::builder()
                .name("bound".into())
                .schema(schema)
                .build(),
        )
        .await
        .unwrap();
    let batch = RecordBatch::try_new(
        Arc::new(
            iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
        ),
        vec![Arc::new(datafusion::arrow::array::Int64Array::from(vec![
            7, 8, 9,
        ]))],
    )
    .unwrap();
    let policy = clearice_policy::Policy::parse(BOUND, "bound").unwrap();
    let spec = clearice_access::encryption_spec(policy.table("lake.sales.bound").unwrap());
    assert!(spec.aad_prefix.is_some());
    clearice_iceberg::write::append_encrypted(
        catalog.as_ref(),
        &table,
        &[batch],
        &spec,
        Arc::clone(engine.key_resolver().kms().unwrap()),
    )
    .await
    .unwrap();
    // (table listings refresh when older than a second)
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let sum = "SELECT sum(k) FROM lake.sales.bound";
    let rows = json_rows(&query(&engine.session("root"), sum).await.unwrap());
    assert_eq!(rows, vec![vec![Value::from(24)]]);
    // Without the prefix in the policy: one line naming the file and what to supply.
    let without = BOUND.replace("aad_prefix = \"lake.sales.bound\"\n", "");
    let engine2 = open_with_policy(&lake, &without, "unbound").await;
    let e = query_err(&engine2.session("root"), sum).await;
    assert!(e.contains("AAD prefix") && e.contains(".parquet"), "{e}");
    // Another table's prefix (the file moved between tables): authentication fails.
    let other = BOUND.replace(
        "aad_prefix = \"lake.sales.bound\"",
        "aad_prefix = \"lake.sales.other\"",
    );
    let engine3 = open_with_policy(&lake, &other, "other").await;
    let e = query_err(&engine3.session("root"), sum).await;
    assert!(
        e.contains("footer") && e.contains("authentication failed"),
        "{e}"
    );
}

async fn missing_key_engine(lake: &Lake, on_missing: &str, name: &str) -> Arc<Engine> {
    let dir = lake.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    // a keyring without pii_key
    let src = lake.dir.join("lake/keyring.json");
    let mut k: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(src).unwrap()).unwrap();
    k.remove("pii_key").unwrap();
    std::fs::write(dir.join("keyring.json"), serde_json::to_vec(&k).unwrap()).unwrap();
    let policy = format!(
        "on_missing_key = \"{on_missing}\"\n{}",
        NULL_PII.replace(
            "access = { a = \"null\", admin = \"plaintext\" }",
            "access = { a = \"show_last_4\", admin = \"plaintext\" }"
        )
    );
    std::fs::write(dir.join("policy.toml"), policy).unwrap();
    let config = lake.config.replace(
        &lake.dir.join("lake/keyring.json").display().to_string(),
        &dir.join("keyring.json").display().to_string(),
    );
    assert_ne!(config, lake.config);
    engine(
        &dir,
        &format!("{config}\n[policy]\npath = \"policy.toml\"\n"),
    )
    .await
}

#[tokio::test]
async fn missing_key_follows_on_missing_key() {
    let lake = demo_lake().await;
    for (mode, expect) in [
        ("error", "error"),
        ("null", "null"),
        ("fixed", "fixed"),
        ("hide", "hide"),
    ] {
        let engine = missing_key_engine(&lake, mode, mode).await;
        let a = engine.session("ua");
        // queries not touching ssn work, with and without predicates on other columns
        let sql = "SELECT count(*), sum(balance) FROM lake.sales.customers WHERE country = 'DE' AND balance > 0";
        let rows = json_rows(
            &query(&a, sql)
                .await
                .unwrap_or_else(|e| panic!("{mode}: {e}")),
        );
        let admin = json_rows(&query(&engine.session("root"), sql).await.unwrap());
        assert_eq!(rows, admin, "{mode}");
        assert!(rows[0][0].as_i64().unwrap() > 1000, "{mode}");
        query(
            &a,
            "SELECT id, name FROM lake.sales.customers WHERE id > 1099990",
        )
        .await
        .unwrap();
        let r = query(
            &a,
            "SELECT id, ssn FROM lake.sales.customers WHERE id = 1000001",
        )
        .await;
        match expect {
            "error" => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("'pii_key'"), "{e}");
            }
            "null" => assert_eq!(
                json_rows(&r.unwrap()),
                vec![vec![Value::from(1_000_001), Value::Null]]
            ),
            "fixed" => assert_eq!(
                json_rows(&r.unwrap()),
                vec![vec![Value::from(1_000_001), Value::from("****")]]
            ),
            "hide" => assert!(r.unwrap_err().to_string().contains("No field named ssn")),
            _ => unreachable!(),
        }
    }
}

#[tokio::test]
async fn audit_records_allowed_masked_and_denied_queries() {
    let lake = demo_lake().await;
    let engine = open_with_policy(&lake, NULL_PII, "audit").await;
    let audit_path = lake.dir.join("audit/audit.jsonl");
    let a = engine.session_for("ua", "10.1.2.3:5555");
    let out = a
        .sql("SELECT id, ssn, balance FROM lake.sales.customers WHERE id < 1000003")
        .await
        .unwrap();
    assert_eq!(out.rows(), 3);
    let e = a
        .sql("SELECT phone FROM lake.sales.customers")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("No field named phone"), "{e}");
    let deny = engine.session_for("mallory", "repl");
    assert!(
        deny.sql("SELECT id FROM lake.sales.customers")
            .await
            .is_err()
    );
    let root = engine.session_for("root", "cli");
    root.sql("SELECT ssn FROM lake.sales.customers LIMIT 2")
        .await
        .unwrap();

    let lines: Vec<Value> = std::fs::read_to_string(&audit_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let masked = &lines[0];
    assert_eq!(masked["user"], "ua");
    assert_eq!(masked["client"], "10.1.2.3:5555");
    assert_eq!(masked["table"], "lake.sales.customers");
    assert_eq!(masked["allowed"], true);
    assert_eq!(masked["rows"], 3);
    assert_eq!(masked["error"], Value::Null);
    assert_eq!(
        masked["sql_sha256"],
        hex::encode(Sha256::digest(
            b"SELECT id, ssn, balance FROM lake.sales.customers WHERE id < 1000003"
        ))
    );
    assert!(masked["time"].as_str().unwrap().ends_with('Z'));
    let cols = masked["columns"].as_array().unwrap();
    let ssn = cols.iter().find(|c| c["name"] == "ssn").unwrap();
    assert_eq!(
        (
            ssn["decision"].as_str(),
            ssn["rule"].as_str(),
            ssn["decrypted"].as_bool()
        ),
        (Some("null"), Some("role:a"), Some(false))
    );
    let bal = cols.iter().find(|c| c["name"] == "balance").unwrap();
    assert_eq!(
        (bal["decision"].as_str(), bal["decrypted"].as_bool()),
        (Some("plaintext"), Some(true))
    );
    let denied = &lines[1];
    assert_eq!(
        (denied["user"].as_str(), denied["allowed"].as_bool()),
        (Some("mallory"), Some(false))
    );
    assert!(denied["error"].as_str().unwrap().contains("not a user"));
    assert_eq!(denied["rows"], Value::Null);
    let plain = &lines[2];
    assert_eq!(
        (
            plain["user"].as_str(),
            plain["client"].as_str(),
            plain["rows"].as_u64()
        ),
        (Some("root"), Some("cli"), Some(2))
    );
    assert_eq!(plain["columns"][0]["decision"], "plaintext");
    // never values or key material
    let all = std::fs::read_to_string(&audit_path).unwrap();
    assert!(!all.contains("609-11-1603") && !all.contains("@example.com"));
    let keyring = std::fs::read_to_string(lake.dir.join("lake/keyring.json")).unwrap();
    let keys: serde_json::Map<String, Value> = serde_json::from_str(&keyring).unwrap();
    for k in keys.values() {
        assert!(!all.contains(k.as_str().unwrap()));
    }
}

#[tokio::test]
async fn denied_query_is_audited_before_the_error_returns() {
    let lake = demo_lake().await;
    let policy = NULL_PII.replace(
        "access = { a = \"plaintext\", admin = \"plaintext\" }",
        "access = { a = \"deny\", admin = \"plaintext\" }",
    );
    let engine = open_with_policy(&lake, &policy, "deny-audit").await;
    let e = engine
        .session("ua")
        .sql("SELECT sum(balance) FROM lake.sales.customers")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column 'balance'") && e.contains("'ua'") && e.contains("role:a"),
        "{e}"
    );
    let log = std::fs::read_to_string(lake.dir.join("deny-audit/audit.jsonl")).unwrap();
    let rec: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(rec["allowed"], false);
    assert_eq!(rec["columns"][0]["name"], "balance");
    assert_eq!(rec["columns"][0]["decision"], "deny");
    assert_eq!(
        engine.key_resolver().kms_unwrap_count(),
        0,
        "denied before any IO"
    );
}

#[tokio::test]
async fn explain_shows_masks_and_keeps_masked_filters_above_the_scan() {
    let lake = demo_lake().await;
    let policy = NULL_PII.replace(
        "access = { a = \"null\", admin = \"plaintext\" }",
        "access = { a = \"show_last_4\", admin = \"plaintext\" }",
    );
    let engine = open_with_policy(&lake, &policy, "explain").await;
    let a = engine.session("ua");
    let plan = json_rows(
        &query(&a, "EXPLAIN SELECT id, ssn, email FROM lake.sales.customers WHERE ssn = '609-11-1603' AND balance > 5 AND id > 3")
            .await
            .unwrap(),
    );
    let physical = plan.iter().find(|r| r[0] == "physical_plan").unwrap()[1]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        physical.contains("PolicyMaskExec: principal=ua, columns=[id=plaintext (decrypted), email=fixed (not read), ssn=show_last_4 (decrypted), balance=plaintext (decrypted)]")
            || physical.contains("PolicyMaskExec: principal=ua"),
        "{physical}"
    );
    assert!(
        physical.contains("email=fixed (not read)")
            && physical.contains("ssn=show_last_4 (decrypted)"),
        "{physical}"
    );
    let (above, below) = physical.split_once("PolicyMaskExec").unwrap();
    assert!(
        above.contains("ssn@") && above.contains("609-11-1603"),
        "masked filter stays above: {physical}"
    );
    assert!(
        !below.contains("ssn@") || !below.contains("609-11-1603"),
        "no masked predicate in the scan: {physical}"
    );
    assert!(!below.contains("609-11-1603"), "{physical}");
    assert!(
        below.contains("balance@") || below.contains("id@"),
        "plaintext filters reach the scan: {physical}"
    );
    let keyring = std::fs::read_to_string(lake.dir.join("lake/keyring.json")).unwrap();
    let keys: serde_json::Map<String, Value> = serde_json::from_str(&keyring).unwrap();
    let all = format!("{plan:?}");
    for k in keys.values() {
        assert!(
            !all.contains(k.as_str().unwrap()),
            "key material in EXPLAIN"
        );
    }
}

#[tokio::test]
async fn standalone_files_decrypt_only_for_principals_the_policy_allows() {
    let lake = demo_lake().await;
    let policy = format!("{NULL_PII}\n[files]\ndecrypt = [\"admin\"]\n");
    let engine = open_with_policy(&lake, &policy, "files").await;
    let data = lake.dir.join("lake/warehouse/sales/customers/data");
    let f = std::fs::read_dir(&data)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let sql = format!("SELECT ssn FROM '{}' LIMIT 1", f.display());
    let e = query_err(&engine.session("ua"), &sql).await;
    assert!(
        e.contains("may not decrypt files outside the catalog"),
        "{e}"
    );
    let ok = query(&engine.session("root"), &sql).await.unwrap();
    assert_eq!(ok[0].num_rows(), 1);
}

#[tokio::test]
async fn invalid_policy_stops_startup_with_file_and_line() {
    let lake = demo_lake().await;
    let dir = lake.dir.join("bad");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        NULL_PII.replace("a = \"fixed\"", "a = \"blur\""),
    )
    .unwrap();
    std::fs::write(
        dir.join("c.toml"),
        format!("{}\n[policy]\npath = \"policy.toml\"\n", lake.config),
    )
    .unwrap();
    let e = Engine::open(clearice_engine::Config::load(&dir.join("c.toml")).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.toml' line 13") && e.contains("'blur' is not a decision"),
        "{e}"
    );
}

/// Queries running at once in one session each get their own audit records: their own
/// table, columns and row count (accesses are collected per query, not per session).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_queries_in_one_session_are_audited_separately() {
    let lake = demo_lake().await;
    let engine = open_with_policy(&lake, NULL_PII, "concurrent").await;
    let session = Arc::new(engine.session_for("root", "embedded"));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = Arc::clone(&session);
        tasks.push(tokio::spawn(async move {
            let sql = if i % 2 == 0 {
                "SELECT id, ssn FROM lake.sales.customers LIMIT 3"
            } else {
                "SELECT order_id FROM lake.sales.orders LIMIT 5"
            };
            s.sql(sql).await.unwrap().rows()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let lines: Vec<Value> = std::fs::read_to_string(lake.dir.join("concurrent/audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8, "{lines:#?}");
    let mut ids = std::collections::BTreeSet::new();
    for l in &lines {
        assert!(
            ids.insert(l["query_id"].as_str().unwrap().to_owned()),
            "{l}"
        );
        let columns: Vec<&str> = l["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        match l["table"].as_str().unwrap() {
            "lake.sales.customers" => {
                assert_eq!((l["rows"].as_u64(), columns), (Some(3), vec!["id", "ssn"]));
            }
            "lake.sales.orders" => {
                assert_eq!((l["rows"].as_u64(), columns), (Some(5), vec!["order_id"]));
            }
            other => panic!("unexpected table {other}"),
        }
    }
}

/// Plans carry the data files' statistics (DataFusion's, from the footers) for the columns
/// a principal reads in plaintext, and none for the others: a masked column's bounds are
/// not in `EXPLAIN` with statistics shown, nor in any other node.
#[tokio::test]
async fn plans_carry_statistics_of_plaintext_columns_only() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = demo_engine(tmp.path()).await;
    let explain = |principal: &'static str, sql: &'static str| {
        let session = engine.session(principal);
        async move {
            query(&session, "SET datafusion.explain.show_statistics = true")
                .await
                .unwrap();
            datafusion::arrow::util::pretty::pretty_format_batches(
                &query(&session, sql).await.unwrap(),
            )
            .unwrap()
            .to_string()
        }
    };
    // The analyst reads `id` in plaintext and `birth_date` truncated to the year.
    let plain = explain("analyst", "EXPLAIN SELECT id FROM lake.sales.customers").await;
    assert!(plain.contains("Min=Inexact(Int"), "{plain}");
    let masked = explain(
        "analyst",
        "EXPLAIN SELECT birth_date FROM lake.sales.customers",
    )
    .await;
    assert!(masked.contains("DataSourceExec"), "{masked}");
    assert!(!masked.contains("Date32("), "{masked}");
    assert!(
        !masked.contains("Min=Exact") && !masked.contains("Min=Inexact"),
        "{masked}"
    );
    // Encrypted and masked (show_last_4): no bounds either.
    let ssn = explain("analyst", "EXPLAIN SELECT ssn FROM lake.sales.customers").await;
    assert!(
        !ssn.contains("Min=Exact") && !ssn.contains("Min=Inexact"),
        "{ssn}"
    );
}
