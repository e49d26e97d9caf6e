//! An Iceberg SQL catalog in a real PostgreSQL server (started by scripts/test.sh; its URI
//! in CLEARICE_PG_URI): ClearIce writes an encrypted table into it, then reads it back
//! through the engine under a policy, and sees tables another writer adds; PyIceberg's own
//! PostgreSQL catalog (its DDL) holding PyArrow-encrypted files reads the same as SQLite.

use std::collections::HashMap;

use std::sync::Arc;

use clearice_crypto::{KeyringKms, Kms};
use iceberg::{Catalog, NamespaceIdent};
use serde_json::Value;

use crate::common::*;

fn pg_uri() -> Option<String> {
    let uri = std::env::var("CLEARICE_PG_URI").ok();
    if uri.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_PG_URI is not set, but CLEARICE_REQUIRE_FIXTURES is set"
        );
        eprintln!("\n*** SKIPPED: CLEARICE_PG_URI not set; run ./scripts/test.sh ***\n");
    }
    uri
}

const KEYRING: &str =
    r#"{"footer_key": "AAECAwQFBgcICQoLDA0ODw==", "pii_key": "EBESExQVFhcYGRobHB0eHw=="}"#;

async fn write_table(catalog: &dyn Catalog, ns: &NamespaceIdent, name: &str, kms: &Arc<dyn Kms>) {
    let ssns = ["123-45-6789", "987-65-4321"];
    write_id_ssn_table(catalog, ns, name, kms, ("footer_key", "pii_key"), &ssns).await;
}

#[tokio::test]
async fn encrypted_table_in_a_postgresql_catalog_reads_under_the_policy() {
    let Some(uri) = pg_uri() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let warehouse = format!("file://{}/warehouse", tmp.path().display());
    std::fs::write(tmp.path().join("keyring.json"), KEYRING).unwrap();
    let kms: Arc<dyn Kms> = Arc::new(KeyringKms::from_json(KEYRING).unwrap());
    // a namespace of its own, so runs against the same server do not meet
    let ns_name = format!("t{:016x}", rand::random::<u64>());
    let ns = NamespaceIdent::new(ns_name.clone());
    let catalog =
        clearice_iceberg::open_sql_catalog("pglake", &uri, &warehouse, &Default::default())
            .await
            .unwrap();
    catalog.create_namespace(&ns, HashMap::new()).await.unwrap();
    write_table(catalog.as_ref(), &ns, "people", &kms).await;

    let policy = format!(
        "[roles]\nanalyst = {{}}\nadmin = {{}}\n[users]\nann = {{ roles = [\"analyst\"] }}\nroot = {{ roles = [\"admin\"] }}\n\
         [tables.\"pglake.{ns_name}.people\".columns.ssn]\nmaster_key = \"pii_key\"\n\
         access = {{ admin = \"plaintext\", analyst = \"show_last_4\" }}\n"
    );
    std::fs::write(tmp.path().join("policy.toml"), policy).unwrap();
    let engine = engine(
        tmp.path(),
        &format!(
            "[catalogs.pglake]\ntype = \"sql\"\nuri = \"{uri}\"\nwarehouse = \"{warehouse}\"\n\
             [kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n[policy]\npath = \"policy.toml\"\n"
        ),
    )
    .await;
    let sql = format!("SELECT id, ssn FROM pglake.{ns_name}.people ORDER BY id");
    let root = json_rows(&engine.session("root").sql(&sql).await.unwrap().batches);
    assert_eq!(
        root,
        vec![
            vec![Value::from(1), Value::from("123-45-6789")],
            vec![Value::from(2), Value::from("987-65-4321")]
        ]
    );
    let ann = json_rows(&engine.session("ann").sql(&sql).await.unwrap().batches);
    assert_eq!(ann[0][1], Value::from("XXX-XX-6789"));

    // another writer adds a table to the PostgreSQL catalog: visible without a restart
    write_table(catalog.as_ref(), &ns, "late", &kms).await;
    tokio::time::sleep(clearice_engine::CATALOG_LISTING_MAX_AGE).await;
    let n = json_rows(
        &engine
            .session("root")
            .sql(&format!("SELECT count(*) FROM pglake.{ns_name}.late"))
            .await
            .unwrap()
            .batches,
    );
    assert_eq!(n, vec![vec![Value::from(2)]]);
}

#[tokio::test]
async fn pyiceberg_postgresql_catalog_reads_like_its_sqlite_twin() {
    let Some(uri) = pg_uri() else { return };
    let Some(interop) = interop_dir() else { return };
    let python = std::env::var("CLEARICE_PYTHON").expect("CLEARICE_PYTHON (scripts/test.sh)");
    let ns = format!("py{:016x}", rand::random::<u64>());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/pg_register.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(&uri)
        .arg(&interop)
        .arg(&ns)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PyIceberg could not register the table in PostgreSQL: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = tempfile::tempdir().unwrap();
    let keyring = interop.join("keyring.json");
    // interop_config ends with the [kms] table: put the extra catalog first
    let config = format!(
        "[catalogs.pylake]\ntype = \"sql\"\nuri = \"{uri}\"\nwarehouse = \"file://{}/warehouse\"\n{}",
        interop.display(),
        interop_config(&interop, &keyring)
    );
    let engine = engine(tmp.path(), &config).await;
    let session = engine.session("anyone");
    let sql = |c: &str| {
        format!("SELECT count(*), count(DISTINCT ssn), sum(balance), min(email) FROM {c}")
    };
    let pg = json_rows(
        &session
            .sql(&sql(&format!("pylake.{ns}.customers")))
            .await
            .unwrap()
            .batches,
    );
    let sqlite = json_rows(
        &session
            .sql(&sql("lake.sales.customers"))
            .await
            .unwrap()
            .batches,
    );
    assert_eq!(pg, sqlite);
    assert!(pg[0][0].as_i64().unwrap() > 0, "{pg:?}");
}
