//! Hash-join build sides whose memory the pool sees as it is.
//!
//! DataFusion 53's hash join reserves `get_record_batch_memory_size` of every build-side
//! batch it collects. A `StringView`/`BinaryView` column that was taken, filtered or
//! repartitioned from a larger batch keeps pointing into the larger batch's data buffers,
//! and each small batch is charged for all of them: TPC-H q10 at SF10 reserved 2.9 GB for
//! build sides in a process whose peak RSS was 1.0 GB, so under a 4 GiB pool the query was
//! refused while it needed a quarter of it (apache/datafusion#22861, fixed after 53).
//! The join's output has the same shape (its build-side columns are taken from the whole
//! build side), and a `RepartitionExec` above it, charged for each batch the same way,
//! spilled 4.7 GB to disk for 163,000 rows of q10 under that pool.
//! [`CompactJoinBuilds`] puts [`CompactViewsExec`] under every hash join's build side and
//! over its output: a view column holding more than twice the bytes its values use is
//! copied into buffers of its own (`gc`), so what an operator reserves is what it keeps
//! alive, and the shared buffers can be freed.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::ByteViewType;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use clearice_iceberg::exec::map_batches;

/// Below this many data-buffer bytes a column is left as it is (copying costs more than
/// the over-count matters).
const MIN_HELD_BYTES: usize = 1 << 16;

/// Compacts the view columns of each batch that hold far more than they use.
#[derive(Debug)]
pub struct CompactViewsExec {
    input: Arc<dyn ExecutionPlan>,
}

impl CompactViewsExec {
    /// `input`, its view columns compacted batch by batch.
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for CompactViewsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactViewsExec")
    }
}

impl ExecutionPlan for CompactViewsExec {
    fn name(&self) -> &str {
        "CompactViewsExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn partition_statistics(
        &self,
        partition: Option<usize>,
    ) -> Result<datafusion::common::Statistics> {
        // The same rows: the input's statistics (join sizing, FairJoins' slices).
        self.input.partition_statistics(partition)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(children.swap_remove(0))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        Ok(map_batches(input, schema, compact))
    }
}

