//! The Iceberg REST catalog: Iceberg's own `RESTCatalogServer` (Java, from the Maven
//! artifacts `scripts/test.sh` resolves) on a loopback port, started here and stopped
//! afterwards. PyIceberg registers the PyArrow-encrypted interop table through it;
//! ClearIce reads it under a column policy (OAuth2 client credentials), sees a table
//! created later, and names the catalog when it cannot reach it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clearice_engine::{Config, Engine};
use serde_json::Value;

use crate::common::*;

/// Starts RESTCatalogServer (JDBC catalog on SQLite, warehouse on local disk).
fn start_rest(cp: &str, dir: &Path) -> (Peer, String) {
    let warehouse = dir.join("warehouse");
    std::fs::create_dir_all(&warehouse).unwrap();
    start_rest_with(
        cp,
        dir,
        &[(
            "CATALOG_WAREHOUSE",
            format!("file://{}", warehouse.display()),
        )],
    )
}

/// Starts RESTCatalogServer with the interop lake's `sales.customers` registered in it
/// (by PyIceberg).
fn start_rest_with_interop(cp: &str, python: &str, interop: &Path, dir: &Path) -> (Peer, String) {
    let (server, uri) = start_rest(cp, dir);
    run_python(
        python,
        "rest_catalog.py",
        &["register", &uri, interop.to_str().unwrap()],
    );
    (server, uri)
}

