//! The node that applies a principal's masks to a policy scan's output, batch by batch.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use clearice_crypto::MaskKey;
use clearice_policy::Decision;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use crate::mask;
use clearice_iceberg::exec::{map_batches, mapped_properties, only_child};

/// One output column of [`PolicyMaskExec`].
#[derive(Debug, Clone)]
pub struct MaskOutput {
    /// The column's name.
    pub name: String,
    /// What the principal sees of it.
    pub decision: Decision,
    /// Input column (absent for constant masks: nothing was read or decrypted).
    pub input: Option<usize>,
    /// The output type.
    pub data_type: DataType,
}

/// Applies a principal's masks to the scan's output. Blocks filter pushdown (the
/// default), so no predicate on a masked value reaches the scan or its statistics.
#[derive(Debug)]
pub struct PolicyMaskExec {
    input: Arc<dyn ExecutionPlan>,
    outputs: Vec<MaskOutput>,
    schema: SchemaRef,
    principal: String,
    /// The `hmac_sha256` mask's secret (`Debug` shows its check value only).
    mask_key: Option<Arc<MaskKey>>,
    properties: Arc<PlanProperties>,
}

impl PolicyMaskExec {
    pub(crate) fn new(
        input: Arc<dyn ExecutionPlan>,
        outputs: Vec<MaskOutput>,
        schema: SchemaRef,
        principal: String,
        mask_key: Option<Arc<MaskKey>>,
    ) -> Self {
        let properties = mapped_properties(&input, &schema);
        Self {
            input,
            outputs,
            schema,
            principal,
            mask_key,
            properties,
        }
    }
}

impl DisplayAs for PolicyMaskExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyMaskExec: principal={}, columns=[", self.principal)?;
        for (i, o) in self.outputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let how = if o.input.is_some() {
                "decrypted"
            } else {
                "not read"
            };
            write!(f, "{}={} ({how})", o.name, o.decision)?;
        }
        f.write_str("]")
    }
}

impl ExecutionPlan for PolicyMaskExec {
    fn name(&self) -> &str {
        "PolicyMaskExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            only_child("PolicyMaskExec", children)?,
            self.outputs.clone(),
            Arc::clone(&self.schema),
            self.principal.clone(),
            self.mask_key.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let outputs = self.outputs.clone();
        let schema = Arc::clone(&self.schema);
        let s = Arc::clone(&schema);
        let key = self.mask_key.clone();
        Ok(map_batches(input, schema, move |batch| {
            let rows = batch.num_rows();
            let cols: Vec<ArrayRef> = outputs
                .iter()
                .map(|o| {
                    let col = o.input.map(|i| batch.column(i));
                    match &o.decision {
                        Decision::Plaintext => col
                            .cloned()
                            .ok_or_else(|| DataFusionError::Internal("no input".into())),
                        Decision::Mask(m) => {
                            mask::apply(m, col, &o.data_type, rows, key.as_deref())
                        }
                        Decision::Hide | Decision::Deny => {
                            Err(DataFusionError::Internal("hidden column in output".into()))
                        }
                    }
                })
                .collect::<Result<_>>()?;
            Ok(RecordBatch::try_new_with_options(
                Arc::clone(&s),
                cols,
                &RecordBatchOptions::new().with_row_count(Some(rows)),
            )?)
        }))
    }
}
