//! `keys rotate` with the keyring KMS: data files untouched; a file with external key
//! material (parquet-java's, with its side file) re-wrapped under the new key version, a
//! table written before the rotation (internal material, old version) and one written
//! after it (new version) all read; the old wrapping is gone from the side file.

use std::sync::Arc;

use clearice_crypto::{KeyringKms, Kms};
use clearice_engine::{Config, rotate_master_key};
use iceberg::{Catalog, NamespaceIdent};
use serde_json::Value;

use crate::common::*;

const KEYRING: &str = r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ==", "kc1": "MTIzNDU2Nzg5MDEyMzQ1MA==", "kc2": "MTIzNDU2Nzg5MDEyMzQ1MQ=="}"#;

async fn write(catalog: &dyn Catalog, name: &str, kms: &Arc<dyn Kms>, ssn: &str) {
    let ns = NamespaceIdent::new("sales".into());
    write_id_ssn_table(catalog, &ns, name, kms, ("kf", "kc1"), &[ssn]).await;
}

fn kc1_wrappings(side_file: &str) -> Vec<String> {
    let map: serde_json::Map<String, Value> = serde_json::from_str(side_file).unwrap();
    map.values()
        .filter_map(|m| {
            let m: Value = serde_json::from_str(m.as_str().unwrap()).unwrap();
            (m["masterKeyID"] == "kc1").then(|| format!("{}|{}", m["wrappedKEK"], m["wrappedDEK"]))
        })
        .collect()
}

#[tokio::test]
async fn rotation_rewraps_side_files_and_old_and_new_files_read() {
    let Some(testing) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    std::fs::write(dir.join("keyring.json"), KEYRING).unwrap();
    std::fs::create_dir_all(dir.join("warehouse")).unwrap();
    let ext = dir.join("ext");
    std::fs::create_dir_all(&ext).unwrap();
    let java = "external_key_material_java.parquet.encrypted";
    let side = format!("_KEY_MATERIAL_FOR_{java}.json");
    std::fs::copy(testing.join(java), ext.join(java)).unwrap();
    std::fs::copy(testing.join(&side), ext.join(&side)).unwrap();
    let config_text = format!(
        "[catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{d}/catalog.db\"\nwarehouse = \"file://{d}/warehouse\"\n\
         [kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n",
        d = dir.display()
    );
    let catalog = clearice_iceberg::open_sql_catalog(
        "lake",
        &format!("sqlite://{}/catalog.db?mode=rwc", dir.display()),
        &format!("file://{}/warehouse", dir.display()),
        &Default::default(),
    )
    .await
    .unwrap();
    catalog
        .create_namespace(&NamespaceIdent::new("sales".into()), Default::default())
        .await
        .unwrap();
    let v1: Arc<dyn Kms> = Arc::new(KeyringKms::from_json(KEYRING).unwrap());
    write(catalog.as_ref(), "before", &v1, "111-11-1111").await;
    let side_before = std::fs::read_to_string(ext.join(&side)).unwrap();
    let data_before = std::fs::read(ext.join(java)).unwrap();

    std::fs::write(dir.join("clearice.toml"), &config_text).unwrap();
    let config = Config::load(&dir.join("clearice.toml")).unwrap();
    let report = rotate_master_key(&config, "kc1", std::slice::from_ref(&ext))
        .await
        .unwrap();
    assert_eq!(report.keyring_version, Some(2));
    assert_eq!((report.side_files, report.keys), (1, 1));
    // Data untouched; the old wrapping of kc1 is gone from the side file.
    assert_eq!(std::fs::read(ext.join(java)).unwrap(), data_before);
    let side_after = std::fs::read_to_string(ext.join(&side)).unwrap();
    let (old, new) = (kc1_wrappings(&side_before), kc1_wrappings(&side_after));
    assert_eq!(old.len(), 1);
    assert!(!new.contains(&old[0]), "old wrapping still present");
    // A table written after the rotation (the new version wraps).
    let v2: Arc<dyn Kms> = Arc::new(KeyringKms::from_file(&dir.join("keyring.json")).unwrap());
    write(catalog.as_ref(), "after", &v2, "222-22-2222").await;

    let engine = engine(&dir, &config_text).await;
    let ctx = engine.session("tester");
    for (table, ssn) in [("before", "111-11-1111"), ("after", "222-22-2222")] {
        let rows = json_rows(
            &query(&ctx, &format!("SELECT ssn FROM lake.sales.{table}"))
                .await
                .unwrap_or_else(|e| panic!("{table}: {e}")),
        );
        assert_eq!(rows, vec![vec![Value::from(ssn)]]);
    }
    register(&ctx, "java", &ext.join(java))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rows = json_rows(
        &query(
            &ctx,
            "SELECT count(*), min(integers), max(integers) FROM java",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(
        rows,
        vec![vec![Value::from(100), Value::from(0), Value::from(99)]]
    );

    // With only the old version, the table written after the rotation does not unwrap.
    std::fs::write(dir.join("keyring.json"), KEYRING).unwrap();
    let old_engine = engine_at(&dir, "old.toml", &config_text).await;
    let e = query_err(
        &old_engine.session("tester"),
        "SELECT ssn FROM lake.sales.after",
    )
    .await;
    assert!(e.contains("'kc1'") && e.contains("unwrap"), "{e}");
}
