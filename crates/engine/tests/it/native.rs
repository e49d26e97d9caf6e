//! Tables Iceberg encrypts itself (format v3 `encryption.key-id`), written by Spark 4.1 with
//! Iceberg 1.12 through its Hive catalog and a keyring `KeyManagementClient` in Java
//! (`tests/python/spark_native.py`; `scripts/test.sh` sets `CLEARICE_SPARK_NATIVE`): AGS1
//! manifest lists and manifests, uniform-PME data files and encrypted deletion vectors, each
//! under its own key. ClearIce reads every snapshot equal to Spark's answers, through the
//! SQL catalog and the Hive metastore Spark wrote to, under the policy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::cluster::{cluster_of, explain};
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
    policy_with(dir, t, |text| text)
}

/// [`policy`] with its text changed by `edit`.
fn policy_with(dir: &Path, t: &str, edit: impl FnOnce(String) -> String) -> String {
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
    std::fs::write(&path, edit(text)).unwrap();
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

/// The config of a test over Spark's SQL catalog with the interop keyring KMS and
/// `policy` (the text of [`policy`] or [`policy_with`]).
fn sql_config(lake: &Path, interop: &Path, policy: String) -> String {
    format!(
        "{}{}{}",
        sql_catalog(lake),
        kms(&interop.join("keyring.json")),
        policy
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
    let config = sql_config(&lake, &interop, policy(dir.path(), "spark.db.enc"));
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
    // Columns without a `write` list: nobody writes them, so neither an INSERT nor a
    // DELETE (which rewrites every column) runs. Refused in one line, the table unchanged.
    for sql in [
        "INSERT INTO spark.db.enc (id) VALUES (1)",
        "DELETE FROM spark.db.enc WHERE id = 1",
    ] {
        let err = query_err(&admin, sql).await;
        assert!(
            err.contains("spark.db.enc") && err.contains("write denied"),
            "{sql}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
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
    let config = sql_config(&lake, &interop, policy(dir.path(), "other.db.enc"));
    let unnamed = engine(dir.path(), &config).await;
    let err = query_err(&unnamed.session("admin"), "SELECT id FROM spark.db.enc").await;
    assert!(
        err.contains("does not name this table") && err.contains(&format!("'{key_id}'")),
        "{err}"
    );
    // Nor written: the table-level denial holds for writes (admin may create tables).
    let err = query_err(
        &unnamed.session("admin"),
        "INSERT INTO spark.db.sink (id) VALUES (-1)",
    )
    .await;
    assert!(err.contains("does not name this table"), "{err}");
    // A SQL catalog row naming a metadata file whose name does not carry its hash (Spark's
    // own name): not trusted, since whoever writes the warehouse could rewrite the file.
    let err = query_err(
        &unnamed.session("admin"),
        "SELECT count(*) FROM spark.db.unanchored",
    )
    .await;
    assert!(
        err.contains("spark.db.unanchored") || err.contains("db.unanchored"),
        "{err}"
    );
    assert!(err.contains("carries its SHA-256"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // Metadata claiming table key `pii_key` whose key encryption keys `finance_key` wraps
    // (a policy on `pii_key` would pass): the keys are not unwrapped under another key.
    let dir = tempfile::tempdir().unwrap();
    let config = sql_config(&lake, &interop, policy(dir.path(), "spark.db.rekeyed"));
    let rekeyed = engine(dir.path(), &config).await;
    let err = query_err(&rekeyed.session("admin"), "SELECT id FROM spark.db.rekeyed").await;
    assert!(
        err.contains(&format!(
            "wrapped by key '{key_id}', not by its table key 'pii_key'"
        )),
        "{err}"
    );
    // A column no rule names is denied, even to admin; the named ones read.
    let dir = tempfile::tempdir().unwrap();
    let config = sql_config(
        &lake,
        &interop,
        policy_with(dir.path(), "spark.db.enc", |text| {
            let cut = text
                .find("[tables.\"spark.db.enc\".columns.amount]")
                .unwrap();
            let end = cut + text[cut..].find("\n[").unwrap() + 1;
            format!("{}{}", &text[..cut], &text[end..])
        }),
    );
    let partial = engine(dir.path(), &config).await;
    let admin = partial.session("admin");
    let err = query_err(&admin, "SELECT id, amount FROM spark.db.enc").await;
    assert!(err.contains("amount") && err.contains("denied"), "{err}");
    assert!(
        query(&admin, "SELECT id, name FROM spark.db.enc")
            .await
            .is_ok()
    );
    // A rule declaring another master key than the table's: the table is denied.
    let dir = tempfile::tempdir().unwrap();
    let config = sql_config(
        &lake,
        &interop,
        policy_with(dir.path(), "spark.db.enc", |text| {
            text.replace(
                "[tables.\"spark.db.enc\".columns.name]\n",
                "[tables.\"spark.db.enc\".columns.name]\nmaster_key = \"other_key\"\n",
            )
        }),
    );
    let other = engine(dir.path(), &config).await;
    let err = query_err(&other.session("admin"), "SELECT id FROM spark.db.enc").await;
    assert!(
        err.contains("'other_key'") && err.contains(&format!("table key '{key_id}'")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
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

/// Cluster workers scan a table Iceberg encrypts: each loads it from its own catalog and
/// unwraps its keys with its own KMS, decrypting manifests and files there; the answers,
/// masks and refusals equal the single node's, and the last snapshot equals Spark's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_scan_a_table_iceberg_encrypts_as_one_node_does() {
    let (Some(lake), Some(interop)) = (native_lake(), interop_dir()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = sql_config(&lake, &interop, policy(dir.path(), "spark.db.enc"));
    let single = engine(dir.path(), &config).await;
    let (coordinator, workers) = cluster_of(&dir.path().join("clearice.toml"), "").await;
    let e = expected(&lake);
    let snapshots = e["enc"]["snapshots"].as_array().unwrap();
    let first = snapshots[0]["snapshot_id"].as_i64().unwrap();
    let queries = [
        "SELECT id, region, name FROM spark.db.enc ORDER BY id".to_owned(),
        "SELECT region, count(*), sum(amount) FROM spark.db.enc GROUP BY region ORDER BY region"
            .to_owned(),
        format!("SELECT id, name FROM spark.db.enc FOR VERSION AS OF {first} ORDER BY id"),
        "SELECT count(*) FROM spark.db.enc WHERE id > 2".to_owned(),
    ];
    for principal in ["admin", "analyst"] {
        for sql in &queries {
            let run = |engine: Arc<clearice_engine::Engine>| async move {
                match query(&engine.session(principal), sql).await {
                    Ok(b) => Ok(json_rows(&b)),
                    Err(e) => Err(e.to_string()),
                }
            };
            let want = run(Arc::clone(&single)).await;
            let got = run(Arc::clone(&coordinator)).await;
            assert_eq!(got, want, "{principal}: {sql}");
        }
    }
    let plan = explain(&coordinator, "analyst", &queries[0]).await;
    assert!(
        plan.contains("RemoteScanExec") && plan.contains("name=null"),
        "{plan}"
    );
    let (cols, want) = spark_rows(snapshots.last().unwrap());
    let quoted: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
    let got = json_rows(
        &query(
            &coordinator.session("admin"),
            &format!("SELECT {} FROM spark.db.enc ORDER BY id", quoted.join(", ")),
        )
        .await
        .unwrap(),
    );
    assert_eq!(got, want);
    drop(workers);
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

/// A plaintext Parquet file (one string column) of exactly `size` bytes.
fn plaintext_parquet_of_size(size: usize) -> Vec<u8> {
    use datafusion::arrow::array::{RecordBatch, StringArray};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
    let write = |n: usize| {
        let batch = RecordBatch::try_from_iter([(
            "id",
            Arc::new(StringArray::from(vec!["x".repeat(n)])) as _,
        )])
        .unwrap();
        let props = WriterProperties::builder()
            .set_statistics_enabled(EnabledStatistics::None)
            .set_dictionary_enabled(false)
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        out
    };
    let base = write(0).len();
    assert!(base <= size, "{base} > {size}");
    // Each byte of the value adds a byte or, across a varint boundary, two.
    ((size - base).saturating_sub(16)..=size - base)
        .map(write)
        .find(|b| b.len() == size)
        .expect("a plaintext file of that size")
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
    let config = sql_config(&lake, &interop, policy(dir.path(), "spark.db.tamper"));
    let engine = engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let sql = "SELECT id, region, name, amount FROM spark.db.tamper ORDER BY id";
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
    // A plaintext Parquet file of the same size in a data file's place (forged rows): its
    // manifest gives it a key, so a file without encryption is refused.
    let target = &data[0];
    let original = std::fs::read(target).unwrap();
    std::fs::write(target, plaintext_parquet_of_size(original.len())).unwrap();
    let result = query(&admin, sql).await;
    std::fs::write(target, &original).unwrap();
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("not encrypted")
            && err.contains(target.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
    // Restored, the table reads as before.
    assert_eq!(json_rows(&query(&admin, sql).await.unwrap()), before);

    // Through the Hive metastore, a metadata file that is not the one the metastore
    // hashed is refused (one more byte at its end: still valid JSON).
    let Some((cp, _)) = java_peer("CLEARICE_HMS_CP") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hms = dir.path().join("hms");
    copy_dir(&lake.join("hms"), &hms);
    let (_metastore, uri) = start_metastore(&cp, &hms);
    let config = format!(
        "[catalogs.hive]\ntype = \"hms\"\nuri = \"{uri}\"\n{}{}",
        kms(&interop.join("keyring.json")),
        policy(dir.path(), "hive.db.tamper")
    );
    let engine = crate::common::engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let hive_sql = "SELECT count(*) FROM hive.db.tamper";
    let count = json_rows(&query(&admin, hive_sql).await.unwrap());
    assert_eq!(count[0][0].as_u64().unwrap() as usize, before.len());
    let path = PathBuf::from(
        expected(&lake)["tamper"]["on_disk"]["metadata"]
            .as_str()
            .unwrap(),
    );
    let original = std::fs::read(&path).unwrap();
    let mut swapped = original.clone();
    swapped.push(b'\n');
    std::fs::write(&path, swapped).unwrap();
    let result = query(&admin, hive_sql).await;
    std::fs::write(&path, original).unwrap();
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("might have been modified") && err.contains("metadata_hash"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// [`policy`] for table `t` with `write` lists on its columns, and tables `more` (columns
/// id, region, name, amount) as well.
fn writable_policy_and(dir: &Path, t: &str, more: &[&str]) -> String {
    policy_with(dir, t, |text| {
        let more: String = more.iter().map(|t| writable_policy_tables(t)).collect();
        // The written tables have no `note` (its section is the last).
        let text = &text[..text
            .find(&format!("[tables.\"{t}\".columns.note]"))
            .unwrap()];
        more + &text
            .replace(
                "access = { \"*\" = \"plaintext\" }\n",
                "access = { \"*\" = \"plaintext\" }\nwrite = [\"admin\"]\n",
            )
            .replace(
                "access = { admin = \"plaintext\", analyst = \"null\" }\n",
                "access = { admin = \"plaintext\", analyst = \"null\" }\nwrite = [\"admin\"]\n",
            )
            .replace(
                "access = { admin = \"plaintext\", analyst = \"deny\" }\n",
                "access = { admin = \"plaintext\", analyst = \"deny\" }\nwrite = [\"admin\"]\n",
            )
    })
}

/// The policy text of [`writable_policy`] for one more table `t` (appended to a policy).
fn writable_policy_tables(t: &str) -> String {
    let mut out = String::new();
    for c in ["id", "region", "name", "amount"] {
        out.push_str(&format!(
            "[tables.\"{t}\".columns.{c}]\naccess = {{ \"*\" = \"plaintext\" }}\nwrite = [\"admin\"]\n"
        ));
    }
    out
}

/// Checks `table` (a directory) is as Iceberg Java writes a table it encrypts: every data
/// file PME ("PARE" at both ends), every manifest and manifest list an AES-GCM stream
/// ("AGS1"), the current snapshot (operation `operation`) naming its manifest list's
/// key; returns the current metadata file.
fn check_as_iceberg_writes(table: &Path, operation: &str) -> PathBuf {
    let metadata_path = latest_metadata(table);
    let metadata: Value =
        serde_json::from_str(&std::fs::read_to_string(&metadata_path).unwrap()).unwrap();
    assert_eq!(metadata["format-version"], 3);
    let current = metadata["current-snapshot-id"].as_i64().unwrap();
    let snapshot = metadata["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap()
        .clone();
    let key_id = snapshot["key-id"].as_str().unwrap();
    assert!(
        metadata["encryption-keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["key-id"] == key_id),
        "{metadata}"
    );
    assert_eq!(snapshot["summary"]["operation"], operation);
    let list = snapshot["manifest-list"]
        .as_str()
        .unwrap()
        .trim_start_matches("file:");
    assert_eq!(&std::fs::read(list).unwrap()[..4], b"AGS1");
    let mut data = 0;
    for entry in walk(table) {
        let name = entry.to_str().unwrap();
        let bytes = std::fs::read(&entry).unwrap();
        if name.ends_with(".parquet") {
            assert_eq!(&bytes[bytes.len() - 4..], b"PARE", "{name}");
            assert_eq!(&bytes[..4], b"PARE", "{name}");
            data += 1;
        } else if name.ends_with(".avro") {
            assert_eq!(&bytes[..4], b"AGS1", "{name}");
        }
    }
    assert!(data >= 1, "no data files in {}", table.display());
    metadata_path
}

/// The newest metadata file of the table in directory `table`.
fn latest_metadata(table: &Path) -> PathBuf {
    std::fs::read_dir(table.join("metadata"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".metadata.json"))
        .max_by_key(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.split('-').next().unwrap().parse::<u64>().unwrap()
        })
        .unwrap()
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearice_appends_to_a_table_iceberg_encrypts_and_spark_reads_it_back() {
    // On the heap: the test's future is larger than a test thread's stack.
    Box::pin(appends_and_spark_reads_back()).await;
}

async fn appends_and_spark_reads_back() {
    let (Some(lake), Some(interop), Some((cp, _))) =
        (native_lake(), interop_dir(), java_peer("CLEARICE_HMS_CP"))
    else {
        return;
    };
    let (Ok(python), Ok(jar)) = (
        std::env::var("CLEARICE_PYTHON"),
        std::env::var("CLEARICE_SPARK_ICEBERG_JAR"),
    ) else {
        assert!(
            std::env::var_os("CLEARICE_REQUIRE_FIXTURES").is_none(),
            "CLEARICE_PYTHON and CLEARICE_SPARK_ICEBERG_JAR must be set"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keyring = interop.join("keyring.json");
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&keyring),
        writable_policy_and(dir.path(), "spark.db.sink", &["spark.db.dvt"])
    );
    let engine = engine(dir.path(), &config).await;
    let admin = engine.session("admin");
    let sql = "SELECT id, region, name, CAST(amount AS VARCHAR) FROM spark.db.sink ORDER BY id";
    let mut want = json_rows(&query(&admin, sql).await.unwrap());
    assert!(want.len() >= 50, "{} rows", want.len());
    // New ids after whatever an earlier run appended.
    let base = want.iter().map(|r| r[0].as_i64().unwrap()).max().unwrap() + 1;
    let values: Vec<String> = (0..5)
        .map(|i| {
            let id = base + i;
            let name = if i == 2 {
                "NULL".to_owned()
            } else {
                format!("'w{id}'")
            };
            format!("({id}, 'EU', {name}, {id}.50)")
        })
        .collect();
    let done = query(
        &admin,
        &format!("INSERT INTO spark.db.sink VALUES {}", values.join(", ")),
    )
    .await
    .unwrap();
    let count = datafusion::arrow::compute::cast(
        done[0].column(0),
        &datafusion::arrow::datatypes::DataType::Int64,
    )
    .unwrap();
    assert_eq!(
        json_rows(&[datafusion::arrow::array::RecordBatch::try_from_iter([("n", count)]).unwrap()]),
        vec![vec![Value::from(5)]]
    );
    for i in 0..5 {
        let id = base + i;
        let name = if i == 2 {
            Value::Null
        } else {
            Value::from(format!("w{id}"))
        };
        want.push(vec![
            Value::from(id),
            Value::from("EU"),
            name,
            Value::from(format!("{id}.50")),
        ]);
    }
    // ClearIce reads its own append (a new engine: nothing cached).
    let again = self::engine(dir.path(), &config).await;
    assert_eq!(
        json_rows(&query(&again.session("admin"), sql).await.unwrap()),
        want
    );
    let sink_metadata = check_as_iceberg_writes(&lake.join("warehouse/db.db/sink"), "append");

    // CREATE TABLE with a table key, then INSERT; CREATE TABLE AS: both tables Iceberg
    // encrypts (format 3), their first key encryption key wrapped by the KMS's table key.
    let made = format!("made_{:08x}", rand::random::<u32>());
    let ctas = format!("{made}_ctas");
    let dml = format!("{made}_dml");
    let dir2 = tempfile::tempdir().unwrap();
    let config2 = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&keyring),
        writable_policy_and(
            dir2.path(),
            &format!("spark.db.{made}"),
            &[&format!("spark.db.{ctas}"), &format!("spark.db.{dml}")]
        )
    );
    let creator = crate::common::engine(dir2.path(), &config2).await;
    let admin2 = creator.session("admin");
    // A table key the KMS does not have, a format below 3, a table the policy does not
    // name (nobody could read it): refused, nothing created.
    let unnamed = format!("{made}_unnamed");
    for (t, with, needle) in [
        (
            &made,
            "\"encryption.key-id\" = 'no_such_key'",
            "does not have this key",
        ),
        (
            &made,
            "\"encryption.key-id\" = 'finance_key', \"format-version\" = '2'",
            "format-version 2",
        ),
        (
            &unnamed,
            "\"encryption.key-id\" = 'finance_key'",
            "the policy does not name table",
        ),
    ] {
        let err = query_err(
            &admin2,
            &format!("CREATE TABLE spark.db.{t} (id BIGINT) WITH ({with})"),
        )
        .await;
        assert!(err.contains(needle) && err.contains(t.as_str()), "{err}");
        let listed = json_rows(
            &query(
                &admin2,
                &format!("SELECT count(*) FROM information_schema.tables WHERE table_name = '{t}'"),
            )
            .await
            .unwrap(),
        );
        assert_eq!(listed[0][0].as_i64(), Some(0), "{t} was created");
    }
    query(
        &admin2,
        &format!(
            "CREATE TABLE spark.db.{made} (id BIGINT, region VARCHAR, name VARCHAR, amount DECIMAL(10,2)) \
             WITH (\"encryption.key-id\" = '{key}')",
            key = expected(&lake)["enc"]["key_id"].as_str().unwrap()
        ),
    )
    .await
    .unwrap();
    query(
        &admin2,
        &format!(
            "INSERT INTO spark.db.{made} VALUES (1, 'EU', 'a', 1.50), (2, 'US', NULL, 2.25), (3, 'EU', 'c', 0.00)"
        ),
    )
    .await
    .unwrap();
    query(
        &admin2,
        &format!(
            "CREATE TABLE spark.db.{ctas} WITH (\"encryption.key-id\" = '{key}') AS \
             SELECT * FROM (VALUES (CAST(10 AS BIGINT), 'APAC', 'x', CAST(9.99 AS DECIMAL(10,2))), \
             (CAST(11 AS BIGINT), 'US', 'y', CAST(0.01 AS DECIMAL(10,2)))) AS v(id, region, name, amount)",
            key = expected(&lake)["enc"]["key_id"].as_str().unwrap()
        ),
    )
    .await
    .unwrap();
    // DELETE, UPDATE and INSERT OVERWRITE on a table Iceberg encrypts: the files they
    // rewrite get new keys, the rows they copy keep their row ids (format 3 lineage).
    let key = expected(&lake)["enc"]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for sql in [
        format!(
            "CREATE TABLE spark.db.{dml} (id BIGINT, region VARCHAR, name VARCHAR, amount DECIMAL(10,2)) \
             WITH (\"encryption.key-id\" = '{key}')"
        ),
        format!(
            "INSERT INTO spark.db.{dml} VALUES (1, 'EU', 'a', 1.00), (2, 'US', 'b', 2.00), (3, 'EU', 'c', 3.00), \
             (4, 'US', 'd', 4.00), (5, 'EU', NULL, 5.00), (6, 'APAC', 'f', 6.00)"
        ),
        format!("INSERT INTO spark.db.{dml} VALUES (7, 'EU', 'g', 7.00), (8, 'US', 'h', 8.00)"),
        format!("DELETE FROM spark.db.{dml} WHERE id = 2"),
        format!("UPDATE spark.db.{dml} SET name = 'u', amount = amount + 0.50 WHERE id IN (4, 8)"),
        format!(
            "MERGE INTO spark.db.{dml} t USING (SELECT * FROM (VALUES (CAST(3 AS BIGINT), 'z'), \
             (CAST(9 AS BIGINT), 'new')) AS v(id, name)) s ON t.id = s.id \
             WHEN MATCHED THEN UPDATE SET name = s.name \
             WHEN NOT MATCHED THEN INSERT (id, region, name, amount) VALUES (s.id, 'EU', s.name, 9.00)"
        ),
        format!("INSERT OVERWRITE spark.db.{ctas} VALUES (20, 'EU', 'o', 1.25)"),
    ] {
        query(&admin2, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let row = |id: i64, region: &str, name: Option<&str>, amount: &str| {
        vec![
            Value::from(id),
            Value::from(region),
            name.map_or(Value::Null, Value::from),
            Value::from(amount),
        ]
    };
    let want_made = vec![
        row(1, "EU", Some("a"), "1.50"),
        row(2, "US", None, "2.25"),
        row(3, "EU", Some("c"), "0.00"),
    ];
    let want_ctas = vec![row(20, "EU", Some("o"), "1.25")];
    let want_dml = vec![
        row(1, "EU", Some("a"), "1.00"),
        row(3, "EU", Some("z"), "3.00"),
        row(4, "US", Some("u"), "4.50"),
        row(5, "EU", None, "5.00"),
        row(6, "APAC", Some("f"), "6.00"),
        row(7, "EU", Some("g"), "7.00"),
        row(8, "US", Some("u"), "8.50"),
        row(9, "EU", Some("new"), "9.00"),
    ];
    let reader = crate::common::engine(dir2.path(), &config2).await;
    let mut locations = Vec::new();
    for (t, want, operation) in [
        (&made, &want_made, "append"),
        (&ctas, &want_ctas, "overwrite"),
        (&dml, &want_dml, "overwrite"),
    ] {
        let got = json_rows(
            &query(
                &reader.session("admin"),
                &format!(
                    "SELECT id, region, name, CAST(amount AS VARCHAR) FROM spark.db.{t} ORDER BY id"
                ),
            )
            .await
            .unwrap(),
        );
        assert_eq!(&got, want, "{t}");
        let files = json_rows(
            &query(
                &reader.session("admin"),
                &format!("SELECT file_path FROM spark.db.\"{t}$files\" LIMIT 1"),
            )
            .await
            .unwrap(),
        );
        let file = PathBuf::from(files[0][0].as_str().unwrap().trim_start_matches("file:"));
        let table_dir = file.parent().unwrap().parent().unwrap().to_owned();
        locations.push(check_as_iceberg_writes(&table_dir, operation));
    }

    // A table Spark wrote, one file with a deletion vector: ClearIce's DELETE and UPDATE
    // rewrite the file (skipping the rows the vector deletes); Spark reads the table
    // before and after.
    let dvt_dir = lake.join("warehouse/db.db/dvt");
    let dvt_before = latest_metadata(&dvt_dir);
    let live = json_rows(
        &query(&admin, "SELECT id FROM spark.db.dvt ORDER BY id")
            .await
            .unwrap(),
    );
    assert!(live.len() >= 3, "{live:?}");
    let victim = live[0][0].as_i64().unwrap();
    let updated = live[live.len() - 1][0].as_i64().unwrap();
    for sql in [
        format!("DELETE FROM spark.db.dvt WHERE id = {victim}"),
        format!("UPDATE spark.db.dvt SET amount = amount + 1 WHERE id = {updated}"),
    ] {
        query(&admin, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let dvt_after = check_as_iceberg_writes(&dvt_dir, "overwrite");

    // Spark registers the metadata files ClearIce committed in its Hive catalog and reads
    // the same rows.
    let hms = dir.path().join("hms");
    copy_dir(&lake.join("hms"), &hms);
    let (_metastore, uri) = start_metastore(&cp, &hms);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/spark_native_read.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args([
            jar.as_str(),
            lake.join("clearice-test-kms.jar").to_str().unwrap(),
            keyring.to_str().unwrap(),
            uri.as_str(),
            lake.join("warehouse").to_str().unwrap(),
            &format!("sink_from_clearice=file://{}", sink_metadata.display()),
            &format!("{made}=file://{}", locations[0].display()),
            &format!("{ctas}=file://{}", locations[1].display()),
            &format!("{dml}=file://{}", locations[2].display()),
            &format!("dvt_before=file://{}", dvt_before.display()),
            &format!("dvt_after=file://{}", dvt_after.display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "spark_native_read.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout.rsplit("RESULT ").next().unwrap();
    let spark: Value = serde_json::from_str(result.trim()).unwrap();
    for (t, want, operation) in [
        ("sink_from_clearice", &want, "append"),
        (made.as_str(), &want_made, "append"),
        (ctas.as_str(), &want_ctas, "overwrite"),
        (dml.as_str(), &want_dml, "overwrite"),
    ] {
        let rows: Vec<Vec<Value>> = serde_json::from_value(spark[t]["rows"].clone()).unwrap();
        assert_eq!(&rows, want, "Spark's rows of {t}, which ClearIce wrote");
        assert_eq!(
            spark[t]["operations"].as_array().unwrap().last().unwrap(),
            operation
        );
    }
    // Row lineage as Spark reads it: [id, _row_id, _last_updated_sequence_number]. The
    // first INSERT (sequence number 1) gave ids 1..6 row ids 0..5, the second (2) ids 7, 8
    // row ids 6, 7; the DELETE (3) copied rows, which kept both; the UPDATE (4) and the
    // MERGE (5) kept the updated rows' ids and gave them their sequence number; the row
    // the MERGE inserted has a new id.
    let lineage = |id: i64, row_id: i64, seq: i64| vec![id, row_id, seq];
    let mut got: Vec<Vec<i64>> =
        serde_json::from_value(spark[dml.as_str()]["lineage"].clone()).unwrap();
    let inserted = got.pop().unwrap();
    assert_eq!(
        got,
        vec![
            lineage(1, 0, 1),
            lineage(3, 2, 5),
            lineage(4, 3, 4),
            lineage(5, 4, 1),
            lineage(6, 5, 1),
            lineage(7, 6, 2),
            lineage(8, 7, 4),
        ],
        "Spark's row lineage of {dml}"
    );
    assert!(
        inserted[0] == 9 && inserted[1] > 7 && inserted[2] == 5,
        "the row MERGE inserted: {inserted:?}"
    );
    assert_eq!(
        spark[dml.as_str()]["operations"],
        serde_json::json!(["append", "append", "overwrite", "overwrite", "overwrite"])
    );
    // The Spark table ClearIce rewrote: the same rows but the one deleted and the one
    // updated; every other row keeps its row id and sequence number, the updated one its
    // row id with the UPDATE's sequence number; the vector of the rewritten file is gone.
    let (before, after) = (&spark["dvt_before"], &spark["dvt_after"]);
    let fresh = before["operations"].as_array().unwrap().len() == 2;
    if fresh {
        assert!(before["dvs"].as_i64().unwrap() >= 1, "{before}");
    }
    assert_eq!(after["dvs"], 0, "{after}");
    assert_eq!(after["dangling_dvs"], 0, "{after}");
    let mut want_rows: Vec<Vec<Value>> = serde_json::from_value(before["rows"].clone()).unwrap();
    want_rows.retain(|r| r[0].as_i64() != Some(victim));
    for r in want_rows
        .iter_mut()
        .filter(|r| r[0].as_i64() == Some(updated))
    {
        let amount: f64 = r[3].as_str().unwrap().parse().unwrap();
        r[3] = Value::from(format!("{:.2}", amount + 1.0));
    }
    let got_rows: Vec<Vec<Value>> = serde_json::from_value(after["rows"].clone()).unwrap();
    assert_eq!(
        got_rows, want_rows,
        "Spark's rows of dvt after ClearIce's DELETE and UPDATE"
    );
    let lineage_of =
        |v: &Value| -> Vec<Vec<i64>> { serde_json::from_value(v["lineage"].clone()).unwrap() };
    let (was, now) = (lineage_of(before), lineage_of(after));
    let newest = was.iter().map(|r| r[2]).max().unwrap();
    assert_eq!(now.len(), was.len() - 1, "{now:?}");
    for row in &now {
        let old = was.iter().find(|r| r[0] == row[0]).unwrap();
        assert_eq!(row[1], old[1], "row id of {} kept: {now:?}", row[0]);
        if row[0] == updated {
            assert!(row[2] > newest, "updated row's sequence number: {now:?}");
        } else {
            assert_eq!(
                row[2], old[2],
                "sequence number of {} kept: {now:?}",
                row[0]
            );
        }
    }

    // What ClearIce does not write (yet), and who may not: refused in one line.
    for (who, sql, needle) in [
        (
            "analyst",
            "INSERT INTO spark.db.sink (id) VALUES (-1)",
            "write denied",
        ),
        (
            "admin",
            "ALTER TABLE spark.db.sink ADD COLUMN extra INT",
            "ALTER TABLE of a table Iceberg encrypts itself",
        ),
    ] {
        let err = query_err(&engine.session(who), sql).await;
        assert!(
            err.contains(needle) && err.contains("spark.db.sink"),
            "{sql}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // A column without a `write` list: admin may not write values into it.
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}{}",
        sql_catalog(&lake),
        kms(&keyring),
        policy(dir.path(), "spark.db.sink")
    );
    let unlisted = self::engine(dir.path(), &config).await;
    let err = query_err(
        &unlisted.session("admin"),
        "INSERT INTO spark.db.sink VALUES (-1, 'EU', 'x', 1.00)",
    )
    .await;
    assert!(
        err.contains("write denied") || err.contains("NULL"),
        "{err}"
    );
    let n = json_rows(
        &query(
            &again.session("admin"),
            "SELECT count(*) FROM spark.db.sink",
        )
        .await
        .unwrap(),
    );
    assert_eq!(n[0][0].as_u64().unwrap() as usize, want.len());
}
