//! Answers never come from footer statistics: a file's bounds leave NaN out and write a
//! zero minimum as -0.0, so `min`/`max`/`count`, a column DataFusion would replace by a
//! constant, and a predicate pruned by bounds must all read the rows.

use crate::common::query;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_and_filters_read_rows_not_footer_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = crate::common::demo_engine(&tmp.path().join("lake")).await;
    let admin = engine.session("admin");
    // One file: x is 2.5, NaN, 2.5 (its footer says min = max = 2.5), z is all zeros,
    // n has a NULL.
    query(
        &admin,
        "CREATE TABLE lake.sales.floats AS SELECT * FROM (VALUES \
         (1, CAST(2.5 AS DOUBLE), CAST(0.0 AS DOUBLE), 1), \
         (2, CAST('NaN' AS DOUBLE), CAST(0.0 AS DOUBLE), NULL), \
         (3, CAST(2.5 AS DOUBLE), CAST(0.0 AS DOUBLE), 3)) AS t(id, x, z, n)",
    )
    .await
    .unwrap();
    let x = query(&admin, "SELECT x FROM lake.sales.floats ORDER BY id")
        .await
        .unwrap();
    let x: Vec<f64> = x
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Float64Type>().values().to_vec())
        .collect();
    assert_eq!(x.len(), 3);
    assert!(x[0] == 2.5 && x[1].is_nan() && x[2] == 2.5, "{x:?}");

    let b = query(
        &admin,
        "SELECT max(x), 1 / min(z), count(n), count(*), \
         (SELECT count(*) FROM lake.sales.floats WHERE x > 3) AS above FROM lake.sales.floats",
    )
    .await
    .unwrap();
    let row = &b[0];
    let f = |i: usize| row.column(i).as_primitive::<Float64Type>().value(0);
    let n = |i: usize| row.column(i).as_primitive::<Int64Type>().value(0);
    assert!(f(0).is_nan(), "max(x) = {}", f(0));
    assert_eq!(f(1), f64::INFINITY, "min(z) must be +0.0");
    assert_eq!(n(2), 2, "count(n)");
    assert_eq!(n(3), 3, "count(*)");
    assert_eq!(
        n(4),
        1,
        "NaN > 3 (DataFusion orders NaN above every number)"
    );
    assert_eq!(row.num_rows(), 1);
    assert!(!row.column(0).is_null(0));
}