/// Starts RESTCatalogServer with catalog properties in `env` (`CATALOG_S3_ENDPOINT` is
/// `s3.endpoint`: `__` is `-`, `_` is `.`).
fn start_rest_with(cp: &str, dir: &Path, env: &[(&str, String)]) -> (Peer, String) {
    let port = free_port();
    let log = std::fs::File::create(dir.join("rest-server.log")).unwrap();
    let child = Command::new("java")
        .args(["-cp", cp, "org.apache.iceberg.rest.RESTCatalogServer"])
        .env(
            "CATALOG_URI",
            format!("jdbc:sqlite:{}", dir.join("rest.db").display()),
        )
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("CATALOG_REST_PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("java (17+) for Iceberg's REST catalog server");
    let server = Peer(child);
    let start = Instant::now();
    let uri = format!("http://127.0.0.1:{port}");
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /v1/config HTTP/1.0\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") || buf.starts_with("HTTP/1.0 200") {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "RESTCatalogServer did not start: {}",
            std::fs::read_to_string(dir.join("rest-server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, uri)
}

const POLICY: &str = r#"
[roles]
admin = { description = "all plaintext" }
analyst = { description = "identifiers masked" }

[users]
admin = { roles = ["admin"] }
analyst = { roles = ["analyst"] }

[tables."rest.sales.customers"]
footer_key = "footer_key"

[tables."rest.sales.customers".columns.ssn]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "show_last_4" }

[tables."rest.sales.customers".columns.email]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "hide" }

[tables."rest.sales.customers".columns.balance]
master_key = "finance_key"
access = { admin = "plaintext", analyst = "plaintext" }

[tables."rest.sales.later"]
access = { admin = "allow", analyst = "allow" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_tables_read_under_the_policy_and_new_tables_appear() {
    let (Some(interop), Some((cp, python))) =
        (interop_dir(), java_peer("CLEARICE_REST_CATALOG_CP"))
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (_server, uri) = start_rest_with_interop(&cp, &python, &interop, tmp.path());
    std::fs::write(tmp.path().join("rest.cred"), "clearice:s3cr3t-client\n").unwrap();
    std::fs::write(tmp.path().join("policy.toml"), POLICY).unwrap();
    let config = format!(
        "[catalogs.rest]\ntype = \"rest\"\nuri = \"{uri}\"\ncredential_file = \"rest.cred\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n[policy]\npath = \"policy.toml\"\n",
        interop.join("keyring.json").display()
    );
    let engine = engine(tmp.path(), &config).await;

    // The interop queries as DuckDB answered them, through the REST catalog.
    assert_expected(&engine, &interop, "rest.sales.customers", "admin").await;
    let admin = engine.session("admin");

    // The policy applies to REST tables as to any other.
    let analyst = engine.session("analyst");
    let rows = json_rows(
        &query(
            &analyst,
            "SELECT ssn FROM rest.sales.customers WHERE ssn IS NOT NULL ORDER BY id LIMIT 1",
        )
        .await
        .unwrap(),
    );
    assert!(
        rows[0][0].as_str().unwrap().starts_with("XXX-XX-"),
        "{rows:?}"
    );
    let e = query_err(&analyst, "SELECT email FROM rest.sales.customers").await;
    assert!(e.contains("email"), "{e}");

    // A table created later (by PyIceberg, through the same catalog) shows up.
    let e = query_err(&admin, "SELECT * FROM rest.sales.later").await;
    assert!(e.contains("later"), "{e}");
    run_python(&python, "rest_catalog.py", &["create_later", &uri]);
    tokio::time::sleep(clearice_engine::CATALOG_LISTING_MAX_AGE + Duration::from_millis(200)).await;
    let rows = json_rows(
        &query(&admin, "SELECT count(*), sum(id) FROM rest.sales.later")
            .await
            .unwrap(),
    );
    assert_eq!(rows, vec![vec![Value::from(3), Value::from(6)]]);
}

#[tokio::test]
async fn unreachable_rest_catalog_is_one_line_naming_the_catalog() {
    let tmp = tempfile::tempdir().unwrap();
    let dead = format!("http://127.0.0.1:{}", free_port());
    std::fs::write(tmp.path().join("token"), "s3cr3t-token\n").unwrap();
    let path = tmp.path().join("clearice.toml");
    std::fs::write(
        &path,
        format!("[catalogs.rest]\ntype = \"rest\"\nuri = \"{dead}\"\ntoken_file = \"token\"\n"),
    )
    .unwrap();
    let e = Engine::open(Config::load(&path).unwrap())
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'rest'") && e.contains(&dead), "{e}");
    assert!(!e.contains("s3cr3t") && !e.contains('\n'), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_on_s3_vends_the_credentials_clearice_reads_with() {
    let (Some(interop), Some((cp, python))) =
        (interop_dir(), java_peer("CLEARICE_REST_CATALOG_CP"))
    else {
        return;
    };
    let (_moto, endpoint) = start_moto(&python);
    make_bucket(&python, &endpoint, "restwh");
    let tmp = tempfile::tempdir().unwrap();
    // The catalog holds the S3 credentials and hands them out with each table
    // (`include-credentials`): ClearIce's config names the endpoint only.
    let (_server, uri) = start_rest_with(
        &cp,
        tmp.path(),
        &[
            ("CATALOG_WAREHOUSE", "s3://restwh/wh".into()),
            (
                "CATALOG_IO__IMPL",
                "org.apache.iceberg.aws.s3.S3FileIO".into(),
            ),
            ("CATALOG_S3_ENDPOINT", endpoint.clone()),
            ("CATALOG_S3_PATH__STYLE__ACCESS", "true".into()),
            ("CATALOG_S3_ACCESS__KEY__ID", "vended-key".into()),
            ("CATALOG_S3_SECRET__ACCESS__KEY", "vended-secret".into()),
            ("CATALOG_CLIENT_REGION", "us-east-1".into()),
            ("CATALOG_HTTP__CLIENT_TYPE", "urlconnection".into()),
            ("CATALOG_INCLUDE__CREDENTIALS", "true".into()),
        ],
    );
    let made = run_python(
        &python,
        "s3_lake.py",
        &[
            "setup_rest",
            make_fixtures().to_str().unwrap(),
            &endpoint,
            interop.to_str().unwrap(),
            &uri,
        ],
    );
    assert_eq!(made["vended"], Value::Bool(true), "{made}");
    let config = format!(
        "[catalogs.rest]\ntype = \"rest\"\nuri = \"{uri}\"\n\
         [storage.s3]\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n",
        interop.join("keyring.json").display()
    );
    let engine = engine(tmp.path(), &config).await;
    assert_expected(&engine, &interop, "rest.sales.customers", "tester").await;
    assert!(engine.storage_requests().get > 0);
}

const WRITE_POLICY: &str = r#"
[roles]
admin = { description = "writes" }
analyst = { description = "reads masked" }

[users]
admin = { roles = ["admin"] }
analyst = { roles = ["analyst"] }

[writes]
create = ["admin"]

[tables."rest.etl.people"]
footer_key = "footer_key"

[tables."rest.etl.people".columns.ssn]
master_key = "pii_key"
write = ["admin"]
access = { admin = "plaintext", analyst = "show_last_4" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_writes_through_a_rest_catalog_encrypt_by_policy() {
    let (Some(interop), Some((cp, _python))) =
        (interop_dir(), java_peer("CLEARICE_REST_CATALOG_CP"))
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (_server, uri) = start_rest(&cp, tmp.path());
    std::fs::write(tmp.path().join("rest.cred"), "clearice:s3cr3t-client\n").unwrap();
    std::fs::write(tmp.path().join("policy.toml"), WRITE_POLICY).unwrap();
    let config = format!(
        "[catalogs.rest]\ntype = \"rest\"\nuri = \"{uri}\"\ncredential_file = \"rest.cred\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n[policy]\npath = \"policy.toml\"\n",
        interop.join("keyring.json").display()
    );
    let engine = engine(tmp.path(), &config).await;
    let admin = engine.session("admin");
    for sql in [
        "CREATE SCHEMA rest.etl",
        "CREATE TABLE rest.etl.people (id BIGINT, ssn VARCHAR) PARTITIONED BY (bucket(4, id))",
        "INSERT INTO rest.etl.people VALUES (1, '111-11-1111'), (2, '222-22-2222'), (3, NULL)",
        "CREATE TABLE rest.etl.ids AS SELECT id FROM rest.etl.people",
    ] {
        query(&admin, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let rows = json_rows(
        &query(&admin, "SELECT id, ssn FROM rest.etl.people ORDER BY id")
            .await
            .unwrap(),
    );
    assert_eq!(rows[1], vec![Value::from(2), Value::from("222-22-2222")]);
    let analyst = engine.session("analyst");
    let rows = json_rows(
        &query(&analyst, "SELECT ssn FROM rest.etl.people WHERE id = 1")
            .await
            .unwrap(),
    );
    assert_eq!(rows, vec![vec![Value::from("XXX-XX-1111")]]);
    let rows = json_rows(
        &query(&admin, "SELECT count(*) FROM rest.etl.ids")
            .await
            .unwrap(),
    );
    assert_eq!(rows, vec![vec![Value::from(3)]]);
    // The files are encrypted as the policy says.
    let files = json_rows(
        &query(&admin, "SELECT file_path FROM rest.etl.\"people$files\"")
            .await
            .unwrap(),
    );
    assert!(!files.is_empty());
    for f in files {
        let keys = engine
            .file_column_keys(f[0].as_str().unwrap())
            .await
            .unwrap();
        let ssn = keys.iter().find(|(c, _)| c == "ssn").unwrap();
        assert_eq!(ssn.1.as_deref(), Some("pii_key"), "{f:?}");
    }
    // Row-level writes need a committer REST does not have yet: one clear line.
    let e = query_err(&admin, "DELETE FROM rest.etl.people WHERE id = 1").await;
    assert!(
        e.contains("commits only appends to REST catalogs") && e.contains("rest.etl.people"),
        "{e}"
    );
    let rows = json_rows(
        &query(&admin, "SELECT count(*) FROM rest.etl.people")
            .await
            .unwrap(),
    );
    assert_eq!(rows, vec![vec![Value::from(3)]]);
    query(&admin, "DROP SCHEMA rest.etl CASCADE").await.unwrap();
    let e = query_err(&admin, "SELECT * FROM rest.etl.people").await;
    assert!(e.contains("not found"), "{e}");
}

const RESTRICTED_POLICY: &str = r#"
[roles]
admin = { description = "all plaintext" }
analyst = { description = "identifiers masked" }

[users]
admin = { roles = ["admin"] }
analyst = { roles = ["analyst"] }
auditor = { roles = ["analyst"] }
support = { roles = ["analyst"] }

[tables."rest.sales.customers"]
footer_key = "footer_key"
write = ["admin", "analyst"]

[tables."rest.sales.customers".columns.ssn]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "show_last_4" }

[tables."rest.sales.customers".columns.email]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "hide" }

[tables."rest.sales.customers".columns.balance]
master_key = "finance_key"
access = { admin = "plaintext", analyst = "plaintext" }
"#;

/// Starts `rest_restrictions.py serve` in front of the catalog at `upstream`.
fn start_restrictions(python: &str, dir: &Path, upstream: &str, config: &Value) -> (Peer, String) {
    let port = free_port();
    let path = dir.join("restrictions.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/rest_restrictions.py");
    let child = Command::new(python)
        .arg(script)
        .args(["serve", &port.to_string(), upstream, path.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let peer = Peer(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rest_restrictions.py did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (peer, format!("http://127.0.0.1:{port}"))
}

/// A REST catalog's `read-restrictions` (Iceberg REST spec): asked per principal with
/// each one's own token, combined with the local policy (the stricter wins), the row
/// filter below every predicate; an action ClearIce cannot apply and a principal it cannot
/// ask for both fail the query in one line; asked with ClearIce's own credential, they
/// apply to everyone. Expected answers come from the plaintext twin through pyarrow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_read_restrictions_are_applied_per_principal_and_fail_closed() {
    let (Some(interop), Some((cp, python))) =
        (interop_dir(), java_peer("CLEARICE_REST_CATALOG_CP"))
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (_server, upstream) = start_rest_with_interop(&cp, &python, &interop, tmp.path());
    let want = run_python(
        &python,
        "rest_restrictions.py",
        &["expect", interop.to_str().unwrap()],
    );
    let analyst_restrictions = serde_json::json!({
        "required-column-projections": [
            {"field-id": 2, "action": "mask-alphanum"},
            {"field-id": 3, "action": "show-last-4"},
            {"field-id": 4, "action": "sha-256-global"},
            {"field-id": 6, "action": "mask-to-default"},
            {"field-id": 7, "action": "truncate-to-year"}
        ],
        "required-row-filter": {
            "type": "and",
            "left": {"type": "in", "term": "country", "values": ["DE", "FR"]},
            "right": {"type": "not-null", "term": "birth_date"}
        }
    });
    let config = serde_json::json!({
        "tokens": {"tok-engine": "clearice", "tok-admin": "admin", "tok-analyst": "analyst",
                   "tok-auditor": "auditor"},
        "restrictions": {
            "analyst": {"sales.customers": analyst_restrictions},
            "auditor": {"sales.customers": {
                "required-column-projections": [{"field-id": 2, "action": "scramble"}]}},
            "clearice": {"sales.customers": {
                "required-row-filter": {"type": "eq", "term": "country", "value": "DE"}}}
        }
    });
    let (_proxy, uri) = start_restrictions(&python, tmp.path(), &upstream, &config);
    for (who, token) in [
        ("engine", "tok-engine"),
        ("admin", "tok-admin"),
        ("analyst", "tok-analyst"),
        ("auditor", "tok-auditor"),
    ] {
        std::fs::write(
            tmp.path().join(format!("{who}.token")),
            format!("{token}\n"),
        )
        .unwrap();
    }
    std::fs::write(tmp.path().join("policy.toml"), RESTRICTED_POLICY).unwrap();
    let base = format!(
        "[catalogs.rest]\ntype = \"rest\"\nuri = \"{uri}\"\ntoken_file = \"engine.token\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{}\"\n[policy]\npath = \"policy.toml\"\n",
        interop.join("keyring.json").display()
    );
    let per_principal = format!(
        "{base}[catalogs.rest.principal_tokens]\nadmin = \"admin.token\"\n\
         analyst = \"analyst.token\"\nauditor = \"auditor.token\"\n"
    );
    let engine = engine(tmp.path(), &per_principal).await;
    const T: &str = "rest.sales.customers";

    // No restrictions for admin: every row, in plaintext.
    let admin = engine.session("admin");
    assert_eq!(
        first(&admin, "SELECT count(*) FROM rest.sales.customers").await,
        want["all"]
    );

    // The analyst: only the rows the catalog's filter keeps, whatever the query asks.
    let analyst = engine.session("analyst");
    assert_eq!(
        first(&analyst, "SELECT count(*) FROM rest.sales.customers").await,
        want["count"]
    );
    for sql in [
        "SELECT count(*) FROM rest.sales.customers WHERE country = 'US'",
        "SELECT count(*) FROM rest.sales.customers WHERE birth_date IS NULL",
        "SELECT count(*) FROM rest.sales.customers c WHERE NOT EXISTS \
         (SELECT 1 FROM rest.sales.customers d WHERE d.id = c.id AND d.country IN ('DE', 'FR'))",
    ] {
        assert_eq!(first(&analyst, sql).await, Value::from(0), "{sql}");
    }
    // Masks with the spec's exact semantics, the row filter on the plaintext values.
    let names = json_rows(
        &query(&analyst, &format!("SELECT id, name FROM {T} ORDER BY id"))
            .await
            .unwrap(),
    );
    assert_eq!(Value::from(names.clone()), want["names"]);
    let years = json_rows(
        &query(
            &analyst,
            &format!(
                "SELECT id, CAST(date_part('year', signup_ts) AS BIGINT) FROM {T} \
                 WHERE signup_ts IS NULL OR (date_part('month', signup_ts) = 1 \
                 AND date_part('day', signup_ts) = 1 AND date_part('hour', signup_ts) = 0) \
                 ORDER BY id"
            ),
        )
        .await
        .unwrap(),
    );
    assert_eq!(Value::from(years), want["years"]);
    // balance: plaintext locally, mask-to-default by the catalog: 0.00 (NULL stays NULL).
    let b = json_rows(
        &query(
            &analyst,
            &format!("SELECT count(balance), count(DISTINCT balance), CAST(max(balance) AS VARCHAR) FROM {T}"),
        )
        .await
        .unwrap(),
    );
    assert_eq!(b[0][0], want["balances"]);
    assert_eq!(b[0][1], Value::from(1));
    assert_eq!(b[0][2], Value::from("0.00"));
    // ssn: show_last_4 locally, sha-256-global by the catalog: two masks give NULL.
    assert_eq!(
        first(&analyst, "SELECT count(ssn) FROM rest.sales.customers").await,
        Value::from(0)
    );
    // email: hidden locally, whatever the catalog says.
    let e = query_err(&analyst, &format!("SELECT email FROM {T}")).await;
    assert!(e.contains("email"), "{e}");
    // The filter is shown, and metadata tables (row counts) are refused under it.
    let plan = crate::cluster::explain(&engine, "analyst", &format!("SELECT id FROM {T}")).await;
    assert!(
        plan.contains("read restriction of catalog 'rest'")
            && plan.contains("\"country\" IN ('DE', 'FR')"),
        "{plan}"
    );
    let e = query_err(&analyst, "SELECT * FROM rest.sales.\"customers$files\"").await;
    assert!(e.contains("read restriction of catalog 'rest'"), "{e}");

    // Random queries as the analyst agree with DuckDB over the plaintext twin restricted
    // as the spec says (3 seeds).
    differential_against_duckdb(&analyst, &python, &interop, tmp.path()).await;

    // Writes stay inside the catalog's filter; DROP and ALTER (committed with ClearIce's
    // own credential) are refused to a principal the catalog restricts.
    let e = query_err(
        &analyst,
        &format!("INSERT INTO {T} (id, country, birth_date) VALUES (1, 'US', DATE '2000-01-01')"),
    )
    .await;
    assert!(e.contains("read restriction of catalog 'rest'"), "{e}");
    for sql in [
        format!("DROP TABLE {T}"),
        format!("ALTER TABLE {T} DROP COLUMN country"),
    ] {
        let e = query_err(&analyst, &sql).await;
        assert!(
            e.contains("read restriction of catalog 'rest'"),
            "{sql}: {e}"
        );
    }
    assert_eq!(
        first(&admin, "SELECT count(*) FROM rest.sales.customers").await,
        want["all"]
    );

    // An action ClearIce does not know fails the query, naming it.
    let auditor = engine.session("auditor");
    let e = query_err(&auditor, &format!("SELECT id FROM {T}")).await;
    assert!(
        e.contains("unknown action 'scramble' on field id 2") && !e.contains('\n'),
        "{e}"
    );
    // A principal the catalog cannot be asked for: refused, not read with another's rights.
    let support = engine.session("support");
    let e = query_err(&support, &format!("SELECT id FROM {T}")).await;
    assert!(
        e.contains("principal_tokens") && e.contains("support"),
        "{e}"
    );

    // Asked with ClearIce's own credential, the catalog's restrictions apply to everyone.
    let shared = engine_at(tmp.path(), "shared.toml", &base).await;
    let admin = shared.session("admin");
    assert_eq!(
        first(&admin, "SELECT count(*) FROM rest.sales.customers").await,
        want["de"]
    );
    assert_eq!(
        first(
            &admin,
            "SELECT count(*) FROM rest.sales.customers WHERE country <> 'DE'"
        )
        .await,
        Value::from(0)
    );
}

/// The first value of `sql`'s answer.
async fn first(s: &clearice_engine::Session, sql: &str) -> Value {
    json_rows(&query(s, sql).await.unwrap())[0][0].clone()
}

/// One random query over `{T}` (the analyst's view of the customers table).
fn random_query(rng: &mut rand::rngs::StdRng) -> String {
    use rand::Rng;
    let pick = |items: &[&str], rng: &mut rand::rngs::StdRng| -> String {
        items[rng.random_range(0..items.len())].to_owned()
    };
    let atom = |rng: &mut rand::rngs::StdRng| -> String {
        match rng.random_range(0..12) {
            0 => format!(
                "id % {} = {}",
                rng.random_range(2..9),
                rng.random_range(0..2)
            ),
            1 => format!("length(name) > {}", rng.random_range(3..14)),
            2 => {
                let a = rng.random_range(100_000..900_000);
                format!(
                    "id BETWEEN {a} AND {}",
                    a + rng.random_range(10_000..400_000)
                )
            }
            3 => format!(
                "date_part('year', signup_ts) = {}",
                rng.random_range(2015..2025)
            ),
            4 => format!("birth_date < DATE '{}-01-01'", rng.random_range(1940..2006)),
            n => [
                "country = 'DE'",
                "country = 'US'",
                "country <> 'FR'",
                "name IS NULL",
                "signup_ts IS NULL",
                "balance IS NULL",
                "name LIKE 'xxx%'",
            ][n - 5]
                .to_owned(),
        }
    };
    let pred = match rng.random_range(0..4) {
        0 => "true".to_owned(),
        1 => atom(rng),
        2 => format!("{} AND NOT ({})", atom(rng), atom(rng)),
        _ => format!("({} OR {})", atom(rng), atom(rng)),
    };
    let aggs = [
        "count(*)",
        "count(name)",
        "count(DISTINCT name)",
        "min(name)",
        "max(name)",
        "sum(id)",
        "count(signup_ts)",
        "count(balance)",
        "count(ssn)",
        "min(CAST(date_part('year', signup_ts) AS BIGINT))",
        "count(DISTINCT country)",
    ];
    match rng.random_range(0..6) {
        0 => format!(
            "SELECT {}, {} FROM {{T}} WHERE {pred}",
            pick(&aggs, rng),
            pick(&aggs, rng)
        ),
        1 => format!(
            "SELECT CAST(country AS VARCHAR) AS c, {} FROM {{T}} WHERE {pred} GROUP BY c",
            pick(&aggs, rng)
        ),
        2 => format!(
            "SELECT id, name, CAST(country AS VARCHAR) FROM {{T}} WHERE {pred} ORDER BY id LIMIT {}",
            rng.random_range(1..30)
        ),
        3 => format!(
            "SELECT CAST(date_part('year', signup_ts) AS BIGINT) AS y, count(*) FROM {{T}} \
             WHERE {pred} GROUP BY y"
        ),
        4 => format!("SELECT count(*) FROM {{T}} WHERE id IN (SELECT id FROM {{T}} WHERE {pred})"),
        _ => format!(
            "SELECT count(*), CAST(max(rn) AS BIGINT) FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn \
             FROM {{T}} WHERE {pred}) s WHERE rn % 7 = 0"
        ),
    }
}

/// Random queries as `analyst` against DuckDB computing them from plaintext under the
/// same restrictions (`rest_restrictions.py duckdb`); rows compared as sets.
async fn differential_against_duckdb(
    analyst: &clearice_engine::Session,
    python: &str,
    interop: &Path,
    dir: &Path,
) {
    use rand::SeedableRng;
    let mut queries = Vec::new();
    for seed in [1, 2, 3] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        queries.extend((0..25).map(|_| random_query(&mut rng)));
    }
    let path = dir.join("queries.json");
    std::fs::write(&path, serde_json::to_string(&queries).unwrap()).unwrap();
    let oracle = run_python(
        python,
        "rest_restrictions.py",
        &["duckdb", interop.to_str().unwrap(), path.to_str().unwrap()],
    );
    let mut mismatches = Vec::new();
    for (q, want) in queries.iter().zip(oracle.as_array().unwrap()) {
        let Some(want) = want.get("rows") else {
            panic!("DuckDB failed on {q}: {want}");
        };
        let sql = q.replace("{T}", "rest.sales.customers");
        let got = match query(analyst, &sql).await {
            Ok(b) => json_rows(&b),
            Err(e) => {
                mismatches.push(format!("{q}: ClearIce failed: {e}"));
                continue;
            }
        };
        let mut got: Vec<String> = got
            .iter()
            .map(|r| Value::from(r.clone()).to_string())
            .collect();
        let mut want: Vec<String> = want
            .as_array()
            .unwrap()
            .iter()
            .map(Value::to_string)
            .collect();
        got.sort();
        want.sort();
        if got != want {
            mismatches.push(format!(
                "{q}: ClearIce {:?} DuckDB {:?}",
                &got[..got.len().min(3)],
                &want[..want.len().min(3)]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} queries differ:\n{}",
        mismatches.len(),
        queries.len(),
        mismatches.join("\n")
    );
}
