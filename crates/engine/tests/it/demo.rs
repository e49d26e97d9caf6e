//! Demo lakes written by ClearIce: encrypted files, no plaintext bounds in manifests,
//! partition pruning, schema evolution by field id, clear errors on damaged files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use iceberg::spec::{ManifestList, PrimitiveType, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{NamespaceIdent, TableIdent};
use serde_json::Value;

use crate::common::*;

async fn demo_engine() -> (tempfile::TempDir, Arc<Engine>, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = demo::init(&dir).await.unwrap();
    let engine = Arc::new(Engine::open(Config::load(&config).unwrap()).await.unwrap());
    (tmp, engine, dir)
}

fn data_files(dir: &Path, table: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("warehouse/sales").join(table).join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn demo_lake_reads_decrypted_and_files_hold_no_plaintext() {
    let (_tmp, engine, dir) = demo_engine().await;
    let ctx = engine.session("admin");
    let n = json_rows(
        &query(
            &ctx,
            "SELECT count(*), count(DISTINCT id) FROM lake.sales.customers",
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        n,
        vec![vec![
            Value::from(demo::CUSTOMERS as i64),
            Value::from(demo::CUSTOMERS as i64)
        ]]
    );
    let rows = json_rows(&query(&ctx, "SELECT ssn, email FROM lake.sales.customers WHERE ssn IS NOT NULL AND email IS NOT NULL LIMIT 20").await.unwrap());
    assert_eq!(rows.len(), 20);
    for r in &rows {
        let ssn = r[0].as_str().unwrap();
        assert!(ssn.len() == 11 && ssn.as_bytes()[3] == b'-', "{ssn}");
        assert!(r[1].as_str().unwrap().ends_with("@example.com"));
    }
    // The plaintext of encrypted columns is not in the files.
    let files = data_files(&dir, "customers");
    assert_eq!(files.len(), 4);
    let ssn = rows[0][0].as_str().unwrap().as_bytes().to_vec();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert_eq!(
            &bytes[bytes.len() - 4..],
            b"PARE",
            "{} has an encrypted footer",
            f.display()
        );
        assert!(
            !bytes.windows(ssn.len()).any(|w| w == ssn.as_slice()),
            "plaintext ssn in {}",
            f.display()
        );
        assert!(
            !bytes.windows(12).any(|w| w == b"@example.com"),
            "plaintext email in {}",
            f.display()
        );
    }
    let sum = json_rows(
        &query(&ctx, "SELECT count(*) FROM lake.sales.orders")
            .await
            .unwrap(),
    );
    assert_eq!(sum, vec![vec![Value::from(demo::ORDERS as i64)]]);
}

#[tokio::test]
async fn manifests_carry_bounds_for_plaintext_columns_only() {
    let (_tmp, engine, _dir) = demo_engine().await;
    let catalog = engine.iceberg_catalog("lake").unwrap();
    for (table, encrypted, key) in [
        ("customers", vec!["ssn", "email", "phone", "balance"], "id"),
        ("orders", vec!["amount", "card_number"], "order_id"),
    ] {
        let t = catalog
            .load_table(&TableIdent::new(
                NamespaceIdent::new("sales".into()),
                table.into(),
            ))
            .await
            .unwrap();
        let schema = t.metadata().current_schema();
        let ids: Vec<i32> = encrypted
            .iter()
            .map(|c| schema.field_by_name(c).unwrap().id)
            .collect();
        let id_field = schema.field_by_name(key).unwrap().id;
        let snap = t.metadata().current_snapshot().unwrap();
        let bytes = t
            .file_io()
            .new_input(snap.manifest_list())
            .unwrap()
            .read()
            .await
            .unwrap();
        let list = ManifestList::parse_with_version(&bytes, t.metadata().format_version()).unwrap();
        let mut files = 0;
        for mf in list.entries() {
            let m = mf.load_manifest(t.file_io()).await.unwrap();
            for e in m.entries() {
                files += 1;
                // plaintext columns have bounds (file pruning), with their counts
                let f = e.data_file();
                assert!(
                    f.lower_bounds().contains_key(&id_field)
                        && f.upper_bounds().contains_key(&id_field)
                        && f.lower_bounds()[&id_field] <= f.upper_bounds()[&id_field],
                    "{table}: no bounds for {key}"
                );
                assert_eq!(f.value_counts()[&id_field], f.record_count());
                for id in &ids {
                    assert!(
                        !f.value_counts().contains_key(id)
                            && !f.null_value_counts().contains_key(id),
                        "{table}: counts for encrypted field {id}"
                    );
                }
                for id in &ids {
                    assert!(
                        !e.data_file().lower_bounds().contains_key(id),
                        "{table}: lower bound for field {id}"
                    );
                    assert!(
                        !e.data_file().upper_bounds().contains_key(id),
                        "{table}: upper bound for field {id}"
                    );
                }
            }
        }
        assert!(files > 0);
    }
}

#[tokio::test]
async fn day_partition_filter_prunes_files() {
    let (_tmp, engine, dir) = demo_engine().await;
    assert_eq!(data_files(&dir, "orders").len(), 60);
    let ctx = engine.session("admin");
    let plan = json_rows(
        &query(
            &ctx,
            "EXPLAIN SELECT count(*) FROM lake.sales.orders WHERE order_date = DATE '2025-01-05'",
        )
        .await
        .unwrap(),
    );
    let text = format!("{plan:?}");
    assert_eq!(text.matches(".parquet").count(), 1, "{text}");
    let all = json_rows(
        &query(
            &ctx,
            "EXPLAIN SELECT count(*) FROM lake.sales.orders WHERE amount > 5",
        )
        .await
        .unwrap(),
    );
    assert!(
        format!("{all:?}").contains("file_groups={2 groups")
            || format!("{all:?}").contains("groups"),
        "{all:?}"
    );
    let by_day = json_rows(
        &query(
            &ctx,
            "SELECT count(*) FROM lake.sales.orders WHERE order_date = DATE '2025-01-05'",
        )
        .await
        .unwrap(),
    );
    let direct = json_rows(
        &query(&ctx, "SELECT sum(CASE WHEN order_date = DATE '2025-01-05' THEN 1 ELSE 0 END) FROM lake.sales.orders").await.unwrap(),
    );
    assert_eq!(by_day, direct);
}

#[tokio::test]
async fn point_lookup_on_a_plaintext_column_reads_one_file() {
    let (_tmp, engine, dir) = demo_engine().await;
    assert_eq!(data_files(&dir, "customers").len(), 4);
    for user in ["admin", "analyst"] {
        let ctx = engine.session(user);
        let sql = "SELECT id, name FROM lake.sales.customers WHERE id = 1000001";
        let plan = format!(
            "{:?}",
            json_rows(&query(&ctx, &format!("EXPLAIN {sql}")).await.unwrap())
        );
        assert_eq!(plan.matches(".parquet").count(), 1, "{user}: {plan}");
        let rows = json_rows(&query(&ctx, sql).await.unwrap());
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0][0], Value::from(1000001));
    }
    // a filter on an encrypted column never prunes on bounds (there are none): all files
    let ctx = engine.session("admin");
    let plan = format!(
        "{:?}",
        json_rows(
            &query(
                &ctx,
                "EXPLAIN SELECT id FROM lake.sales.customers WHERE ssn = '609-11-1603'"
            )
            .await
            .unwrap()
        )
    );
    assert_eq!(plan.matches(".parquet").count(), 4, "{plan}");
}

