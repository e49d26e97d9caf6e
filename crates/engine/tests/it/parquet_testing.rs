//! parquet-testing's encrypted files: explicit keys (parquet-cpp, parquet-mr) and
//! parquet-mr's external key material, read through the configured keys.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

fn explicit_keys_config(dir: &Path, keys: &[(&str, &str)], keyring: Option<&str>) -> String {
    use base64::Engine as _;
    let json: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(id, k)| {
            (
                id.to_string(),
                base64::prelude::BASE64_STANDARD.encode(k.as_bytes()).into(),
            )
        })
        .collect();
    std::fs::write(
        dir.join("explicit.json"),
        serde_json::to_vec(&json).unwrap(),
    )
    .unwrap();
    let mut c = "[explicit_keys]\npath = \"explicit.json\"\n".to_string();
    if let Some(k) = keyring {
        std::fs::write(dir.join("keyring.json"), k).unwrap();
        c.push_str("[kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n");
    }
    c
}

const CHECK_50: &str = "SELECT count(*), \
    sum(CASE WHEN boolean_field = (int32_field_ms % 2 = 0) THEN 1 ELSE 0 END), \
    sum(CASE WHEN abs(double_field - i * 1.1111111) < 1e-6 THEN 1 ELSE 0 END), \
    sum(CASE WHEN abs(float_field - i * 1.1) < 1e-4 THEN 1 ELSE 0 END), \
    sum(CASE WHEN (i % 2 = 0 AND ba = 'parquet' || lpad(CAST(i AS VARCHAR), 3, '0')) OR (i % 2 = 1 AND ba IS NULL) THEN 1 ELSE 0 END) \
    FROM (SELECT *, CAST(int32_field AS BIGINT) AS i, CAST(int32_field AS BIGINT) AS int32_field_ms, \
          CAST(ba_field AS VARCHAR) AS ba FROM f)";

async fn check_50_row_file(dir: &Path, keys: &[(&str, &str)], file: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(tmp.path(), &explicit_keys_config(tmp.path(), keys, None)).await;
    let ctx = engine.session("tester");
    register(&ctx, "f", &dir.join(file))
        .await
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let rows = json_rows(
        &query(&ctx, CHECK_50)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}")),
    );
    assert_eq!(rows, vec![vec![Value::from(50); 5]], "{file}");
}

#[tokio::test]
async fn explicit_key_files_128_decrypt_every_column() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    for f in [
        "uniform_encryption.parquet.encrypted",
        "encrypt_columns_and_footer.parquet.encrypted",
        "encrypt_columns_plaintext_footer.parquet.encrypted",
        "encrypt_columns_and_footer_aad.parquet.encrypted",
    ] {
        check_50_row_file(&dir, KEYS_128, f).await;
    }
}

#[tokio::test]
async fn explicit_key_files_256_decrypt_every_column() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    for f in [
        "aes256/uniform_encryption.parquet.encrypted",
        "aes256/encrypt_columns_and_footer.parquet.encrypted",
        "aes256/encrypt_columns_plaintext_footer.parquet.encrypted",
    ] {
        check_50_row_file(&dir, KEYS_256, f).await;
    }
}

#[tokio::test]
async fn bloom_filter_file_reads_with_column_keys() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(
        tmp.path(),
        &explicit_keys_config(tmp.path(), KEYS_128, None),
    )
    .await;
    let ctx = engine.session("tester");
    register(
        &ctx,
        "f",
        &dir.join("encrypt_columns_and_footer_bloom_filter.parquet.encrypted"),
    )
    .await
    .unwrap();
    let sql = "SELECT count(*), sum(CASE WHEN name = 'name_' || CAST(int32_field AS VARCHAR) THEN 1 ELSE 0 END), \
         sum(CASE WHEN double_field = int32_field + 0.5 AND float_field = int32_field + 0.25 THEN 1 ELSE 0 END) FROM f";
    let rows = json_rows(&query(&ctx, sql).await.unwrap());
    assert_eq!(rows, vec![vec![Value::from(2000); 3]]);
    let hit = json_rows(
        &query(
            &ctx,
            "SELECT int32_field FROM f WHERE double_field = 1234.5",
        )
        .await
        .unwrap(),
    );
    assert_eq!(hit, vec![vec![Value::from(1234)]]);
}

