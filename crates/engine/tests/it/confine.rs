//! Confinement in-process: network sessions vs. the local shell, `[shell] confine`,
//! planning-only paths (Flight's GetFlightInfo) that must not run DDL, and the limits.

use std::path::Path;
use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine, Refusal, refusal_of};

async fn lake(extra_config: &str) -> (tempfile::TempDir, Arc<Engine>, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = demo::init(&dir).await.unwrap();
    let area = tmp.path().join("area");
    std::fs::create_dir_all(&area).unwrap();
    std::fs::write(area.join("in.csv"), "x\n7\n").unwrap();
    std::fs::write(tmp.path().join("out.csv"), "secret\ns3cr3t\n").unwrap();
    let policy = std::fs::read_to_string(dir.join("policy.toml")).unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        format!(
            "{policy}\n[areas.area]\nroot = \"../area\"\nread = [\"analyst\"]\nwrite = [\"analyst\"]\n"
        ),
    )
    .unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{extra_config}\n{text}")).unwrap();
    let engine = Arc::new(Engine::open(Config::load(&config).unwrap()).await.unwrap());
    (tmp, engine, dir)
}

fn refusal(e: &datafusion::error::DataFusionError) -> &Refusal {
    refusal_of(e).unwrap_or_else(|| panic!("not a refusal: {e}"))
}

#[tokio::test]
async fn network_session_reads_only_inside_its_areas_local_shell_reads_anything() {
    let (tmp, engine, _) = lake("").await;
    let out = tmp.path().join("out.csv");
    let inside = tmp.path().join("area/in.csv");
    let net = engine.network_session("analyst", "test");
    let e = net
        .sql(&format!("SELECT * FROM '{}'", out.display()))
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), Refusal::FileRead { .. }), "{e}");
    assert!(!e.to_string().contains("s3cr3t"), "{e}");
    let ok = net
        .sql(&format!("SELECT * FROM '{}'", inside.display()))
        .await
        .unwrap();
    assert_eq!(ok.rows(), 1);
    // A principal without a grant is refused even inside the area.
    let e = engine
        .network_session("support", "test")
        .sql(&format!("SELECT * FROM '{}'", inside.display()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("granted no area"), "{e}");
    // The local user owns the machine's files (no [shell] confine).
    let local = engine.session_for("analyst", "repl");
    assert!(!local.is_confined());
    assert_eq!(
        local
            .sql(&format!("SELECT * FROM '{}'", out.display()))
            .await
            .unwrap()
            .rows(),
        1
    );
    // Plain names that do not exist still read as "not found", never as a path refusal.
    let e = net.sql("SELECT * FROM nosuchtable").await.unwrap_err();
    assert!(
        refusal_of(&e).is_none() && e.to_string().contains("not found"),
        "{e}"
    );
}

#[tokio::test]
async fn shell_confine_switch_confines_the_local_shell() {
    let (tmp, engine, _) = lake("[shell]\nconfine = true\n").await;
    let local = engine.session_for("admin", "repl");
    assert!(local.is_confined());
    let out = tmp.path().join("out.csv");
    let e = local
        .sql(&format!("SELECT * FROM '{}'", out.display()))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("a confined shell")
            || matches!(refusal(&e), Refusal::FileRead { .. }),
        "{e}"
    );
    let e = local.sql("CREATE VIEW v AS SELECT 1").await.unwrap_err();
    assert!(
        e.to_string().contains("not allowed over a confined shell"),
        "{e}"
    );
}

#[tokio::test]
async fn planning_alone_runs_no_ddl_and_writes_no_file() {
    let (tmp, engine, _) = lake("").await;
    let net = engine.network_session("support", "test");
    let target = tmp.path().join("planted.csv");
    // Flight's GetFlightInfo only plans: a COPY or CREATE EXTERNAL TABLE must not run.
    let e = net
        .sql_plan(&format!(
            "COPY (SELECT 1 AS x) TO '{}' STORED AS CSV",
            target.display()
        ))
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), Refusal::FileWrite { .. }), "{e}");
    let e = net
        .sql_plan(&format!(
            "CREATE EXTERNAL TABLE datafusion.public.t STORED AS CSV LOCATION '{}'",
            tmp.path().join("out.csv").display()
        ))
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), Refusal::FileRead { .. }), "{e}");
    assert!(!target.exists());
    assert!(!Path::new(&format!("{}/", target.display())).exists());
}