#[tokio::test]
async fn tables_created_or_dropped_by_other_writers_show_up_without_a_restart() {
    let (_tmp, engine, _dir) = demo_engine().await;
    let session = engine.session("admin");
    let names = |out: &clearice_engine::QueryOutput| format!("{:?}", json_rows(&out.batches));
    let before = session.sql("SHOW TABLES").await.unwrap();
    assert!(!names(&before).contains("late_arrival"));
    // another writer (here: the same SQLite catalog through its own handle) adds a table
    let catalog = engine.iceberg_catalog("lake").unwrap();
    let ns = NamespaceIdent::new("sales".into());
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            iceberg::spec::NestedField::required(1, "k", Type::Primitive(PrimitiveType::Long))
                .into(),
        ])
        .build()
        .unwrap();
    let table = catalog
        .create_table(
            &ns,
            iceberg::TableCreation::builder()
                .name("late_arrival".into())
                .schema(schema)
                .build(),
        )
        .await
        .unwrap();
    let batch = datafusion::arrow::array::RecordBatch::try_new(
        Arc::new(
            iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
        ),
        vec![Arc::new(datafusion::arrow::array::Int64Array::from(vec![
            7, 8, 9,
        ]))],
    )
    .unwrap();
    clearice_iceberg::write::append_encrypted(
        catalog.as_ref(),
        &table,
        &[batch],
        &clearice_iceberg::write::EncryptionSpec::default(),
        Arc::clone(engine.key_resolver().kms().unwrap()),
    )
    .await
    .unwrap();
    tokio::time::sleep(clearice_engine::CATALOG_LISTING_MAX_AGE).await;
    let sum = session
        .sql("SELECT sum(k) FROM lake.sales.late_arrival")
        .await
        .unwrap();
    assert_eq!(json_rows(&sum.batches), vec![vec![Value::from(24)]]);
    assert!(names(&session.sql("SHOW TABLES").await.unwrap()).contains("late_arrival"));
    // and a dropped table disappears
    catalog
        .drop_table(&TableIdent::new(ns, "late_arrival".into()))
        .await
        .unwrap();
    tokio::time::sleep(clearice_engine::CATALOG_LISTING_MAX_AGE).await;
    let e = session
        .sql("SELECT * FROM lake.sales.late_arrival")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not found"), "{e}");
}

