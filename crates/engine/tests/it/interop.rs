//! The lake and standalone files written by PyArrow 26 / PyIceberg 0.12 read exactly as
//! DuckDB computed over the plaintext twin (expected.json).

use std::collections::HashMap;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use clearice_crypto::{KeyringKms, Kms};
use serde_json::Value;

use crate::common::*;

fn expected(dir: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap()
}

async fn check_expected(table: &str) {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(tmp.path(), &interop_config(&dir, &dir.join("keyring.json"))).await;
    assert_expected(&engine, &dir, table, "tester").await;
}

#[tokio::test]
async fn iceberg_lake_matches_expected_json() {
    check_expected("lake.sales.customers").await;
}

#[tokio::test]
async fn uniform_file_matches_expected_json() {
    let Some(dir) = interop_dir() else { return };
    check_expected(&format!("'{}/uniform.parquet'", dir.display())).await;
}

#[tokio::test]
async fn per_column_keys_file_matches_expected_json() {
    let Some(dir) = interop_dir() else { return };
    check_expected(&format!("'{}/columns.parquet'", dir.display())).await;
}

#[tokio::test]
async fn plaintext_footer_file_matches_expected_json() {
    let Some(dir) = interop_dir() else { return };
    check_expected(&format!("'{}/plaintext_footer.parquet'", dir.display())).await;
}

#[tokio::test]
async fn plain_twin_matches_expected_json() {
    let Some(dir) = interop_dir() else { return };
    check_expected(&format!("'{}/plain.parquet'", dir.display())).await;
}

#[tokio::test]
async fn keyring_kms_passes_the_shared_vectors() {
    let Some(dir) = interop_dir() else { return };
    let kms = KeyringKms::from_file(&dir.join("keyring.json")).unwrap();
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("kms_vectors.json")).unwrap()).unwrap();
    let vectors: Vec<Value> = match &v {
        Value::Array(a) => a.clone(),
        Value::Object(o) => o
            .get("vectors")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| vec![v.clone()]),
        _ => panic!("unexpected kms_vectors.json shape"),
    };
    assert!(!vectors.is_empty());
    for t in vectors {
        let id = t["master_key_id"].as_str().unwrap();
        let key = BASE64_STANDARD
            .decode(t["key_b64"].as_str().unwrap())
            .unwrap();
        let wrapped = t["wrapped"].as_str().unwrap();
        assert_eq!(
            kms.unwrap_key(wrapped, id).await.unwrap().expose(),
            key.as_slice(),
            "vector for {id}"
        );
        if let Some(bad) = t.get("tampered_wrapped_must_fail").and_then(Value::as_str) {
            assert!(
                kms.unwrap_key(bad, id).await.is_err(),
                "tampered vector for {id} must fail"
            );
        }
        // wrapping with the vector's nonce gives exactly the vector (same format)
        let masters: HashMap<String, String> =
            serde_json::from_slice(&std::fs::read(dir.join("keyring.json")).unwrap()).unwrap();
        let master = BASE64_STANDARD.decode(&masters[id]).unwrap();
        let nonce: [u8; 12] = BASE64_STANDARD
            .decode(t["nonce_b64"].as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let ours = clearice_crypto::aes::encrypt(&master, &nonce, &key, id.as_bytes()).unwrap();
        assert_eq!(BASE64_STANDARD.encode(ours), wrapped);
        // our own wrap round-trips under the same id
        let ours = kms.wrap_key(&key, id).await.unwrap();
        assert_eq!(
            kms.unwrap_key(&ours, id).await.unwrap().expose(),
            key.as_slice()
        );
    }
}

#[tokio::test]
async fn kms_is_asked_once_per_master_key_not_per_file_or_row_group() {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(tmp.path(), &interop_config(&dir, &dir.join("keyring.json"))).await;
    let ctx = engine.session("tester");
    query(&ctx, "SELECT * FROM lake.sales.customers")
        .await
        .unwrap();
    let first = engine.key_resolver().kms_unwrap_count();
    // 3 data files x at most 3 master keys (PyArrow may share KEKs across files)
    assert!(
        (1..=9).contains(&first),
        "{first} KMS calls for 3 files / 12 row groups"
    );
    query(&ctx, "SELECT * FROM lake.sales.customers")
        .await
        .unwrap();
    assert_eq!(
        engine.key_resolver().kms_unwrap_count(),
        first,
        "second scan must hit the key cache"
    );
}

