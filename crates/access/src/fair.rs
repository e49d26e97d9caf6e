//! Fair scheduling of quadratic joins in confined sessions.
//!
//! DataFusion's nested-loop and cross joins can run for seconds (minutes, for a runaway
//! query) inside one `poll_next` without yielding: the nested-loop join probes a whole
//! right batch against every buffered left row in a loop, and a consumer pulling the
//! join's output (an aggregate) loops as long as batches are ready. On a server, such a
//! task keeps a worker thread from every other principal's queries and from the statement
//! timeout. [`FairJoins`] wraps those joins' probe input and output in [`YieldExec`]: the
//! probe side arrives in small slices and each batch is preceded by a yield to the
//! scheduler, so one poll does a bounded amount of work and cancellation takes effect
//! within milliseconds.

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec,
};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{FutureExt, Stream};

/// Row pairs a nested-loop/cross join may evaluate in one poll: its probe side is sliced to
/// `PAIRS_PER_POLL / build rows` rows (at least 1, at most 8192), so the work between two
/// yields stays bounded whatever the build side's size. Much smaller slices cost more in
/// total (DataFusion's nested-loop join does per-probe-batch work proportional to the build
/// side), so the bound is generous.
const PAIRS_PER_POLL: usize = 1 << 23;

/// Probe-side slice for a build side of `build_rows` rows (unknown: as for 65536 rows).
fn probe_slice_rows(build_rows: Option<usize>) -> usize {
    (PAIRS_PER_POLL / build_rows.unwrap_or(65_536).max(1)).clamp(1, 8192)
}

/// Yields to the scheduler before each batch, re-slicing batches to `max_rows` if set.
#[derive(Debug)]
pub struct YieldExec {
    input: Arc<dyn ExecutionPlan>,
    max_rows: Option<usize>,
}

impl YieldExec {
    /// `input`, yielding before each batch; batches re-sliced to `max_rows` rows if set.
    pub fn new(input: Arc<dyn ExecutionPlan>, max_rows: Option<usize>) -> Self {
        Self { input, max_rows }
    }

    /// The slice size, if the input is re-sliced.
    pub fn max_rows(&self) -> Option<usize> {
        self.max_rows
    }
}

impl DisplayAs for YieldExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.max_rows {
            Some(n) => write!(f, "YieldExec: slices={n}"),
            None => write!(f, "YieldExec"),
        }
    }
}

impl ExecutionPlan for YieldExec {
    fn name(&self) -> &str {
        "YieldExec"
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

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(children.swap_remove(0), self.max_rows)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(YieldStream {
            inner: self.input.execute(partition, context)?,
            max_rows: self.max_rows,
            pending: None,
            yielding: None,
        }))
    }
}

struct YieldStream {
    inner: SendableRecordBatchStream,
    max_rows: Option<usize>,
    /// Rest of a batch being sliced.
    pending: Option<RecordBatch>,
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Stream for YieldStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let y = self
            .yielding
            .get_or_insert_with(|| tokio::task::yield_now().boxed());
        if y.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.yielding = None;
        let batch = match self.pending.take() {
            Some(b) => b,
            None => match self.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(b))) => b,
                other => return other,
            },
        };
        match self.max_rows {
            Some(n) if batch.num_rows() > n => {
                self.pending = Some(batch.slice(n, batch.num_rows() - n));
                Poll::Ready(Some(Ok(batch.slice(0, n))))
            }
            _ => Poll::Ready(Some(Ok(batch))),
        }
    }
}

impl RecordBatchStream for YieldStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

/// Physical optimizer rule of confined sessions: [`YieldExec`] around joins whose work per
/// poll is unbounded.
#[derive(Debug, Default)]
pub struct FairJoins;

impl PhysicalOptimizerRule for FairJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let any = node.as_any();
            let quadratic = any.is::<NestedLoopJoinExec>() || any.is::<CrossJoinExec>();
            let join = quadratic || any.is::<HashJoinExec>() || any.is::<SortMergeJoinExec>();
            if !join {
                return Ok(Transformed::no(node));
            }
            let node = if quadratic {
                let mut children: Vec<Arc<dyn ExecutionPlan>> =
                    node.children().into_iter().cloned().collect();
                let build_rows = children
                    .first()
                    .and_then(|b| b.partition_statistics(None).ok())
                    .and_then(|s| s.num_rows.get_value().copied());
                if let Some(probe) = children.pop() {
                    children.push(Arc::new(YieldExec::new(
                        probe,
                        Some(probe_slice_rows(build_rows)),
                    )));
                }
                Arc::clone(&node).with_new_children(children)?
            } else {
                node
            };
            Ok(Transformed::yes(
                Arc::new(YieldExec::new(node, None)) as Arc<dyn ExecutionPlan>
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "clearice_fair_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::probe_slice_rows;

    #[test]
    fn probe_slices_shrink_as_the_build_side_grows() {
        assert_eq!(probe_slice_rows(Some(100)), 8192);
        assert_eq!(probe_slice_rows(Some(100_000)), 83);
        assert_eq!(probe_slice_rows(Some(50_000_000)), 1);
        assert_eq!(probe_slice_rows(None), 128);
    }
}