#[tokio::test]
async fn columns_resolve_by_field_id_after_schema_changes() {
    let (_tmp, engine, dir) = demo_engine().await;
    let catalog = Arc::clone(engine.iceberg_catalog("lake").unwrap());
    let ident = TableIdent::new(NamespaceIdent::new("sales".into()), "customers".into());
    let t = catalog.load_table(&ident).await.unwrap();
    let tx = Transaction::new(&t);
    let tx = tx
        .update_schema()
        .delete_column("country")
        .add_column(iceberg::transaction::AddColumn::optional(
            "loyalty",
            Type::Primitive(PrimitiveType::Int),
        ))
        .apply(tx)
        .unwrap();
    tx.commit(catalog.as_ref()).await.unwrap();
    let t = catalog.load_table(&ident).await.unwrap();
    let tx = Transaction::new(&t);
    let tx = tx
        .update_schema()
        .add_column(iceberg::transaction::AddColumn::optional(
            "country",
            Type::Primitive(PrimitiveType::String),
        ))
        .apply(tx)
        .unwrap();
    tx.commit(catalog.as_ref()).await.unwrap();
    // Reopen so the session sees the new schema.
    let engine = Engine::open(Config::load(&dir.join("clearice.toml")).unwrap())
        .await
        .unwrap();
    let ctx = engine.session("admin");
    let rows = json_rows(
        &query(
            &ctx,
            "SELECT count(*), count(loyalty), count(country), count(ssn) FROM lake.sales.customers",
        )
        .await
        .unwrap(),
    );
    let n = demo::CUSTOMERS as i64;
    // new columns read as NULL from old files; the re-added `country` is a new field id
    assert_eq!(rows[0][0], Value::from(n));
    assert_eq!(rows[0][1], Value::from(0));
    assert_eq!(rows[0][2], Value::from(0));
    assert!(rows[0][3].as_i64().unwrap() > n * 9 / 10);
}

#[tokio::test]
async fn truncated_data_file_fails_naming_the_file() {
    let (_tmp, engine, dir) = demo_engine().await;
    let f = data_files(&dir, "customers").remove(0);
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 3]).unwrap();
    let e = query_err(
        &engine.session("admin"),
        "SELECT count(name) FROM lake.sales.customers",
    )
    .await;
    assert!(e.contains(&f.display().to_string()), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[tokio::test]
async fn demo_init_refuses_a_non_empty_directory() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("x"), "x").unwrap();
    let e = demo::init(tmp.path()).await.unwrap_err().to_string();
    assert!(
        e.contains("not empty") && e.contains(&tmp.path().display().to_string()),
        "{e}"
    );
}

