//! The coordinator's root of a distributed plan: a worker's error keeps its class, a
//! worker lost before the query returned a row costs a retry on the others, and a query
//! that cannot be finished exactly fails in one line.
//!
//! Scans are idempotent (a signed scan of a pinned snapshot), so a query whose workers
//! change before it has returned anything can be planned again from its local plan and
//! run on the workers that answer, with fresh stage and task keys. Rows are held back
//! until the query ends or they pass the retry window (`[cluster] retry_window_mb`), so a
//! query whose result fits in it survives a lost worker at any point. Once a row has left
//! the coordinator, running again could repeat it: the query then fails in one line and
//! no partial result is reported as complete.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use clearice_access::{QueryAccess, cause_of};
use clearice_iceberg::exec::only_child;
use datafusion::arrow::array::RecordBatch;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use datafusion_distributed::{
    DistributedExec, DistributedPhysicalOptimizerRule, NetworkCoalesceExec,
};
use futures::StreamExt;

use crate::coordinator::Workers;
use crate::error::ClusterError;

/// Attempts of one query, at most (the first and two retries).
pub const MAX_ATTEMPTS: usize = 3;

/// Result bytes a coordinator holds back by default while a query can still be retried,
/// MiB (`[cluster] retry_window_mb`).
pub const RETRY_WINDOW_MB: u64 = 16;

/// `plan` cut into stages for the workers (a plan the planner keeps whole runs on one
/// worker as one stage: its scans decrypt there all the same).
pub(crate) fn distributed(
    plan: &Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let distributed = DistributedPhysicalOptimizerRule.optimize(Arc::clone(plan), config)?;
    if distributed.as_any().is::<DistributedExec>() {
        return Ok(distributed);
    }
    let mut plan = Arc::clone(plan);
    if plan.output_partitioning().partition_count() > 1 {
        plan = Arc::new(CoalescePartitionsExec::new(plan));
    }
    let stage = NetworkCoalesceExec::try_new(plan, uuid::Uuid::new_v4(), 1, 1, 1)?;
    Ok(Arc::new(DistributedExec::new(Arc::new(stage))))
}

/// The root of a distributed query on the coordinator. Never sent to a worker.
#[derive(Debug)]
pub(crate) struct ClusterRootExec {
    /// The plan before it was cut into stages (planned again for a retry).
    local: Arc<dyn ExecutionPlan>,
    /// Its first distribution.
    input: Arc<dyn ExecutionPlan>,
    workers: Workers,
    /// The query's collector (planned in its scope): retries are noted for its audit.
    query: Option<QueryAccess>,
    /// Result bytes held back while the query can be retried.
    window: usize,
}

impl ClusterRootExec {
    /// The root of `input`, the distribution of `local`, for the query being planned,
    /// holding back up to `window` bytes of its result while it can be retried.
    pub(crate) fn new(
        local: Arc<dyn ExecutionPlan>,
        input: Arc<dyn ExecutionPlan>,
        workers: Workers,
        window: usize,
    ) -> Self {
        Self {
            local,
            input,
            workers,
            query: QueryAccess::current(),
            window,
        }
    }
}

impl DisplayAs for ClusterRootExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ClusterRootExec: workers={}, attempts<={MAX_ATTEMPTS}",
            self.workers.all.len()
        )
    }
}

