//! `[execution] memory_limit_mb`: one memory pool for every statement of the process;
//! sorts spill under it, and what cannot spill fails in one line naming the setting.

use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine, ErrorClass, classify};
use datafusion::arrow::compute::concat_batches;

#[tokio::test]
async fn a_bounded_pool_spills_sorts_and_names_itself_when_it_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let config = demo::init(&tmp.path().join("lake")).await.unwrap();
    let unbounded = Engine::open(Config::load(&config).unwrap()).await.unwrap();
    // The same lake (relative paths resolve against the config's directory).
    let bounded_config = config.with_file_name("bounded.toml");
    std::fs::write(
        &bounded_config,
        format!(
            "[execution]\nmemory_limit_mb = 48\n\n{}",
            std::fs::read_to_string(&config).unwrap()
        ),
    )
    .unwrap();
    let bounded = Arc::new(
        Engine::open(Config::load(&bounded_config).unwrap())
            .await
            .unwrap(),
    );

    // 800,000 rows of six columns (~100 MiB) sorted in a 48 MiB pool (of which each of
    // the two sorters keeps 10 MiB to merge): spilled, and in the same order as without
    // a limit.
    let sort = "SELECT order_id, customer_id, order_date, card_number, status, copy \
                FROM lake.sales.orders CROSS JOIN (VALUES (1), (2), (3), (4)) AS c(copy) \
                ORDER BY status, card_number DESC, order_id, copy";
    let want = unbounded
        .session_for("admin", "test")
        .sql(sort)
        .await
        .unwrap();
    let got = bounded
        .session_for("admin", "test")
        .sql(sort)
        .await
        .unwrap();
    assert_eq!(got.rows(), 4 * demo::ORDERS);
    assert_eq!(
        concat_batches(&got.schema, &got.batches).unwrap(),
        concat_batches(&want.schema, &want.batches).unwrap()
    );
    let plan = bounded
        .session_for("admin", "test")
        .sql(&format!("EXPLAIN ANALYZE {sort}"))
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    let spills: Vec<&str> = text
        .split(|c: char| c == ',' || c == ']' || c.is_whitespace())
        .filter(|m| m.starts_with("spill_count="))
        .collect();
    assert!(
        spills.iter().any(|m| *m != "spill_count=0"),
        "the sort did not spill: {text}"
    );

    // Under the bound, hash joins are charged for the strings they hold: their build side
    // and output compacted (clearice_access::compact); without one, DataFusion's plan.
    let join = "EXPLAIN SELECT c.name, o.status FROM lake.sales.orders o \
                JOIN lake.sales.customers c ON o.customer_id = c.id";
    let plan_of = async |engine: &Engine| {
        let out = engine.session_for("admin", "test").sql(join).await.unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&out.batches)
            .unwrap()
            .to_string()
    };
    let compacted = plan_of(&bounded).await;
    assert!(compacted.contains("HashJoinExec"), "{compacted}");
    assert_eq!(
        compacted.matches("CompactViewsExec").count(),
        2,
        "{compacted}"
    );
    assert!(!plan_of(&unbounded).await.contains("CompactViewsExec"));
    let rows = |out: &clearice_engine::QueryOutput| out.rows();
    let sql = &join["EXPLAIN ".len()..];
    assert_eq!(
        rows(&bounded.session_for("admin", "test").sql(sql).await.unwrap()),
        rows(
            &unbounded
                .session_for("admin", "test")
                .sql(sql)
                .await
                .unwrap()
        )
    );

    // One aggregate state of every card number cannot spill: refused, naming the setting.
    let e = bounded
        .session_for("admin", "test")
        .sql("SELECT array_agg(card_number ORDER BY order_id) FROM lake.sales.orders")
        .await
        .unwrap_err();
    assert_eq!(classify(&e), ErrorClass::ResourceLimit, "{e}");
    let line = e.to_string();
    assert!(line.contains("[execution] memory_limit_mb"), "{line}");
    // Nothing stays reserved after either statement (the refused statement's other
    // partitions release theirs as their tasks end, a moment after the error returns).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while bounded.memory_reserved() != 0 && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(bounded.memory_reserved(), 0);
    // Without a limit the same aggregate runs.
    let all = unbounded
        .session_for("admin", "test")
        .sql("SELECT array_agg(card_number ORDER BY order_id) FROM lake.sales.orders")
        .await
        .unwrap();
    assert_eq!(all.rows(), 1);
}