/// A stream's columns have the types its plan announced (what Flight SQL's FlightInfo
/// sends), even where DataFusion's physical plan types one differently.
#[tokio::test]
async fn a_stream_carries_the_types_its_plan_announced() {
    use futures::StreamExt as _;
    let (_tmp, engine, _dir) = demo_engine().await;
    let session = engine.session("admin");
    let sql = "SELECT sum(amount) AS s, count(DISTINCT status) AS d FROM lake.sales.orders";
    let announced = session
        .sql_plan(sql)
        .await
        .unwrap()
        .schema()
        .as_arrow()
        .clone();
    let mut stream = session.sql_stream(sql).await.unwrap();
    let types = |s: &datafusion::arrow::datatypes::Schema| {
        s.fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(types(&stream.schema()), types(&announced));
    let mut rows = 0;
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        assert_eq!(types(&b.schema()), types(&announced));
        rows += b.num_rows();
    }
    assert_eq!(rows, 1);
    // The same sum as without the DISTINCT next to it.
    let alone = json_rows(
        &query(&session, "SELECT sum(amount) FROM lake.sales.orders")
            .await
            .unwrap(),
    );
    let both = json_rows(&query(&session, sql).await.unwrap());
    assert_eq!(both[0][0], alone[0][0]);
}

/// A statement DataFusion panics on (a planner bug) fails in one line, audited, and the
/// session goes on; it is not a crash of the shell or the server.
#[tokio::test]
async fn a_statement_datafusion_panics_on_is_an_error_not_a_crash() {
    let (_tmp, engine, dir) = demo_engine().await;
    let session = engine.session("admin");
    let sql = "SELECT first_value(name || 'x') OVER (PARTITION BY id % 3 ORDER BY id) AS a, \
               row_number() OVER (PARTITION BY id % 3 ORDER BY id) AS b \
               FROM lake.sales.customers WHERE id < 1000010";
    let mut failed = false;
    for run in [0, 1] {
        let outcome = if run == 0 {
            session.sql(sql).await.map(|o| o.rows())
        } else {
            match session.sql_stream(sql).await {
                Ok(s) => datafusion::physical_plan::common::collect(s)
                    .await
                    .map(|b| b.iter().map(|b| b.num_rows()).sum()),
                Err(e) => Err(e),
            }
        };
        match outcome {
            // DataFusion fixed: then the answer must be complete.
            Ok(n) => assert_eq!(n, 10),
            Err(e) => {
                failed = true;
                let msg = clearice_engine::message_of(&e);
                assert!(!msg.contains('\n'), "{msg}");
                assert!(msg.contains("internal DataFusion error"), "{msg}");
            }
        }
    }
    let n = json_rows(
        &query(&session, "SELECT count(*) FROM lake.sales.customers")
            .await
            .unwrap(),
    );
    assert_eq!(n[0][0], Value::from(demo::CUSTOMERS as i64));
    if failed {
        let audit = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap();
        assert!(audit.contains("internal DataFusion error"), "{audit}");
    }
}

#[tokio::test]
async fn joins_with_a_build_side_under_the_collect_thresholds_probe_one_shared_table() {
    // 200,000 orders on either side: above DataFusion's CollectLeft threshold of 128 Ki
    // rows, under ClearIce's 4 Mi rows (`HASH_JOIN_COLLECT_ROWS`).
    let (_tmp, engine, _dir) = demo_engine().await;
    let session = engine.session("admin");
    let sql = "SELECT a.status, count(*), min(b.order_date) FROM lake.sales.orders a \
               JOIN lake.sales.orders b ON a.order_id = b.order_id GROUP BY a.status";
    let plan = plan_text(&session, sql).await;
    assert!(plan.contains("HashJoinExec: mode=CollectLeft"), "{plan}");
    let collected = session.sql(sql).await.unwrap();
    // DataFusion's own thresholds partition both sides by the key; same answer.
    session
        .set_option(
            "datafusion.optimizer.hash_join_single_partition_threshold",
            "1048576",
        )
        .unwrap();
    session
        .set_option(
            "datafusion.optimizer.hash_join_single_partition_threshold_rows",
            "131072",
        )
        .unwrap();
    let plan = plan_text(&session, sql).await;
    assert!(plan.contains("HashJoinExec: mode=Partitioned"), "{plan}");
    let partitioned = session.sql(sql).await.unwrap();
    let sorted = |out: &clearice_engine::QueryOutput| {
        let mut rows = json_rows(&out.batches);
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    assert_eq!(sorted(&collected), sorted(&partitioned));
    // Each order joins itself only.
    let direct = session
        .sql("SELECT status, count(*), min(order_date) FROM lake.sales.orders GROUP BY status")
        .await
        .unwrap();
    assert_eq!(sorted(&collected), sorted(&direct));
    assert!(sorted(&collected).len() > 1);
}
