//! The keyed hash mask (`hmac_sha256`): the policy's secret, read from its file, gives
//! the analyst joinable hashes nobody can confirm by hashing a guess; workers mask with
//! the same secret or refuse, and the secret never travels.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};

use crate::cluster::cluster_of;
use crate::common::*;

const KEY: &str = "9d1f0c3b7a5e42c8b6f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9";

/// A demo lake whose analyst sees e-mails as `hmac_sha256` under `KEY`.
async fn keyed_lake(dir: &Path) -> std::path::PathBuf {
    let config = demo::init(dir).await.unwrap();
    let policy = dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let keyed = text.replace(
        "access = { admin = \"plaintext\", analyst = \"sha256\", support = \"plaintext\" }",
        "access = { admin = \"plaintext\", analyst = \"hmac_sha256\", support = \"plaintext\" }",
    );
    assert_ne!(
        keyed, text,
        "the demo policy changed: the e-mail rule is not found"
    );
    std::fs::write(
        &policy,
        format!("{keyed}\n[masks]\nhmac_key_file = \"hmac.key\"\n"),
    )
    .unwrap();
    std::fs::write(dir.join("hmac.key"), format!("{KEY}\n")).unwrap();
    config
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const SQL: &str = "SELECT id, email FROM lake.sales.customers WHERE id < 1000040 ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hmac_mask_is_keyed_joinable_and_the_same_on_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let config = keyed_lake(&tmp.path().join("lake")).await;
    let single = Engine::open(Config::load(&config).unwrap()).await.unwrap();
    let plain = json_rows(&query(&single.session("admin"), SQL).await.unwrap());
    let masked = json_rows(&query(&single.session("analyst"), SQL).await.unwrap());
    assert!(plain.len() > 30, "{plain:?}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, KEY.as_bytes());
    assert_eq!(plain.len(), masked.len());
    let mut hashed = 0;
    for (p, m) in plain.iter().zip(&masked) {
        let Some(email) = p[1].as_str() else {
            assert!(m[1].is_null(), "a null e-mail masks to null: {m:?}");
            continue;
        };
        hashed += 1;
        let want = hex(ring::hmac::sign(&key, email.as_bytes()).as_ref());
        assert_eq!(m[1].as_str(), Some(want.as_str()), "{email}");
        // Not the unkeyed hash a guess could be checked against.
        let unkeyed = hex(ring::digest::digest(&ring::digest::SHA256, email.as_bytes()).as_ref());
        assert_ne!(m[1].as_str(), Some(unkeyed.as_str()));
    }
    assert!(hashed > 20, "{plain:?}");
    // Joinable: the same value gives the same hash in every query.
    let join = "SELECT count(*) FROM lake.sales.customers a JOIN lake.sales.customers b ON a.email = b.email";
    assert_eq!(
        json_rows(&query(&single.session("analyst"), join).await.unwrap()),
        json_rows(&query(&single.session("admin"), join).await.unwrap())
    );
    // EXPLAIN names the mask, never the secret.
    let plan = crate::cluster::explain(&single, "analyst", SQL).await;
    assert!(plan.contains("email=hmac_sha256"), "{plan}");
    assert!(!plan.contains(&KEY[..16]), "{plan}");

    // On three workers: the same answers, masked there with their own copy of the secret.
    let (coordinator, _workers) = cluster_of(&config, "").await;
    let queries = [
        SQL,
        "SELECT email, count(*) FROM lake.sales.customers GROUP BY email ORDER BY 2 DESC, 1 LIMIT 5",
        "SELECT count(*), min(email), max(email) FROM lake.sales.customers",
    ];
    for sql in queries {
        assert_eq!(
            json_rows(&query(&coordinator.session("analyst"), sql).await.unwrap()),
            json_rows(&query(&single.session("analyst"), sql).await.unwrap()),
            "{sql}"
        );
    }
    let plan = crate::cluster::explain(&coordinator, "analyst", SQL).await;
    assert!(plan.contains("RemoteScanExec"), "not distributed:\n{plan}");
    // The scan sent to workers carries the secret's check value, not the secret.
    let session = coordinator.session("analyst");
    let physical = session
        .sql_plan(SQL)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let scan = find(&physical, "RemoteScanExec").expect("a RemoteScanExec");
    let secret = std::fs::read(config.parent().unwrap().join("cluster.secret")).unwrap();
    let signer = Arc::new(
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(60)).unwrap(),
    );
    let mut bytes = Vec::new();
    use datafusion_proto::physical_plan::PhysicalExtensionCodec;
    clearice_engine::encoding_for(uuid::Uuid::new_v4(), || {
        clearice_engine::ClearIceCodec::coordinator(signer).try_encode(scan, &mut bytes)
    })
    .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("\"mask_key_check\":\""), "{text}");
    assert!(!text.contains(&KEY[..16]) && !text.contains(&KEY[KEY.len() - 16..]));

    // A coordinator with another secret: the workers refuse to mask, in one line.
    std::fs::write(
        config.parent().unwrap().join("hmac.key"),
        KEY.replace('9', "8"),
    )
    .unwrap();
    let other = Arc::new(
        Engine::open(Config::load(&config.parent().unwrap().join("cluster.toml")).unwrap())
            .await
            .unwrap()
            .distribute()
            .unwrap(),
    );
    let e = query_err(&other.session("analyst"), SQL).await;
    assert!(e.contains("is not the coordinator's"), "{e}");
    assert!(!e.contains(&KEY[..16]), "{e}");
    // Queries without the mask still run there.
    let admin = query(&other.session("admin"), SQL).await.unwrap();
    assert_eq!(json_rows(&admin), plain);
}

#[tokio::test]
async fn a_missing_or_short_hmac_key_file_fails_the_engine_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = keyed_lake(&dir).await;
    std::fs::remove_file(dir.join("hmac.key")).unwrap();
    let e = open_error(&config).await;
    assert!(
        e.contains("masks.hmac_key_file") && e.contains("hmac.key") && !e.contains('\n'),
        "{e}"
    );
    std::fs::write(dir.join("hmac.key"), "tooshortasecret\n").unwrap();
    let e = open_error(&config).await;
    assert!(
        e.contains("holds 15 bytes") && !e.contains("tooshort"),
        "{e}"
    );
}

/// The one-line error of opening the engine on `config`.
async fn open_error(config: &Path) -> String {
    Engine::open(Config::load(config).unwrap())
        .await
        .err()
        .unwrap()
        .to_string()
}

fn find(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    name: &str,
) -> Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    if plan.name() == name {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(|c| find(c, name))
}