#[tokio::test]
async fn export_area_takes_copies_and_masks_stay_masked() {
    let (tmp, engine, _) = lake("").await;
    let net = engine.network_session("analyst", "test");
    let target = tmp.path().join("area/ssn.csv");
    net.sql(&format!(
        "COPY (SELECT ssn FROM lake.sales.customers WHERE id = 1000001) TO '{}' STORED AS CSV",
        target.display()
    ))
    .await
    .unwrap();
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(
        text.contains("XXX-XX-") && !text.contains("609-11-1603"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_and_result_rows_are_enforced() {
    let (_tmp, engine, _) = lake_with_limits("statement_timeout_s = 1\nmax_result_rows = 10").await;
    let net = engine.network_session("admin", "test");
    let t = std::time::Instant::now();
    let e = net
        .sql("SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b WHERE a.id + b.id = -1")
        .await
        .unwrap_err();
    assert!(
        matches!(
            clearice_engine::limit_of(&e),
            Some(clearice_engine::LimitExceeded::Timeout { .. })
        ),
        "{e}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    let mut s = net
        .sql_stream("SELECT id FROM lake.sales.customers")
        .await
        .unwrap();
    use futures::StreamExt;
    let mut err = None;
    while let Some(b) = s.next().await {
        if let Err(e) = b {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("row limit");
    assert!(e.to_string().contains("more than 10 rows"), "{e}");
}

async fn lake_with_limits(limits: &str) -> (tempfile::TempDir, Arc<Engine>, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let config = demo::init(&dir).await.unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n[server.limits]\n{limits}\n")).unwrap();
    let engine = Arc::new(Engine::open(Config::load(&config).unwrap()).await.unwrap());
    (tmp, engine, dir)
}

#[tokio::test]
async fn refusals_do_not_tell_whether_a_path_exists() {
    let (tmp, engine, _) = lake("").await;
    let net = engine.network_session("analyst", "test");
    let exists = tmp.path().join("out.csv");
    let missing = tmp.path().join("missing.csv");
    let msg = |p: &Path| {
        let net = &net;
        let p = p.display().to_string();
        async move {
            net.sql(&format!("SELECT * FROM '{p}'"))
                .await
                .unwrap_err()
                .to_string()
                .replace(&p, "PATH")
        }
    };
    assert_eq!(msg(&exists).await, msg(&missing).await);
}

async fn count(s: &clearice_engine::Session, sql: &str) -> datafusion::error::Result<usize> {
    let out = s.sql(sql).await?;
    Ok(out.batches.iter().map(|b| b.num_rows()).sum())
}

/// A Flight user's names resolve in the only catalog (or `[server]`'s and the user's own
/// defaults); DataFusion's in-memory catalog is not listed while empty, holds the external
/// tables of the session, and nothing but Iceberg tables is created in an Iceberg catalog.
#[tokio::test]
async fn network_sessions_resolve_names_in_the_configured_default_namespace() {
    let (tmp, engine, _) = lake("").await;
    let net = engine.network_session("analyst", "test");
    assert_eq!(net.namespace(), ("lake".to_owned(), "public".to_owned()));
    assert_eq!(net.catalog_names(), vec!["lake".to_owned()]);
    assert_eq!(
        count(&net, "SELECT id FROM sales.customers LIMIT 3")
            .await
            .unwrap(),
        3
    );
    let e = count(&net, "SELECT id FROM customers").await.unwrap_err();
    assert!(e.to_string().contains("lake.public.customers"), "{e}");
    // External tables: refused into the Iceberg catalog, kept in DataFusion's, then listed.
    let inside = tmp.path().join("area/in.csv");
    let e = net
        .sql(&format!(
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{}'",
            inside.display()
        ))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("CREATE EXTERNAL TABLE 'lake.public.t': external tables are session tables of catalog 'datafusion' (name it datafusion.public.t)"),
        "{e}"
    );
    net.sql(&format!(
        "CREATE EXTERNAL TABLE datafusion.public.t STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        inside.display()
    ))
    .await
    .unwrap();
    assert_eq!(
        count(&net, "SELECT x FROM datafusion.public.t")
            .await
            .unwrap(),
        1
    );
    assert_eq!(net.catalog_names().len(), 2, "listed once it holds a table");
    // The shell keeps DataFusion's default; a view named into an Iceberg catalog is refused.
    let shell = engine.session("admin");
    assert_eq!(shell.namespace().0, "datafusion");
    let e = shell
        .sql("CREATE VIEW lake.sales.v AS SELECT 1")
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "CREATE VIEW 'lake.sales.v': views in Iceberg catalogs are not supported yet"
        ),
        "{e}"
    );

    // [server] and per-user defaults; an unknown catalog is a config error naming the key.
    let dir = tmp.path().join("lake");
    let config = dir.join("clearice.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[server]\n") && text.contains("[server.users.support]\n"));
    let text = text
        .replace("[server]\n", "[server]\ndefault_schema = \"sales\"\n")
        .replace(
            "[server.users.support]\n",
            "[server.users.support]\ndefault_catalog = \"datafusion\"\n",
        );
    let engine = Engine::open(Config::parse(&text, "clearice.toml", &dir).unwrap())
        .await
        .unwrap();
    let net = engine.network_session("analyst", "test");
    assert_eq!(
        count(&net, "SELECT id FROM customers LIMIT 2")
            .await
            .unwrap(),
        2
    );
    let support = engine.network_session("support", "test");
    assert_eq!(
        support.namespace(),
        ("datafusion".to_owned(), "sales".to_owned())
    );
    let e = Config::parse(
        "[server]\ndefault_catalog = \"nope\"\n",
        "clearice.toml",
        Path::new("."),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("server.default_catalog") && e.to_string().contains("'nope'"),
        "{e}"
    );
}