impl ExecutionPlan for ClusterRootExec {
    fn name(&self) -> &str {
        "ClusterRootExec"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("ClusterRootExec", children)?;
        Ok(Arc::new(Self {
            local: Arc::clone(&self.local),
            input,
            workers: self.workers.clone(),
            query: self.query.clone(),
            window: self.window,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let held = MemoryConsumer::new("ClusterRetryWindow").register(context.memory_pool());
        let run = Run {
            current: None,
            first: Some(Arc::clone(&self.input)),
            local: Arc::clone(&self.local),
            workers: self.workers.clone(),
            query: self.query.clone(),
            partition,
            context,
            attempt: 1,
            held: VecDeque::new(),
            reservation: held,
            window: self.window,
            returned_rows: false,
            done: false,
        };
        let stream = futures::stream::unfold(run, |mut run| async move {
            let item = run.next().await?;
            Some((item, run))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One attempt of a query on the workers.
struct Attempt {
    stream: SendableRecordBatchStream,
    /// Declared last: the workers are told after the stream (and its calls) is dropped.
    _end: EndOnDrop,
}

/// Tells the workers, when dropped, that the attempt `query` ended.
struct EndOnDrop {
    query: uuid::Uuid,
    workers: Workers,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.workers.end_query(self.query);
    }
}

/// One execution of a [`ClusterRootExec`], across its attempts.
struct Run {
    current: Option<Attempt>,
    /// The first attempt's plan, until it starts.
    first: Option<Arc<dyn ExecutionPlan>>,
    local: Arc<dyn ExecutionPlan>,
    workers: Workers,
    query: Option<QueryAccess>,
    partition: usize,
    context: Arc<TaskContext>,
    attempt: usize,
    /// The current attempt's batches held back while it can be retried.
    held: VecDeque<RecordBatch>,
    /// Their memory, in the query's pool.
    reservation: MemoryReservation,
    /// Most bytes held back.
    window: usize,
    /// Whether rows have been (or are being) passed on: no retry after that.
    returned_rows: bool,
    /// Whether the query ended (what is still held is then passed on) or failed.
    done: bool,
}

impl Run {
    async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
        loop {
            if self.returned_rows
                && let Some(batch) = self.held.pop_front()
            {
                self.reservation
                    .shrink(batch.get_array_memory_size().min(self.reservation.size()));
                return Some(Ok(batch));
            }
            if self.done {
                return None;
            }
            let polled = match self.stream() {
                Ok(stream) => stream.next().await,
                Err(e) => Some(Err(e)),
            };
            match polled {
                Some(Ok(batch)) if self.returned_rows => return Some(Ok(batch)),
                Some(Ok(batch)) => self.hold(batch),
                None => {
                    // Complete: what is held is the whole result.
                    self.done = true;
                    self.returned_rows = true;
                }
                Some(Err(e)) => match self.retry_after(e).await {
                    Ok(()) => continue,
                    Err(e) => {
                        self.done = true;
                        self.current = None;
                        self.held.clear();
                        self.reservation.free();
                        return Some(Err(e));
                    }
                },
            }
        }
    }

    /// Holds `batch` back while the query can still be retried; once the window (or the
    /// query's memory) is full, passes on what is held: no retry after that.
    fn hold(&mut self, batch: RecordBatch) {
        let size = batch.get_array_memory_size();
        let fits = self.reservation.size() + size <= self.window
            && self.reservation.try_grow(size).is_ok();
        if !fits {
            self.returned_rows = true;
        }
        self.held.push_back(batch);
    }

    /// The stream of the current attempt (started on first use).
    fn stream(&mut self) -> DfResult<&mut SendableRecordBatchStream> {
        if self.current.is_none() {
            let plan = match self.first.take() {
                Some(plan) => plan,
                None => distributed(
                    &reset_plan_states(Arc::clone(&self.local))?,
                    self.context.session_config().options(),
                )?,
            };
            // Its scans are signed for this attempt only (encoded as it starts), and the
            // workers are told when it ends.
            let query = uuid::Uuid::new_v4();
            let end = EndOnDrop {
                query,
                workers: self.workers.clone(),
            };
            // Its stage plans carry the query, its memory limit and time left.
            let context = crate::budget::attempt_context(
                &self.context,
                query,
                self.query.as_ref().and_then(QueryAccess::deadline),
            )?;
            let stream =
                crate::queries::encoding_for(query, || plan.execute(self.partition, context))?;
            self.current = Some(Attempt { stream, _end: end });
        }
        Ok(&mut self.current.as_mut().expect("started above").stream)
    }

    /// `Ok` when the query runs again on the workers that answer after `e`; the error to
    /// report otherwise: a worker's own error with its class, or one line naming the
    /// workers lost.
    async fn retry_after(&mut self, e: DataFusionError) -> DfResult<()> {
        if let Some(on_worker) = crate::classes::tagged(&e) {
            return Err(on_worker.into());
        }
        // A call to a worker failed, here or on a worker reading a peer's stage (such
        // errors are sent untagged), or the coordinator's own part failed: which workers
        // answer now tells.
        let explained = self.workers.explain(&e).await;
        let Some(ClusterError::WorkerLost { workers, reason }) =
            cause_of::<ClusterError>(&explained)
        else {
            return Err(if cause_of::<tonic::Status>(&e).is_some() {
                explained
            } else {
                e
            });
        };
        if self.returned_rows || self.attempt >= MAX_ATTEMPTS || self.workers.live().is_empty() {
            return Err(explained);
        }
        let line = format!(
            "attempt {} stopped: cluster worker {workers} stopped answering ({reason}); \
             run again on the others",
            self.attempt
        );
        tracing::warn!(retry = %line, "distributed query retried");
        if let Some(query) = &self.query {
            query.note(line);
        }
        // Dropping the attempt's stream cancels its calls to the workers that answer;
        // what it returned so far was held back, and is dropped with it.
        self.current = None;
        self.held.clear();
        self.reservation.free();
        self.attempt += 1;
        Ok(())
    }
}
