//! What ClearIce's one-input plan nodes (`PolicyMaskExec`, `IcebergDeletesExec`,
//! `IcebergSnapshotExec`) share.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, PlanProperties};
use futures::StreamExt;

/// The single child `with_new_children` gets for a one-input node.
pub fn only_child(
    node: &str,
    children: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    children
        .into_iter()
        .next()
        .ok_or_else(|| DataFusionError::Internal(format!("{node}: no child")))
}

/// Properties of a node that maps its input's batches to `schema` batch by batch (same
/// partitioning, no ordering kept).
pub fn mapped_properties(
    input: &Arc<dyn ExecutionPlan>,
    schema: &SchemaRef,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        input.properties().output_partitioning().clone(),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// `input` with `f` applied to every batch.
pub fn map_batches(
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    mut f: impl FnMut(RecordBatch) -> Result<RecordBatch> + Send + 'static,
) -> SendableRecordBatchStream {
    let stream = input.map(move |batch| f(batch?));
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}
