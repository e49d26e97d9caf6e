//! A query's budget on each worker: the memory limit its coordinator gives it, capped by
//! the worker's own `[cluster] query_memory_mb`, and its time, capped by the worker's
//! `[cluster] query_timeout_s`.

use std::time::{Duration, Instant};

use clearice_engine::{Engine, ErrorClass, classify};

use crate::cluster::{TestWorker, cluster_of, still_answers};
use crate::common::*;

/// A hash join whose build side (100,000 customers) a worker holds in memory.
const JOIN: &str = "SELECT c.country, count(*), sum(o.amount) FROM lake.sales.orders o \
                    JOIN lake.sales.customers c ON o.customer_id = c.id GROUP BY c.country";

/// 100,000 groups, aggregated in a second stage after a shuffle between workers.
const GROUPS: &str = "SELECT email, count(*) FROM lake.sales.customers GROUP BY email \
                      ORDER BY 2 DESC, 1 LIMIT 5";

/// A nested-loop join of 100,000 × 100,000 rows, planned whole on the workers: tens of
/// seconds of work there.
const SLOW: &str = "SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b \
                    WHERE a.id + b.id = 7";

async fn cluster(extra: &str) -> (tempfile::TempDir, std::sync::Arc<Engine>, Vec<TestWorker>) {
    let tmp = tempfile::tempdir().unwrap();
    let config = clearice_demo::init(&tmp.path().join("lake")).await.unwrap();
    let (coordinator, workers) = cluster_of(&config, extra).await;
    (tmp, coordinator, workers)
}

/// Waits until no worker holds memory for a query: a failed query's stages are dropped
/// when the coordinator ends it, also those it stopped reading.
async fn workers_release_their_memory(workers: &[TestWorker]) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let held: Vec<usize> = workers.iter().map(|w| w.engine.memory_reserved()).collect();
        if held.iter().all(|&b| b == 0) {
            return;
        }
        assert!(Instant::now() < until, "workers still hold {held:?} bytes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_coordinators_memory_limit_for_a_query_holds_on_each_worker() {
    // Flight sessions get 2 MiB per query; the workers set no cap of their own.
    let (_tmp, coordinator, workers) = cluster("[server.limits]\nquery_memory_mb = 2\n").await;
    let e = query(&coordinator.network_session("admin", "test"), JOIN)
        .await
        .unwrap_err();
    assert_eq!(classify(&e), ErrorClass::ResourceLimit, "{e}");
    // Refused by a worker's pool for the query (the coordinator's own says
    // "[server.limits] query_memory_mb").
    let text = e.to_string();
    assert!(
        text.contains("query memory limit of 2 MiB reached by HashJoinInput")
            && text.contains("the query's memory limit on its coordinator, applied on each worker"),
        "{text}"
    );
    workers_release_their_memory(&workers).await;
    // A plan of several stages (a shuffle between workers) cut short by its limit or by
    // the LIMIT: what its stages hold, peers' buffers included, goes when it ends.
    let plan = crate::cluster::explain(&coordinator, "admin", GROUPS).await;
    assert!(plan.contains("NetworkShuffleExec"), "{plan}");
    if let Err(e) = query(&coordinator.network_session("admin", "test"), GROUPS).await {
        assert_eq!(classify(&e), ErrorClass::ResourceLimit, "{e}");
    }
    workers_release_their_memory(&workers).await;
    // The same query without a limit (a local session) runs on the same workers.
    let rows: usize = query(&coordinator.session("admin"), JOIN)
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(rows > 0);
    workers_release_their_memory(&workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workers_own_caps_bound_every_query_it_runs() {
    let (_tmp, coordinator, workers) = cluster("query_memory_mb = 2\nquery_timeout_s = 2\n").await;
    // A local session has no limit of its own: the workers' cap applies.
    let e = query(&coordinator.session("admin"), JOIN)
        .await
        .unwrap_err();
    assert_eq!(classify(&e), ErrorClass::ResourceLimit, "{e}");
    assert!(
        e.to_string()
            .contains("the worker's [cluster] query_memory_mb"),
        "{e}"
    );
    workers_release_their_memory(&workers).await;
    // A query that runs longer than the workers allow stops there, with the timeout's
    // class, soon after (its quadratic join yields on the workers).
    let started = Instant::now();
    let e = query(&coordinator.session("admin"), SLOW)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(classify(&e), ErrorClass::Timeout, "{e}");
    assert!(
        e.to_string().contains(
            "statement cancelled on a cluster worker: the query ran longer than the worker's [cluster] query_timeout_s"
        ),
        "{e}"
    );
    assert!(took < Duration::from_secs(15), "stopped after {took:?}");
    workers_release_their_memory(&workers).await;
    // Queries within both caps still run.
    still_answers(&coordinator).await;
}
