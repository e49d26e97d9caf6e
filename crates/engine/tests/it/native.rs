//! Tables Iceberg encrypts itself (format v3 `encryption.key-id`), written by Spark 4.1 with
//! Iceberg 1.12 through its Hive catalog and a keyring `KeyManagementClient` in Java
//! (`tests/python/spark_native.py`; `scripts/test.sh` sets `CLEARICE_SPARK_NATIVE`): AGS1
//! manifest lists and manifests, uniform-PME data files and encrypted deletion vectors, each
//! under its own key. ClearIce reads every snapshot equal to Spark's answers, through the
//! SQL catalog and the Hive metastore Spark wrote to, under the policy.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{engine, interop_dir, java_peer, json_rows, query, query_err};
use crate::hms::start_metastore;

fn native_lake() -> Option<PathBuf> {
    let p = std::env::var_os("CLEARICE_SPARK_NATIVE").map(PathBuf::from);
    if p.is_none() {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_SPARK_NATIVE is not set (scripts/test.sh writes Spark's encrypted tables)"
        );
        eprintln!("\n*** SKIPPED: CLEARICE_SPARK_NATIVE not set; run ./scripts/test.sh ***\n");
    }
    p
}

fn expected(lake: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(lake.join("expected.json")).unwrap()).unwrap()
}

/// On table `t`: every column plaintext for `admin`; `analyst` sees `name` as NULL, is denied `amount`,
/// and reads the others; `note` is named for admin only (so denied to the analyst).
fn policy(dir: &Path, t: &str) -> String {
    let text = format!(
        "[roles]\nadmin = {{}}\nanalyst = {{}}\n[users]\nadmin = {{ roles = [\"admin\"] }}\n\
         analyst = {{ roles = [\"analyst\"] }}\n[writes]\ncreate = [\"admin\"]\n\
         [tables.\"{t}\".columns.id]\naccess = {{ \"*\" = \"plaintext\" }}\n\
         [tables.\"{t}\".columns.region]\naccess = {{ \"*\" = \"plaintext\" }}\n\
         [tables.\"{t}\".columns.name]\naccess = {{ admin = \"plaintext\", analyst = \"null\" }}\n\
         [tables.\"{t}\".columns.amount]\naccess = {{ admin = \"plaintext\", analyst = \"deny\" }}\n\
         [tables.\"{t}\".columns.note]\naccess = {{ admin = \"plaintext\" }}\n"
    );
    let path = dir.join("policy.toml");
    std::fs::write(&path, text).unwrap();
    format!(
        "[policy]\npath = \"{}\"\n[audit]\npath = \"{}\"\n",
        path.display(),
        dir.join("audit.jsonl").display()
    )
}

fn sql_catalog(lake: &Path) -> String {
    format!(
        "[catalogs.spark]\ntype = \"sql\"\nuri = \"sqlite://{l}/catalog.db\"\nwarehouse = \"file://{l}/warehouse\"\n",
        l = lake.display()
    )
}

fn kms(keyring: &Path) -> String {
    format!(
        "[kms]\ntype = \"keyring\"\npath = \"{}\"\n",
        keyring.display()
    )
}