#[tokio::test]
async fn external_key_material_side_file_is_unwrapped_by_the_keyring() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let keyring = r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ==", "kc1": "MTIzNDU2Nzg5MDEyMzQ1MA==", "kc2": "MTIzNDU2Nzg5MDEyMzQ1MQ=="}"#;
    let engine = engine(
        tmp.path(),
        &explicit_keys_config(tmp.path(), &[], Some(keyring)),
    )
    .await;
    let ctx = engine.session("tester");
    register(
        &ctx,
        "f",
        &dir.join("external_key_material_java.parquet.encrypted"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let sql = "SELECT count(*), sum(CASE WHEN strings = substr('abcdefghij', integers % 10 + 1, 1) || CAST(integers AS VARCHAR) THEN 1 ELSE 0 END), \
         min(integers), max(integers) FROM f";
    let rows = json_rows(&query(&ctx, sql).await.unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(
        rows,
        vec![vec![
            Value::from(100),
            Value::from(100),
            Value::from(0),
            Value::from(99)
        ]]
    );
}

#[tokio::test]
async fn external_key_material_without_side_file_names_it() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp
        .path()
        .join("external_key_material_java.parquet.encrypted");
    std::fs::copy(
        dir.join("external_key_material_java.parquet.encrypted"),
        &copy,
    )
    .unwrap();
    let keyring = r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ=="}"#;
    let engine = engine(
        tmp.path(),
        &explicit_keys_config(tmp.path(), &[], Some(keyring)),
    )
    .await;
    let e = register(&engine.session("t"), "f", &copy)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("_KEY_MATERIAL_FOR_external_key_material_java.parquet.encrypted.json"),
        "{e}"
    );
}

#[tokio::test]
async fn ctr_files_read_in_sql() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    check_50_row_file(
        &dir,
        KEYS_128,
        "encrypt_columns_and_footer_ctr.parquet.encrypted",
    )
    .await;
    check_50_row_file(
        &dir,
        KEYS_256,
        "aes256/encrypt_columns_and_footer_ctr.parquet.encrypted",
    )
    .await;
}

#[tokio::test]
async fn aad_prefix_is_supplied_as_a_table_option() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(
        tmp.path(),
        &explicit_keys_config(tmp.path(), KEYS_128, None),
    )
    .await;
    let ctx = engine.session("tester");
    let f = dir.join("encrypt_columns_and_footer_disable_aad_storage.parquet.encrypted");
    // Without the prefix: one line saying what to supply.
    let e = query_err(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE nop STORED AS PARQUET LOCATION '{}'",
            f.display()
        ),
    )
    .await;
    assert!(
        e.contains("aad_prefix_as_hex") && e.contains(&f.display().to_string()),
        "{e}"
    );
    // "tester" in hex.
    query(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE f STORED AS PARQUET LOCATION '{}' \
             OPTIONS ('format.crypto.file_decryption.aad_prefix_as_hex' '746573746572')",
            f.display()
        ),
    )
    .await
    .unwrap();
    let rows = json_rows(&query(&ctx, CHECK_50).await.unwrap());
    assert_eq!(rows, vec![vec![Value::from(50); 5]]);
}

#[tokio::test]
async fn missing_explicit_key_is_named() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let engine = engine(
        tmp.path(),
        &explicit_keys_config(tmp.path(), &KEYS_128[..1], None),
    )
    .await;
    let ctx = engine.session("tester");
    register(
        &ctx,
        "f",
        &dir.join("encrypt_columns_and_footer.parquet.encrypted"),
    )
    .await
    .unwrap();
    // unencrypted columns read with the footer key alone
    let rows = json_rows(
        &query(&ctx, "SELECT count(int32_field) FROM f")
            .await
            .unwrap(),
    );
    assert_eq!(rows, vec![vec![Value::from(50)]]);
    let e = query_err(&ctx, "SELECT double_field FROM f").await;
    assert!(e.contains("'kc1'"), "{e}");
}