fn keyring_without(dir: &std::path::Path, drop: &str, out: &std::path::Path) {
    let mut k: HashMap<String, String> =
        serde_json::from_slice(&std::fs::read(dir.join("keyring.json")).unwrap()).unwrap();
    k.remove(drop).unwrap();
    std::fs::write(out, serde_json::to_vec(&k).unwrap()).unwrap();
}

#[tokio::test]
async fn missing_column_key_fails_only_queries_that_need_the_column() {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let keyring = tmp.path().join("keyring.json");
    keyring_without(&dir, "pii_key", &keyring);
    let engine = engine(tmp.path(), &interop_config(&dir, &keyring)).await;
    let ctx = engine.session("tester");
    let exp = expected(&dir);
    // Queries on other columns work, with and without predicates.
    for (sql, name) in [
        (
            "SELECT count(*) AS n FROM lake.sales.customers",
            "row_count",
        ),
        (
            "SELECT sum(balance) AS total_balance FROM lake.sales.customers",
            "sum_balance",
        ),
        (
            "SELECT count(*) AS n FROM lake.sales.customers WHERE balance > 400000",
            "count_balance_gt_400000",
        ),
    ] {
        let want = exp["queries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == name)
            .unwrap()["rows"]
            .clone();
        let got = json_rows(
            &query(&ctx, sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        );
        assert_eq!(serde_json::to_value(got).unwrap(), want, "{sql}");
    }
    let rows = query(
        &ctx,
        "SELECT id, country FROM lake.sales.customers WHERE country = 'US' AND id > 0",
    )
    .await
    .unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 2972);
    // Queries on ssn fail, naming the key and the file, without key bytes.
    for sql in [
        "SELECT ssn FROM lake.sales.customers",
        "SELECT count(*) FROM lake.sales.customers WHERE ssn IS NULL",
        "SELECT * FROM lake.sales.customers LIMIT 1",
    ] {
        let e = query_err(&ctx, sql).await;
        assert!(
            e.contains("'pii_key'") && e.contains(".parquet'"),
            "{sql}: {e}"
        );
    }
}

#[tokio::test]
async fn wrong_master_key_fails_with_a_clear_error_and_no_key_bytes() {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut k: HashMap<String, String> =
        serde_json::from_slice(&std::fs::read(dir.join("keyring.json")).unwrap()).unwrap();
    let wrong = BASE64_STANDARD.encode([7u8; 16]);
    k.insert("pii_key".into(), wrong.clone());
    let keyring = tmp.path().join("keyring.json");
    std::fs::write(&keyring, serde_json::to_vec(&k).unwrap()).unwrap();
    let engine = engine(tmp.path(), &interop_config(&dir, &keyring)).await;
    let ctx = engine.session("tester");
    let e = query_err(&ctx, "SELECT email FROM lake.sales.customers").await;
    assert!(
        e.contains("'pii_key'") && e.contains("failed to unwrap"),
        "{e}"
    );
    assert!(!e.contains(&wrong) && !e.contains(&k["footer_key"]), "{e}");
    assert!(e.lines().count() == 1, "{e}");
}

#[tokio::test]
async fn tampered_encrypted_footer_fails_and_names_the_file() {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(tmp.path(), &interop_config(&dir, &dir.join("keyring.json"))).await;
    let ctx = engine.session("tester");
    let mut bytes = std::fs::read(dir.join("columns.parquet")).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 1; // inside the encrypted footer (before its length and PARE)
    let f = tmp.path().join("tampered.parquet");
    std::fs::write(&f, &bytes).unwrap();
    let e = query_err(&ctx, &format!("SELECT count(name) FROM '{}'", f.display())).await;
    assert!(!e.is_empty(), "{e}");
    let t = tmp.path().join("truncated.parquet");
    std::fs::write(&t, &bytes[..n / 2]).unwrap();
    let e = query_err(&ctx, &format!("SELECT * FROM '{}'", t.display())).await;
    assert!(e.to_lowercase().contains("parquet"), "{e}");
}

#[tokio::test]
async fn unknown_table_and_namespace_are_named() {
    let Some(dir) = interop_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(tmp.path(), &interop_config(&dir, &dir.join("keyring.json"))).await;
    let ctx = engine.session("tester");
    assert!(
        query_err(&ctx, "SELECT * FROM lake.sales.nope")
            .await
            .contains("lake.sales.nope")
    );
    assert!(
        query_err(&ctx, "SELECT * FROM lake.nope.customers")
            .await
            .contains("lake.nope.customers")
    );
    let names = json_rows(&query(&ctx, "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'lake' AND table_schema = 'sales'").await.unwrap());
    assert_eq!(names, vec![vec![Value::from("customers")]]);
}