/// Spark's rows of `snapshot` (columns as Spark listed them then).
fn spark_rows(snapshot: &Value) -> (Vec<String>, Vec<Vec<Value>>) {
    let cols = snapshot["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    (
        cols,
        serde_json::from_value(snapshot["rows"].clone()).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snapshot_of_a_table_iceberg_encrypts_equals_sparks_answer() {
    let (Some(lake), Some(interop)) = (native_lake(), interop_dir()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&interop.join("keyring.json")),
        policy(dir.path(), "spark.db.enc")
    );
    let engine = engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let analyst = engine.session("analyst");
    let e = expected(&lake);
    let snapshots = e["enc"]["snapshots"].as_array().unwrap();
    assert!(snapshots.len() >= 4, "{} snapshots", snapshots.len());
    let mut deletes = 0;
    for (i, s) in snapshots.iter().enumerate() {
        let id = s["snapshot_id"].as_i64().unwrap();
        let (cols, want) = spark_rows(s);
        let quoted: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
        let sql = format!(
            "SELECT {} FROM spark.db.enc FOR VERSION AS OF {id} ORDER BY id",
            quoted.join(", ")
        );
        let got = json_rows(&query(&admin, &sql).await.unwrap());
        assert_eq!(got.len(), want.len(), "snapshot {i} ({id}): row count");
        assert_eq!(got, want, "snapshot {i} ({id})");
        // The analyst: the same rows, `name` NULL; `amount` denied, naming the column.
        let got = json_rows(
            &query(
                &analyst,
                &format!(
                    "SELECT id, region, name FROM spark.db.enc FOR VERSION AS OF {id} ORDER BY id"
                ),
            )
            .await
            .unwrap(),
        );
        let region = cols.iter().position(|c| c == "region").unwrap();
        let id_at = cols.iter().position(|c| c == "id").unwrap();
        let masked: Vec<Vec<Value>> = want
            .iter()
            .map(|r| vec![r[id_at].clone(), r[region].clone(), Value::Null])
            .collect();
        assert_eq!(got, masked, "analyst at snapshot {i} ({id})");
        if s["operation"] == "delete" || s["operation"] == "overwrite" {
            deletes += 1;
        }
    }
    assert!(deletes >= 1, "no snapshot with deletes checked");
    let err = query_err(&analyst, "SELECT id, amount FROM spark.db.enc").await;
    assert!(err.contains("amount") && err.contains("analyst"), "{err}");
    // A column the policy names for admin only is denied to the analyst, like any
    // protected column without a matching rule (SELECT * too).
    let err = query_err(&analyst, "SELECT * FROM spark.db.enc").await;
    assert!(err.contains("denied"), "{err}");
    // Metadata tables decrypt the manifests; statistics of columns the analyst does not
    // read in plaintext are absent.
    let files = json_rows(
        &query(
            &admin,
            "SELECT count(*) FROM spark.db.\"enc$files\" WHERE content = 0",
        )
        .await
        .unwrap(),
    );
    assert!(files[0][0].as_i64().unwrap() >= 2, "{files:?}");
    let bounds = json_rows(
        &query(
            &analyst,
            "SELECT count(*) FROM spark.db.\"enc$files\" WHERE lower_bounds['amount'] IS NOT NULL",
        )
        .await
        .unwrap(),
    );
    assert_eq!(bounds[0][0].as_i64().unwrap(), 0, "{bounds:?}");
    // ClearIce does not write such tables yet: refused in one line, the table unchanged.
    let err = query_err(&admin, "INSERT INTO spark.db.enc (id) VALUES (1)").await;
    assert!(
        err.contains("spark.db.enc")
            && err.contains("writing a table Iceberg encrypts itself")
            && err.contains("not supported yet"),
        "{err}"
    );
    let last = spark_rows(snapshots.last().unwrap()).1.len();
    let n = json_rows(
        &query(&admin, "SELECT count(*) FROM spark.db.enc")
            .await
            .unwrap(),
    );
    assert_eq!(n[0][0].as_i64().unwrap() as usize, last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_key_the_kms_lacks_or_a_table_the_policy_does_not_name_is_denied_naming_the_key() {
    let (Some(lake), Some(interop)) = (native_lake(), interop_dir()) else {
        return;
    };
    let key_id = expected(&lake)["enc"]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A keyring without the table key.
    let dir = tempfile::tempdir().unwrap();
    let keyring: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(interop.join("keyring.json")).unwrap())
            .unwrap();
    let without: serde_json::Map<String, Value> =
        keyring.into_iter().filter(|(k, _)| *k != key_id).collect();
    let partial = dir.path().join("keyring.json");
    std::fs::write(&partial, serde_json::to_string(&without).unwrap()).unwrap();
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&partial),
        policy(dir.path(), "spark.db.enc")
    );
    let lacking = engine(dir.path(), &config).await;
    let admin = lacking.session("admin");
    for sql in [
        "SELECT count(*) FROM spark.db.enc",
        "SELECT * FROM spark.db.\"enc$files\"",
    ] {
        let err = query_err(&admin, sql).await;
        assert!(
            err.contains("spark.db.enc") && err.contains(&format!("'{key_id}'")),
            "{sql}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // The policy does not name the table: denied, not decrypted by default.
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&interop.join("keyring.json")),
        policy(dir.path(), "other.db.enc")
    );
    let unnamed = engine(dir.path(), &config).await;
    let err = query_err(&unnamed.session("admin"), "SELECT id FROM spark.db.enc").await;
    assert!(
        err.contains("does not name this table") && err.contains(&format!("'{key_id}'")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hive_metastore_spark_wrote_to_serves_the_encrypted_table() {
    let (Some(lake), Some(interop), Some((cp, _))) =
        (native_lake(), interop_dir(), java_peer("CLEARICE_HMS_CP"))
    else {
        return;
    };
    // The metastore's Derby database is copied, so tests do not share its lock.
    let dir = tempfile::tempdir().unwrap();
    let hms = dir.path().join("hms");
    copy_dir(&lake.join("hms"), &hms);
    let (_metastore, uri) = start_metastore(&cp, &hms);
    let config = format!(
        "[catalogs.hive]\ntype = \"hms\"\nuri = \"{uri}\"\n{}{}",
        kms(&interop.join("keyring.json")),
        policy(dir.path(), "hive.db.enc")
    );
    let engine = engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let e = expected(&lake);
    let last = e["enc"]["snapshots"].as_array().unwrap().last().unwrap();
    let (cols, want) = spark_rows(last);
    let quoted: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
    let got = json_rows(
        &query(
            &admin,
            &format!("SELECT {} FROM hive.db.enc ORDER BY id", quoted.join(", ")),
        )
        .await
        .unwrap(),
    );
    assert_eq!(got, want);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "db.lck" && entry.file_name() != "dbex.lck" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Flips one byte of `file` at `at` (from the end if negative); returns the original bytes.
fn flip(file: &Path, at: i64) -> Vec<u8> {
    let original = std::fs::read(file).unwrap();
    let mut bytes = original.clone();
    let i = if at < 0 {
        bytes.len() - at.unsigned_abs() as usize
    } else {
        at as usize
    };
    bytes[i] ^= 0x40;
    std::fs::write(file, bytes).unwrap();
    original
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_manifest_list_manifest_data_file_or_deletion_vector_is_named() {
    let (Some(lake), Some(interop)) = (native_lake(), interop_dir()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&interop.join("keyring.json")),
        policy(dir.path(), "spark.db.tamper")
    );
    let engine = engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let sql = "SELECT id, region, name, amount FROM spark.db.tamper";
    let before = json_rows(&query(&admin, sql).await.unwrap());
    let table = lake.join("warehouse/db.db/tamper");
    let metadata: Value = serde_json::from_str(
        &std::fs::read_to_string(
            expected(&lake)["tamper"]["on_disk"]["metadata"]
                .as_str()
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    let current = metadata["current-snapshot-id"].as_i64().unwrap();
    let snapshot = metadata["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap();
    let list = PathBuf::from(
        snapshot["manifest-list"]
            .as_str()
            .unwrap()
            .trim_start_matches("file:"),
    );
    let files = |dir: &str, ext: &str| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(table.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        v.sort();
        v
    };
    let manifest = files("metadata", "avro")
        .into_iter()
        .find(|p| {
            !p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("snap-")
        })
        .unwrap();
    let data = files("data", "parquet");
    let dv = files("data", "puffin");
    assert!(!data.is_empty() && !dv.is_empty(), "{data:?} {dv:?}");
    // AGS1: a byte of the first block's ciphertext; Parquet: a byte of a column chunk.
    let cases: Vec<(&str, PathBuf, i64)> = vec![
        ("manifest list", list, 24),
        ("manifest", manifest, 24),
        ("data file", data[0].clone(), 8),
        ("deletion vector", dv.last().unwrap().clone(), 24),
    ];
    for (what, file, at) in cases {
        let original = flip(&file, at);
        let result = query(&admin, sql).await;
        std::fs::write(&file, original).unwrap();
        let err = match result {
            Ok(rows) => panic!("{what} {}: read {} batches", file.display(), rows.len()),
            Err(e) => e.to_string(),
        };
        let name = file.file_name().unwrap().to_str().unwrap();
        // Iceberg's files name the table; a data file's error is the decrypting reader's,
        // which names the file, the column and the module (as for every PME table).
        let table_named = what == "data file" || err.contains("spark.db.tamper");
        assert!(table_named && err.contains(name), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
    }
    // Restored, the table reads as before.
    assert_eq!(json_rows(&query(&admin, sql).await.unwrap()), before);
}
