//! The decision matrix over the lake PyArrow and PyIceberg wrote.

use clearice_testkit::matrix::run_matrix;

use crate::lake::interop;

#[tokio::test]
async fn decision_matrix_over_the_pyarrow_interop_lake() {
    let Some(lake) = interop().await else { return };
    run_matrix(&lake, "lake.sales.customers").await;
}
