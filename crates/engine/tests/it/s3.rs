//! Lakes in S3-compatible object storage: a real S3 server (`moto_server` from PyPI) on a
//! loopback port, started here and stopped afterwards. PyIceberg commits the
//! PyArrow-encrypted interop lake into a bucket; ClearIce reads it, standalone files and
//! PyArrow's external key material from S3, writes the demo lake to S3 (read back by
//! PyIceberg + PyArrow), counts its requests, and names the store when S3 fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clearice_demo::{self as demo, DemoOptions};
use clearice_engine::{Config, Engine, S3Options};
use serde_json::Value;

use crate::common::*;

const SCRIPT: &str = "s3_lake.py";

/// The demo lake written by ClearIce into `s3://demo/lake` on `endpoint` (moto's key pair).
async fn demo_on_s3(endpoint: &str, dir: &Path) -> PathBuf {
    let s3 = S3Options {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some(clearice_storage::Secret::new("testing")),
        ..Default::default()
    };
    demo::init_with(
        dir,
        DemoOptions {
            warehouse: Some("s3://demo/lake".into()),
            s3,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// `[storage.s3]` for the moto server (moto takes any key pair).
fn storage_section(dir: &Path, endpoint: &str) -> String {
    format!(
        "[storage.s3]\nendpoint = \"{endpoint}\"\n{}",
        credentials(dir)
    )
}

/// The credential lines of `[storage.s3]` (the secret in a file).
fn credentials(dir: &Path) -> String {
    let secret = dir.join("s3.secret");
    std::fs::write(&secret, "testing").unwrap();
    format!(
        "access_key_id = \"testing\"\nsecret_access_key_file = \"{}\"\n",
        secret.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_lake_side_files_and_standalone_files_read_from_s3() {
    let (Some(interop), Some(python)) = (interop_dir(), python()) else {
        return;
    };
    let (_moto, endpoint) = start_moto(&python);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pyiceberg");
    let mf = make_fixtures();
    let lake = run_python(
        &python,
        SCRIPT,
        &[
            "setup",
            mf.to_str().unwrap(),
            &endpoint,
            "lake",
            interop.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    let config = format!(
        "[catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{}\"\nwarehouse = \"{}\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n{}",
        lake["catalog_db"].as_str().unwrap(),
        lake["warehouse"].as_str().unwrap(),
        interop.join("keyring.json").display(),
        storage_section(tmp.path(), &endpoint)
    );
    let engine = engine(tmp.path(), &config).await;

    // Reads are coalesced: a full scan of 3 files (7 row groups x 9 leaf columns = 63
    // column chunks, with their pages) takes one ranged GET per row group, plaintext and
    // encrypted chunks together, not one per chunk or page. Counted at the HTTP client,
    // metadata (manifests) included.
    let ctx = engine.session("tester");
    let before = engine.storage_requests();
    let rows = json_rows(
        &query(
            &ctx,
            "SELECT count(*), count(ssn), count(tags) FROM (SELECT * FROM lake.sales.customers) t",
        )
        .await
        .unwrap(),
    );
    let after = engine.storage_requests();
    assert_eq!(rows[0][0], Value::from(10_000));
    let gets = after.get - before.get;
    eprintln!(
        "full scan of lake.sales.customers on S3: {gets} GETs, {} HEADs",
        after.head - before.head
    );
    assert!(gets >= 3, "{gets} GETs: the files were not read from S3");
    // 4 metadata files, 3 footers, then one GET per row group (7) for all its chunks.
    assert!(
        gets <= 16,
        "{gets} GETs for 63 column chunks: reads are not coalesced"
    );

    assert_expected(&engine, &interop, "lake.sales.customers", "tester").await;
    assert_expected(
        &engine,
        &interop,
        "'s3://lake/files/columns.parquet'",
        "tester",
    )
    .await;
    // PyArrow wrote the key material to a side file next to the data file, on S3.
    assert_expected(
        &engine,
        &interop,
        "'s3://lake/files/external.parquet'",
        "tester",
    )
    .await;

    // Failures name the store and the object, in one line, without the secret.
    let e = query_err(&ctx, "SELECT * FROM 's3://lake/files/missing.parquet'").await;
    assert!(e.contains("missing.parquet") && !e.contains('\n'), "{e}");
    let e = query_err(&ctx, "SELECT * FROM 's3://no-such-bucket/x.parquet'").await;
    assert!(e.contains("no-such-bucket") && !e.contains('\n'), "{e}");
    assert!(!e.contains("testing\""), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_lake_written_to_s3_reads_back_in_clearice_and_pyarrow() {
    let (Some(_), Some(python)) = (interop_dir(), python()) else {
        return;
    };
    let (_moto, endpoint) = start_moto(&python);
    let mf = make_fixtures();
    // An empty bucket (boto3, as a user would create it).
    make_bucket(&python, &endpoint, "demo");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let config_path = demo_on_s3(&endpoint, &dir).await;
    assert!(
        !dir.join("warehouse").exists(),
        "data went to the local disk"
    );
    // The written config names the endpoint; the credentials are the user's to give.
    let text = std::fs::read_to_string(&config_path).unwrap();
    assert!(
        text.contains(&format!("endpoint = \"{endpoint}\"")),
        "{text}"
    );
    assert!(!text.contains("testing"), "{text}");
    let text = text.replace(
        "[storage.s3]\n",
        &format!("[storage.s3]\n{}", credentials(tmp.path())),
    );
    std::fs::write(&config_path, text).unwrap();
    let engine = Engine::open(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let ctx = engine.session("admin");
    let ours = json_rows(
        &query(
            &ctx,
            "SELECT count(*), sum(id), count(ssn) FROM lake.sales.customers",
        )
        .await
        .unwrap(),
    );
    assert_eq!(ours[0][0], Value::from(demo::CUSTOMERS as i64));
    // Masked for an analyst, as on local disk.
    let masked = json_rows(
        &query(
            &engine.session("analyst"),
            "SELECT ssn FROM lake.sales.customers WHERE ssn IS NOT NULL LIMIT 1",
        )
        .await
        .unwrap(),
    );
    assert!(
        masked[0][0].as_str().unwrap().starts_with("XXX-XX-"),
        "{masked:?}"
    );

    // PyIceberg plans the snapshot ClearIce committed; PyArrow decrypts every file from S3.
    let back = run_python(
        &python,
        SCRIPT,
        &[
            "readback",
            mf.to_str().unwrap(),
            &endpoint,
            dir.join("catalog.db").to_str().unwrap(),
            "s3://demo/lake",
            "sales.customers",
            dir.join("keyring.json").to_str().unwrap(),
        ],
    );
    assert_eq!(back["rows"], Value::from(demo::CUSTOMERS as i64));
    assert_eq!(back["sums"]["id"], ours[0][1]);
    assert!(
        back["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.as_str().unwrap().starts_with("s3://demo/lake/")),
        "{back}"
    );
}

#[tokio::test]
async fn unreachable_s3_endpoint_is_one_line_naming_the_table() {
    let Some(python) = python() else { return };
    let (_moto, endpoint) = start_moto(&python);
    make_bucket(&python, &endpoint, "demo");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let config_path = demo_on_s3(&endpoint, &dir).await;
    // The server goes away: the catalog (SQLite) still lists the tables; reading them
    // fails in one line naming the table and the object store.
    drop(_moto);
    let dead = format!("http://127.0.0.1:{}", free_port());
    let text = std::fs::read_to_string(&config_path)
        .unwrap()
        .replace(&endpoint, &dead)
        .replace(
            "[storage.s3]\n",
            &format!("[storage.s3]\n{}", credentials(tmp.path())),
        );
    std::fs::write(&config_path, text).unwrap();
    let engine = Engine::open(Config::load(&config_path).unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let e = query_err(
        &engine.session("admin"),
        "SELECT count(*) FROM lake.sales.customers",
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        e.contains("lake.sales.customers") || e.contains("sales.customers"),
        "{e}"
    );
    assert!(e.contains("s3://demo/lake") && !e.contains('\n'), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_endpoint_with_a_private_ca() {
    let (Some(interop), Some(python)) = (interop_dir(), python()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let tls = tmp.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let made = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/tests/python/remote_client.py"))
        .arg("tlsgen")
        .arg(&tls)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (_moto, endpoint) = start_moto_with(
        &python,
        Some((&tls.join("server.pem"), &tls.join("server.key"))),
        &[],
    );
    assert!(endpoint.starts_with("https://"));
    let up = Command::new(&python)
        .args([
            "-c",
            &format!(
                "import boto3; c = boto3.client('s3', endpoint_url='{endpoint}', verify='{ca}', \
                 aws_access_key_id='testing', aws_secret_access_key='testing', region_name='us-east-1'); \
                 c.create_bucket(Bucket='tls'); c.upload_file('{file}', 'tls', 'columns.parquet')",
                ca = tls.join("ca.pem").display(),
                file = interop.join("columns.parquet").display()
            ),
        ])
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let keyring = interop.join("keyring.json");
    let base = format!(
        "[kms]\ntype = \"keyring\"\npath = \"{}\"\n{}",
        keyring.display(),
        storage_section(tmp.path(), &endpoint)
    );
    // Not trusted without the CA: one line naming the object.
    let engine1 = engine_at(tmp.path(), "untrusted.toml", &base).await;
    let e = query_err(
        &engine1.session("tester"),
        "SELECT count(*) FROM 's3://tls/columns.parquet'",
    )
    .await;
    assert!(
        e.contains("s3://tls/columns.parquet") && !e.contains('\n'),
        "{e}"
    );
    assert!(e.contains("certificate"), "{e}");
    let trusted = format!("{base}ca_file = \"{}\"\n", tls.join("ca.pem").display());
    let engine2 = engine_at(tmp.path(), "trusted.toml", &trusted).await;
    let rows = json_rows(
        &query(
            &engine2.session("tester"),
            "SELECT count(*), count(ssn) FROM 's3://tls/columns.parquet'",
        )
        .await
        .unwrap(),
    );
    assert_eq!(rows[0][0], Value::from(10_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_s3_credentials_are_one_line_without_the_secret() {
    let (Some(interop), Some(python)) = (interop_dir(), python()) else {
        return;
    };
    // moto checks signatures against its IAM after the first three requests (which
    // create the user, its key and its policy).
    let (_moto, endpoint) =
        start_moto_with(&python, None, &[("INITIAL_NO_AUTH_ACTION_COUNT", "3")]);
    let out = Command::new(&python)
        .args([
            "-c",
            &format!(
                r#"
import boto3, json
E = "{endpoint}"
iam = boto3.client("iam", endpoint_url=E, aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
iam.create_user(UserName="lake")
k = iam.create_access_key(UserName="lake")["AccessKey"]
iam.put_user_policy(UserName="lake", PolicyName="all", PolicyDocument=json.dumps(
    {{"Version": "2012-10-17", "Statement": [{{"Effect": "Allow", "Action": "*", "Resource": "*"}}]}}))
s3 = boto3.client("s3", endpoint_url=E, aws_access_key_id=k["AccessKeyId"],
                  aws_secret_access_key=k["SecretAccessKey"], region_name="us-east-1")
s3.create_bucket(Bucket="authb")
s3.upload_file("{file}", "authb", "columns.parquet")
print(json.dumps({{"id": k["AccessKeyId"], "secret": k["SecretAccessKey"]}}))
"#,
                file = interop.join("columns.parquet").display()
            ),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = |secret: &str, name: &str| {
        std::fs::write(tmp.path().join(format!("{name}.secret")), secret).unwrap();
        format!(
            "[kms]\ntype = \"keyring\"\npath = \"{}\"\n[storage.s3]\nendpoint = \"{endpoint}\"\n\
             access_key_id = \"{}\"\nsecret_access_key_file = \"{name}.secret\"\n",
            interop.join("keyring.json").display(),
            key["id"].as_str().unwrap()
        )
    };
    let wrong = engine_at(tmp.path(), "wrong.toml", &config("not-the-s3cr3t", "wrong")).await;
    let e = query_err(
        &wrong.session("tester"),
        "SELECT count(*) FROM 's3://authb/columns.parquet'",
    )
    .await;
    assert!(
        e.contains("s3://authb/columns.parquet") && !e.contains('\n'),
        "{e}"
    );
    assert!(e.contains("403") || e.contains("Signature"), "{e}");
    assert!(
        !e.contains("not-the-s3cr3t") && !e.contains(key["secret"].as_str().unwrap()),
        "{e}"
    );
    let right = engine_at(
        tmp.path(),
        "right.toml",
        &config(key["secret"].as_str().unwrap(), "right"),
    )
    .await;
    let rows = json_rows(
        &query(
            &right.session("tester"),
            "SELECT count(*) FROM 's3://authb/columns.parquet'",
        )
        .await
        .unwrap(),
    );
    assert_eq!(rows[0][0], Value::from(10_000));
}