/// `batch` with every view column that holds more than twice the bytes its values use
/// (and at least 64 KiB) copied into buffers of its own; other columns, and
/// batches with nothing to gain, are returned as they are.
pub fn compact(batch: RecordBatch) -> Result<RecordBatch> {
    let mut changed = false;
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| {
            let compacted = match c.data_type() {
                DataType::Utf8View => compacted(c.as_string_view()),
                DataType::BinaryView => compacted(c.as_binary_view()),
                _ => None,
            };
            changed |= compacted.is_some();
            compacted.unwrap_or_else(|| Arc::clone(c))
        })
        .collect();
    if !changed {
        return Ok(batch);
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// `a` copied into buffers of its own if it is [`wasteful`]; `None` if it is not.
fn compacted<T: ByteViewType + ?Sized>(a: &GenericByteViewArray<T>) -> Option<ArrayRef> {
    wasteful(a.views(), a.data_buffers()).then(|| Arc::new(a.gc()) as ArrayRef)
}

/// Whether buffers of `held` bytes serve values using less than half of them. A view's
/// low 32 bits are its length; values of up to 12 bytes live in the view itself.
fn wasteful(views: &[u128], buffers: &[Buffer]) -> bool {
    let held: usize = buffers.iter().map(Buffer::capacity).sum();
    if held < MIN_HELD_BYTES {
        return false;
    }
    let used: usize = views
        .iter()
        .map(|v| match *v as u32 {
            len if len > 12 => len as usize,
            _ => 0,
        })
        .sum();
    held > used.saturating_mul(2)
}

/// Physical optimizer rule: [`CompactViewsExec`] under every hash join's build side and
/// over every hash join's output that have view columns.
#[derive(Debug, Default)]
pub struct CompactJoinBuilds;

impl PhysicalOptimizerRule for CompactJoinBuilds {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let has_views = |plan: &Arc<dyn ExecutionPlan>| {
            !plan.as_any().is::<CompactViewsExec>()
                && plan
                    .schema()
                    .fields()
                    .iter()
                    .any(|f| matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView))
        };
        // Once per plan: a plan that has the nodes already is left as it is.
        let mut planned = false;
        plan.apply(|node| {
            planned |= node.as_any().is::<CompactViewsExec>();
            Ok(if planned {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        if planned {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            if !node.as_any().is::<HashJoinExec>() {
                return Ok(Transformed::no(node));
            }
            let mut children: Vec<Arc<dyn ExecutionPlan>> =
                node.children().into_iter().cloned().collect();
            let mut changed = false;
            if let Some(build) = children.first_mut()
                && has_views(build)
            {
                *build = Arc::new(CompactViewsExec::new(Arc::clone(build)));
                changed = true;
            }
            let node = if changed {
                node.with_new_children(children)?
            } else {
                node
            };
            // The join's output takes rows of the whole build side: its view columns
            // point into all of it, and a repartition above would charge (and spill)
            // every batch for all of it too.
            if has_views(&node) {
                return Ok(Transformed::yes(
                    Arc::new(CompactViewsExec::new(node)) as Arc<dyn ExecutionPlan>
                ));
            }
            Ok(if changed {
                Transformed::yes(node)
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "clearice_compact_join_builds"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use datafusion::common::NullEquality;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::memory_pool::FairSpillPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::logical_expr::JoinType;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::joins::PartitionMode;

    /// A hash join whose build side is 50 batches of 2,000 rows taken from one 100,000-row
    /// string column (~5 MB of strings): DataFusion 53 charges each batch for all of it.
    fn join_over_taken_views() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt32, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let big = StringViewArray::from_iter_values(
            (0..100_000).map(|i| format!("customer name and address #{i:08}")),
        );
        let build: Vec<RecordBatch> = (0..50u32)
            .map(|b| {
                let rows =
                    UInt32Array::from_iter_values((0..2000).map(|i| (b * 2000 + i) * 7 % 100_000));
                let keys = UInt32Array::from_iter_values((0..2000).map(|i| b * 2000 + i));
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(keys), take(&big, &rows, None).unwrap()],
                )
                .unwrap()
            })
            .collect();
        let probe_schema = Arc::new(Schema::new(vec![Field::new("k", DataType::UInt32, false)]));
        let probe = RecordBatch::try_new(
            Arc::clone(&probe_schema),
            vec![Arc::new(UInt32Array::from_iter_values(
                (0..100_000).step_by(3),
            ))],
        )
        .unwrap();
        let left = MemorySourceConfig::try_new_exec(&[build], Arc::clone(&schema), None).unwrap();
        let right =
            MemorySourceConfig::try_new_exec(&[vec![probe]], Arc::clone(&probe_schema), None)
                .unwrap();
        let on = vec![(col("k", &schema).unwrap(), col("k", &probe_schema).unwrap())];
        Arc::new(
            HashJoinExec::try_new(
                left,
                right,
                on,
                None,
                &JoinType::Inner,
                None,
                PartitionMode::CollectLeft,
                NullEquality::NullEqualsNothing,
                false,
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn a_join_built_from_taken_views_fits_the_pool_once_compacted() {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(64 << 20)))
            .build_arc()
            .unwrap();
        let ctx = Arc::new(TaskContext::default().with_runtime(runtime));
        // As DataFusion plans it: refused, the build side charged ~50 x 5 MB.
        let e = collect(join_over_taken_views(), Arc::clone(&ctx))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("HashJoinInput"), "{e}");
        // With the rule: the build side compacted, and the same rows as without a limit.
        let plan = CompactJoinBuilds
            .optimize(join_over_taken_views(), &ConfigOptions::default())
            .unwrap();
        assert!(
            plan.as_any().is::<CompactViewsExec>(),
            "the output is compacted"
        );
        assert!(
            plan.children()[0].children()[0]
                .as_any()
                .is::<CompactViewsExec>(),
            "the build side is compacted"
        );
        // Applied again (a state built from another): the same plan.
        let again = CompactJoinBuilds
            .optimize(Arc::clone(&plan), &ConfigOptions::default())
            .unwrap();
        assert!(Arc::ptr_eq(&again, &plan));
        assert_eq!(
            plan.partition_statistics(None).unwrap().num_rows,
            plan.children()[0]
                .partition_statistics(None)
                .unwrap()
                .num_rows
        );
        let got = collect(plan, ctx).await.unwrap();
        let want = collect(join_over_taken_views(), Arc::new(TaskContext::default()))
            .await
            .unwrap();
        assert_eq!(got, want);
        assert_eq!(got.iter().map(RecordBatch::num_rows).sum::<usize>(), 33_334);
    }
    use datafusion::arrow::array::{StringViewArray, UInt32Array};
    use datafusion::arrow::compute::take;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn taken_views_are_compacted_and_keep_their_values() {
        let values: Vec<String> = (0..20_000)
            .map(|i| format!("a value longer than twelve bytes #{i}"))
            .collect();
        let big = StringViewArray::from_iter_values(values.iter());
        // Ten rows taken from 20,000: the views still point into all of the buffers.
        let rows = UInt32Array::from_iter_values((0..10).map(|i| i * 997));
        let taken = take(&big, &rows, None).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("t", DataType::Utf8View, true),
        ]));
        let small = Arc::new(StringViewArray::from(vec![
            Some("short"),
            None,
            Some("x"),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ])) as ArrayRef;
        let batch =
            RecordBatch::try_new(schema, vec![Arc::clone(&taken), Arc::clone(&small)]).unwrap();
        let before = batch.get_array_memory_size();
        let out = compact(batch.clone()).unwrap();
        assert_eq!(out, batch, "values changed");
        assert!(
            out.get_array_memory_size() * 20 < before,
            "{} bytes after, {before} before",
            out.get_array_memory_size()
        );
        // A column using its buffers, and one without buffers, stay the same arrays.
        assert!(Arc::ptr_eq(out.column(1), &small));
        let whole = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)])),
            vec![Arc::new(big) as ArrayRef],
        )
        .unwrap();
        assert!(Arc::ptr_eq(
            compact(whole.clone()).unwrap().column(0),
            whole.column(0)
        ));
    }
}
