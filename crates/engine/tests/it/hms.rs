//! Hive Metastore catalogs: Hive's standalone metastore 3.1 (Java, Derby; resolved with
//! Maven by `scripts/test.sh`) on a loopback port, started here and stopped afterwards.
//! PyIceberg registers the PyArrow-encrypted interop table in it; ClearIce reads it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clearice_engine::{Config, Engine};

use crate::common::*;

/// Starts the metastore on a free port with an embedded Derby database under `dir`.
pub(crate) fn start_metastore(cp: &str, dir: &Path) -> (Peer, String) {
    let port = free_port();
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let props = [
        (
            "metastore.thrift.uris",
            format!("thrift://127.0.0.1:{port}"),
        ),
        ("metastore.thrift.port", port.to_string()),
        (
            "javax.jdo.option.ConnectionURL",
            format!(
                "jdbc:derby:;databaseName={};create=true",
                dir.join("metastore_db").display()
            ),
        ),
        (
            "javax.jdo.option.ConnectionDriverName",
            "org.apache.derby.jdbc.EmbeddedDriver".into(),
        ),
        ("datanucleus.schema.autoCreateAll", "true".into()),
        ("metastore.schema.verification", "false".into()),
        (
            "metastore.warehouse.dir",
            format!("file://{}", dir.join("warehouse").display()),
        ),
        // Hive's own implementations of these live in hive-exec, not in the metastore.
        (
            "metastore.expression.proxy",
            "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy".into(),
        ),
        (
            "metastore.task.threads.always",
            "org.apache.hadoop.hive.metastore.events.EventCleanerTask".into(),
        ),
    ];
    let xml: String = props
        .iter()
        .map(|(k, v)| format!("  <property><name>{k}</name><value>{v}</value></property>\n"))
        .collect();
    std::fs::write(
        conf.join("metastore-site.xml"),
        format!("<configuration>\n{xml}</configuration>\n"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("metastore.log")).unwrap();
    let child = Command::new("java")
        .args([
            "--add-opens=java.base/java.lang=ALL-UNNAMED",
            "--add-opens=java.base/java.net=ALL-UNNAMED",
            "--add-opens=java.base/java.util=ALL-UNNAMED",
            "-cp",
            &format!("{}:{cp}", conf.display()),
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("java (17+) for Hive's metastore");
    let metastore = Peer(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the metastore did not start: {}",
            std::fs::read_to_string(dir.join("metastore.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (metastore, format!("thrift://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hive_metastore_tables_read_like_any_other() {
    let (Some(interop), Some((cp, python))) = (interop_dir(), java_peer("CLEARICE_HMS_CP")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (_metastore, uri) = start_metastore(&cp, tmp.path());
    run_python(
        &python,
        "hms_catalog.py",
        &["register", &uri, interop.to_str().unwrap()],
    );
    let config = format!(
        "[catalogs.hive]\ntype = \"hms\"\nuri = \"{uri}\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n",
        interop.join("keyring.json").display()
    );
    let engine = engine(tmp.path(), &config).await;
    assert_expected(&engine, &interop, "hive.sales.customers", "tester").await;
}

#[tokio::test]
async fn unreachable_metastore_is_one_line_naming_the_catalog() {
    let tmp = tempfile::tempdir().unwrap();
    let dead = format!("thrift://127.0.0.1:{}", free_port());
    let path = tmp.path().join("clearice.toml");
    std::fs::write(
        &path,
        format!("[catalogs.hive]\ntype = \"hms\"\nuri = \"{dead}\"\n"),
    )
    .unwrap();
    let started = Instant::now();
    let e = Engine::open(Config::load(&path).unwrap())
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(
        e.contains("'hive'") && e.contains(&dead) && !e.contains('\n'),
        "{e}"
    );
}
