//! Tags: a column classified by a `[tags.NAME]` pattern is encrypted under the tag's key
//! and decided by the tag's rules in a table created after the policy was written; a
//! column's own rules still win; renaming a tagged column is refused.

use std::path::Path;
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::*;

const TAG: &str = r#"
[tags.pii]
columns = ["*.*.*.contact_email", "lake.crm.*.national_id"]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "sha256", support = "show_last_4" }
write = ["admin"]
"#;

async fn open(config: &Path) -> Arc<Engine> {
    Arc::new(Engine::open(Config::load(config).unwrap()).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tagged_column_of_a_new_table_is_encrypted_and_decided_by_its_tag() {
    let tmp = tempfile::tempdir().unwrap();
    let config = demo::init(&tmp.path().join("lake")).await.unwrap();
    let dir = config.parent().unwrap();
    let policy = std::fs::read_to_string(dir.join("policy.toml")).unwrap();
    std::fs::write(dir.join("policy.toml"), policy.clone() + TAG).unwrap();
    let engine = open(&config).await;
    let admin = engine.session("admin");
    for sql in [
        "CREATE SCHEMA lake.crm",
        "CREATE TABLE lake.crm.leads (id BIGINT, contact_email VARCHAR, national_id VARCHAR, note VARCHAR)",
        "INSERT INTO lake.crm.leads VALUES (1, 'ann@example.com', '123-45-6789', 'a'), (2, 'bob@example.com', '987-65-4321', 'b')",
    ] {
        query(&admin, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let q = "SELECT id, contact_email, national_id, note FROM lake.crm.leads ORDER BY id";
    let seen = |who: &str| {
        let engine = Arc::clone(&engine);
        let who = who.to_owned();
        async move { json_rows(&query(&engine.session(&who), q).await.unwrap()) }
    };
    assert_eq!(
        seen("admin").await[0],
        ["1", "ann@example.com", "123-45-6789", "a"].map(|v| {
            v.parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(v))
        })
    );
    let analyst = seen("analyst").await;
    let sha = |v: &str| hex::encode(Sha256::digest(v.as_bytes()));
    assert_eq!(analyst[0][1], Value::from(sha("ann@example.com")));
    assert_eq!(analyst[1][2], Value::from(sha("987-65-4321")));
    assert_eq!(
        analyst[0][3],
        Value::from("a"),
        "an untagged column is plaintext"
    );
    assert_eq!(seen("support").await[0][2], Value::from("XXX-XX-6789"));
    // The demo's own user with no rule in the tag: a principal the tag does not name is
    // denied the column.
    let text = std::fs::read_to_string(dir.join("policy.toml"))
        .unwrap()
        .replace("[users]\n", "[users]\nguest = { roles = [] }\n");
    std::fs::write(dir.join("policy.toml"), &text).unwrap();
    let engine = open(&config).await;
    let e = query_err(&engine.session("guest"), q).await;
    assert!(e.contains("contact_email") && e.contains("tag:pii"), "{e}");
    assert!(
        json_rows(
            &query(
                &engine.session("guest"),
                "SELECT id, note FROM lake.crm.leads"
            )
            .await
            .unwrap()
        )
        .len()
            == 2
    );

    // The files hold the tagged columns encrypted under the tag's key: without the tag,
    // nobody's scan asks for that key.
    std::fs::write(dir.join("policy.toml"), &policy).unwrap();
    let untagged = open(&config).await;
    let e = query_err(
        &untagged.session("admin"),
        "SELECT contact_email FROM lake.crm.leads",
    )
    .await;
    assert!(
        e.contains("column 'contact_email' is not decrypted in this scan") && e.contains("pii_key"),
        "{e}"
    );
    let notes = json_rows(
        &query(
            &untagged.session("admin"),
            "SELECT note FROM lake.crm.leads ORDER BY id",
        )
        .await
        .unwrap(),
    );
    assert_eq!(notes, [[Value::from("a")], [Value::from("b")]]);

    // Renaming a tagged column (which would leave its tag) is refused.
    let e = query_err(
        &engine.session("admin"),
        "ALTER TABLE lake.crm.leads RENAME COLUMN contact_email TO mail",
    )
    .await;
    assert!(e.contains("the policy names the column"), "{e}");
}
