//! The node that names, in `EXPLAIN`, the snapshot a time travel scan reads.

use std::any::Any;
use std::sync::Arc;

use datafusion::common::Statistics;
use datafusion::error::Result as DfResult;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;

use crate::provider::AsOf;

/// Names the snapshot a time travel scan reads, in `EXPLAIN`; otherwise transparent
/// (rows, partitioning, statistics and filter pushdown are its input's).
#[derive(Debug)]
pub struct IcebergSnapshotExec {
    pub(crate) input: Arc<dyn ExecutionPlan>,
    pub(crate) table: String,
    pub(crate) snapshot_id: i64,
    pub(crate) as_of: AsOf,
}

impl datafusion::physical_plan::DisplayAs for IcebergSnapshotExec {
    fn fmt_as(
        &self,
        _t: datafusion::physical_plan::DisplayFormatType,
        f: &mut std::fmt::Formatter<'_>,
    ) -> std::fmt::Result {
        write!(
            f,
            "IcebergSnapshotExec: table={}, snapshot_id={} (as of {})",
            self.table, self.snapshot_id, self.as_of
        )
    }
}

impl ExecutionPlan for IcebergSnapshotExec {
    fn name(&self) -> &str {
        "IcebergSnapshotExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            input: crate::exec::only_child("IcebergSnapshotExec", children)?,
            table: self.table.clone(),
            snapshot_id: self.snapshot_id,
            as_of: self.as_of.clone(),
        }))
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<datafusion::execution::TaskContext>,
    ) -> DfResult<datafusion::execution::SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn partition_statistics(&self, partition: Option<usize>) -> DfResult<Statistics> {
        self.input.partition_statistics(partition)
    }

    fn gather_filters_for_pushdown(
        &self,
        _phase: datafusion::physical_plan::filter_pushdown::FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &datafusion::common::config::ConfigOptions,
    ) -> DfResult<datafusion::physical_plan::filter_pushdown::FilterDescription> {
        datafusion::physical_plan::filter_pushdown::FilterDescription::from_children(
            parent_filters,
            &self.children(),
        )
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: datafusion::physical_plan::filter_pushdown::FilterPushdownPhase,
        child_pushdown_result: datafusion::physical_plan::filter_pushdown::ChildPushdownResult,
        _config: &datafusion::common::config::ConfigOptions,
    ) -> DfResult<
        datafusion::physical_plan::filter_pushdown::FilterPushdownPropagation<
            Arc<dyn ExecutionPlan>,
        >,
    > {
        Ok(
            datafusion::physical_plan::filter_pushdown::FilterPushdownPropagation::if_all(
                child_pushdown_result,
            ),
        )
    }
}
