//! A query's budget on each worker: the memory it may reserve there, how long it may run,
//! and what it holds once it ended. The coordinator sends the limits with every stage
//! plan of an attempt (headers of its SetPlan calls, which are authenticated like every
//! call); a worker caps them with its own `[cluster] query_memory_mb` and
//! `query_timeout_s`, runs all the tasks of one query in one memory pool of that size (a
//! share of its own pool), stops a stage that runs past the query's deadline, and drops
//! the state of the query's stages (buffers, hash tables) when the coordinator ends it:
//! a stage the query stopped reading (a failed or cancelled query) would otherwise hold
//! its memory until datafusion-distributed forgets the task.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use clearice_access::limits::QueryMemoryPool;
use clearice_access::{Deadline, ErrorClass};
use clearice_iceberg::exec::only_child;
use datafusion::arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_distributed::DistributedExt;
use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use tonic::codegen::http::{HeaderMap, HeaderValue};
use uuid::Uuid;

use crate::error::refused;
use crate::queries::{EndedQueries, QUERY_HEADER, query_in};

/// The header of a stage plan giving the memory its query may reserve on each worker, in
/// bytes (the coordinator's limit for the query; none when it has none).
pub const MEMORY_HEADER: &str = "x-clearice-query-memory";

/// The header of a stage plan giving the time its query has left, in milliseconds, when
/// the attempt started (none without a statement timeout).
pub const TIMEOUT_HEADER: &str = "x-clearice-query-timeout-ms";

/// A worker's default for the longest a query may run on it without a statement
/// timeout of its own, seconds: as long as its scans stay valid.
pub const QUERY_TIMEOUT_S: u64 = 3600;

/// The longest a worker lets a query run, whatever its config says.
const MAX_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How far a query's buffers may grow past its limit on a worker (datafusion-distributed
/// charges what it receives from peers without asking the pool) before the stage fails:
/// a quarter of the limit.
const OVERSHOOT_DIVISOR: usize = 4;

/// How often a waiting stage checks its query's memory.
const MEMORY_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The context an attempt's stage plans are sent with: `context`, with headers naming
/// the attempt `query`, the memory limit of `context`'s pool and the time left before
/// `deadline`.
pub(crate) fn attempt_context(
    context: &Arc<TaskContext>,
    query: Uuid,
    deadline: Option<Deadline>,
) -> DfResult<Arc<TaskContext>> {
    let mut headers = HeaderMap::new();
    headers.insert(QUERY_HEADER, header(query.to_string()));
    if let MemoryLimit::Finite(bytes) = context.memory_pool().memory_limit() {
        headers.insert(MEMORY_HEADER, header(bytes.to_string()));
    }
    if let Some(deadline) = deadline {
        let left = deadline.at.saturating_duration_since(Instant::now());
        headers.insert(TIMEOUT_HEADER, header(left.as_millis().to_string()));
    }
    let config = context
        .session_config()
        .clone()
        .with_distributed_passthrough_headers(headers)?;
    Ok(Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    )))
}

fn header(value: String) -> HeaderValue {
    HeaderValue::from_str(&value).expect("digits, letters and dashes")
}

/// What one task may use on this worker, kept in its session's config for its
/// [`StageExec`].
#[derive(Debug, Clone)]
pub(crate) struct TaskBudget {
    /// The query (the coordinator's attempt) the task belongs to.
    query: Uuid,
    /// When the task's streams stop.
    deadline: Instant,
    /// What set the deadline, for the error.
    timeout_by: &'static str,
    /// The query's memory limit on this worker, if it has one.
    memory_limit: Option<usize>,
}

/// A worker's budgets: its caps, the memory pool of each query it runs, and the stages
/// each query started.
#[derive(Debug)]
pub struct QueryBudgets {
    memory_cap: Option<usize>,
    timeout_cap: Duration,
    /// Each running query's pool, shared by its tasks (dropped with its last task).
    pools: Mutex<HashMap<Uuid, Weak<QueryMemoryPool>>>,
    /// The started stages of each query, released when it ends.
    stages: Mutex<HashMap<Uuid, Vec<Weak<Mutex<Running>>>>>,
}

impl QueryBudgets {
    /// Budgets capped at `memory_cap` bytes (none: the coordinator's limit alone) and
    /// `timeout_cap` per query.
    pub fn new(memory_cap: Option<usize>, timeout_cap: Duration) -> Self {
        Self {
            memory_cap,
            // An `Instant` a century ahead is still representable.
            timeout_cap: timeout_cap.min(MAX_TIMEOUT),
            pools: Mutex::new(HashMap::new()),
            stages: Mutex::new(HashMap::new()),
        }
    }

    /// The budget and memory pool (a share of `shared`) of a task whose SetPlan call
    /// carried `headers`; refused when it names no query or one that `ended`.
    pub(crate) fn admit(
        &self,
        headers: &HeaderMap,
        shared: &Arc<dyn MemoryPool>,
        ended: &EndedQueries,
    ) -> DfResult<(TaskBudget, Arc<dyn MemoryPool>)> {
        let query = query_in(headers)
            .ok_or_else(|| refused(format!("a stage plan without its query ({QUERY_HEADER})")))?;
        if ended.has_ended(&query) {
            return Err(refused(
                "a stage plan of a query that ended (a stage plan is valid only while its query runs)",
            ));
        }
        let number = |name: &str| -> DfResult<Option<u64>> {
            headers
                .get(name)
                .map(|v| {
                    v.to_str().ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
                        refused(format!("a stage plan whose {name} is not a number"))
                    })
                })
                .transpose()
        };
        let sent_memory = number(MEMORY_HEADER)?.map(|b| usize::try_from(b).unwrap_or(usize::MAX));
        let sent_timeout = number(TIMEOUT_HEADER)?.map(Duration::from_millis);
        let mut budget = match sent_timeout {
            Some(left) if left <= self.timeout_cap => TaskBudget {
                query,
                deadline: Instant::now() + left,
                timeout_by: "the statement timeout of its coordinator ([server.limits] statement_timeout_s)",
                memory_limit: None,
            },
            _ => TaskBudget {
                query,
                deadline: Instant::now() + self.timeout_cap,
                timeout_by: "the worker's [cluster] query_timeout_s",
                memory_limit: None,
            },
        };
        let (limit, by) = match (sent_memory, self.memory_cap) {
            (None, None) => return Ok((budget, Arc::clone(shared))),
            (Some(sent), Some(cap)) if cap < sent => {
                (cap, "the worker's [cluster] query_memory_mb")
            }
            (Some(sent), _) => (
                sent,
                "the query's memory limit on its coordinator, applied on each worker",
            ),
            (None, Some(cap)) => (cap, "the worker's [cluster] query_memory_mb"),
        };
        budget.memory_limit = Some(limit);
        let mut pools = self.pools.lock();
        if let Some(pool) = pools.get(&query).and_then(Weak::upgrade) {
            return Ok((budget, pool));
        }
        pools.retain(|_, pool| pool.strong_count() > 0);
        let pool = Arc::new(QueryMemoryPool::new(Arc::clone(shared), limit).set_by(by));
        pools.insert(query, Arc::downgrade(&pool));
        Ok((budget, pool))
    }

    /// Drops the state of every stage `query` started here (the coordinator ended it).
    pub(crate) fn release(&self, query: &Uuid) {
        let started = self.stages.lock().remove(query).unwrap_or_default();
        for stage in started.iter().filter_map(Weak::upgrade) {
            let copy = std::mem::replace(&mut *stage.lock(), Running::Released);
            drop(copy);
        }
    }

    /// Records `stage` as started by `query`, to release when it ends.
    fn started(&self, query: Uuid, stage: &Arc<Mutex<Running>>) {
        let mut stages = self.stages.lock();
        stages.retain(|_, started| {
            started.retain(|s| s.strong_count() > 0);
            !started.is_empty()
        });
        stages.entry(query).or_default().push(Arc::downgrade(stage));
    }

    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        let mut pools = self.pools.lock();
        pools.retain(|_, pool| pool.strong_count() > 0);
        pools.len()
    }
}

/// What a stage runs: nothing yet, a copy of its plan with its state, or nothing any
/// more (its query ended).
#[derive(Debug)]
pub(crate) enum Running {
    NotStarted,
    Started(Arc<dyn ExecutionPlan>),
    Released,
}

/// A worker's stage under its query's budget: its partitions run a copy of the stage plan
/// (fresh state) until the query's deadline; the copy, with everything it holds, is
/// dropped when the coordinator ends the query, and a partition started after runs
/// nothing. Its tree shows the plan as decoded.
#[derive(Debug)]
pub(crate) struct StageExec {
    input: Arc<dyn ExecutionPlan>,
    running: Arc<Mutex<Running>>,
    budgets: Arc<QueryBudgets>,
    ended: Arc<EndedQueries>,
}

impl StageExec {
    pub(crate) fn new(
        input: Arc<dyn ExecutionPlan>,
        budgets: Arc<QueryBudgets>,
        ended: Arc<EndedQueries>,
    ) -> Self {
        Self {
            input,
            running: Arc::new(Mutex::new(Running::NotStarted)),
            budgets,
            ended,
        }
    }

    /// The copy this stage runs, started for `query` on first use.
    fn copy_for(&self, query: Uuid) -> DfResult<Arc<dyn ExecutionPlan>> {
        let ended = || {
            refused(
                "a stage of a query that ended (a stage plan is valid only while its query runs)",
            )
        };
        let copy = {
            let mut running = self.running.lock();
            match &*running {
                Running::Started(copy) => return Ok(Arc::clone(copy)),
                Running::Released => return Err(ended()),
                Running::NotStarted => {
                    let copy = fresh_copy(Arc::clone(&self.input))?;
                    *running = Running::Started(Arc::clone(&copy));
                    copy
                }
            }
        };
        // Recorded before the check: an EndQuery either sees it or came before the check.
        self.budgets.started(query, &self.running);
        if self.ended.has_ended(&query) {
            self.budgets.release(&query);
            return Err(ended());
        }
        Ok(copy)
    }
}

/// `plan` with new nodes and no execution state: a worker's network boundary (which
/// shows no child there: it reads another task) gets a new connection pool, a scan a
/// new plan; any other leaf is rebuilt as DataFusion resets it.
fn fresh_copy(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion_distributed::NetworkBoundaryExt;
    plan.transform_up(|node| {
        if let Some(boundary) = node.as_network_boundary() {
            return boundary
                .with_input_stage(boundary.input_stage().clone())
                .map(Transformed::yes);
        }
        node.reset_state().map(Transformed::yes)
    })
    .map(|t| t.data)
}

impl DisplayAs for StageExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageExec")
    }
}

impl ExecutionPlan for StageExec {
    fn name(&self) -> &str {
        "StageExec"
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
        let input = only_child("StageExec", children)?;
        Ok(Arc::new(Self::new(
            input,
            Arc::clone(&self.budgets),
            Arc::clone(&self.ended),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(budget) = context.session_config().get_extension::<TaskBudget>() else {
            return Err(DataFusionError::Internal(
                "a stage runs on a worker without its query's budget".into(),
            ));
        };
        let stream = self
            .copy_for(budget.query)?
            .execute(partition, Arc::clone(&context))?;
        let schema = stream.schema();
        let limited = InTime {
            inner: stream,
            schema: Arc::clone(&schema),
            sleep: Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                budget.deadline,
            ))),
            timeout_by: budget.timeout_by,
            memory: budget.memory_limit.map(|limit| MemoryCheck {
                pool: Arc::clone(context.memory_pool()),
                limit,
                every: tokio::time::interval(MEMORY_CHECK_EVERY),
            }),
            done: false,
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, limited)))
    }
}

/// A stage's stream until its deadline, or until its query's memory on this worker runs
/// past its limit by more than a quarter: then one error, its state dropped, and nothing
/// more.
struct InTime {
    inner: SendableRecordBatchStream,
    schema: datafusion::arrow::datatypes::SchemaRef,
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout_by: &'static str,
    memory: Option<MemoryCheck>,
    done: bool,
}

/// The query's pool on this worker, checked while the stage runs and while it waits.
struct MemoryCheck {
    pool: Arc<dyn MemoryPool>,
    limit: usize,
    every: tokio::time::Interval,
}

impl MemoryCheck {
    /// The error once the pool holds more than the limit and its margin.
    fn over(&mut self, cx: &mut Context<'_>) -> Option<DataFusionError> {
        // Polled for its wake-ups: a stage waiting on a peer is checked too.
        while self.every.poll_tick(cx).is_ready() {}
        let held = self.pool.reserved();
        (held > self.limit.saturating_add(self.limit / OVERSHOOT_DIVISOR)).then(|| {
            DataFusionError::ResourcesExhausted(format!(
                "query memory limit of {} MiB exceeded on a cluster worker: its stages hold {} \
                 MiB, buffers received from other workers included",
                self.limit >> 20,
                held >> 20
            ))
        })
    }
}

impl InTime {
    /// Ends the stream with `e`, dropping the stage's state now.
    fn fail(&mut self, e: DataFusionError) -> Poll<Option<DfResult<RecordBatch>>> {
        self.done = true;
        self.inner = Box::pin(datafusion::physical_plan::EmptyRecordBatchStream::new(
            Arc::clone(&self.schema),
        ));
        Poll::Ready(Some(Err(e)))
    }
}

impl Stream for InTime {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            let e = crate::classes::tagged_error(
                ErrorClass::Timeout,
                format!(
                    "statement cancelled on a cluster worker: the query ran longer than {}",
                    self.timeout_by
                ),
            );
            return self.fail(e);
        }
        if let Some(e) = self.memory.as_mut().and_then(|m| m.over(cx)) {
            return self.fail(e);
        }
        let polled = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = polled {
            self.done = true;
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::{MemoryConsumer, UnboundedMemoryPool};

    fn headers(query: Option<Uuid>, memory: Option<&str>, timeout_ms: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(q) = query {
            h.insert(QUERY_HEADER, header(q.to_string()));
        }
        if let Some(m) = memory {
            h.insert(MEMORY_HEADER, header(m.to_owned()));
        }
        if let Some(t) = timeout_ms {
            h.insert(TIMEOUT_HEADER, header(t.to_owned()));
        }
        h
    }

    #[test]
    fn a_querys_tasks_share_one_pool_of_the_smaller_limit_and_its_deadline() {
        let shared: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let ended = EndedQueries::new(Duration::from_secs(60));
        let budgets = QueryBudgets::new(Some(4 << 20), Duration::from_secs(30));
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        // The coordinator's limit (1 MiB) under the worker's cap (4 MiB); 5 s left.
        let admit = |h: HeaderMap| budgets.admit(&h, &shared, &ended).unwrap();
        let (budget, first) = admit(headers(Some(a), Some("1048576"), Some("5000")));
        assert!(budget.deadline <= Instant::now() + Duration::from_secs(5));
        assert!(budget.timeout_by.contains("statement_timeout_s"));
        let (_, second) = admit(headers(Some(a), Some("1048576"), Some("5000")));
        assert!(Arc::ptr_eq(&first, &second), "one pool per query");
        assert!(matches!(first.memory_limit(), MemoryLimit::Finite(l) if l == 1 << 20));
        // Its tasks together stay under the limit; the refusal says where it comes from.
        let r1 = MemoryConsumer::new("t1").register(&first);
        let r2 = MemoryConsumer::new("t2").register(&second);
        r1.try_grow(700 << 10).unwrap();
        let e = r2.try_grow(700 << 10).unwrap_err().to_string();
        assert!(
            e.contains("on its coordinator, applied on each worker"),
            "{e}"
        );
        assert_eq!(shared.reserved(), 700 << 10);
        // Another query: its own pool, capped by the worker (its coordinator asked 1 GiB
        // and gave it an hour, more than the worker's 30 s).
        let (budget, other) = admit(headers(Some(b), Some("1073741824"), Some("3600000")));
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(matches!(other.memory_limit(), MemoryLimit::Finite(l) if l == 4 << 20));
        assert!(budget.deadline <= Instant::now() + Duration::from_secs(30));
        assert!(budget.timeout_by.contains("[cluster] query_timeout_s"));
        // The pools go with their last task.
        assert_eq!(budgets.running(), 2);
        drop((r1, r2, first, second, other));
        assert_eq!(budgets.running(), 0);
        // No limits anywhere: the worker's own pool.
        let open = QueryBudgets::new(None, Duration::from_secs(30));
        let (_, pool) = open
            .admit(&headers(Some(a), None, None), &shared, &ended)
            .unwrap();
        assert!(Arc::ptr_eq(&pool, &shared));
    }

    /// A stage stream that never yields a batch (waiting on a peer).
    fn waiting(deadline: Duration, memory: Option<(Arc<dyn MemoryPool>, usize)>) -> InTime {
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::empty());
        let inner = RecordBatchStreamAdapter::new(Arc::clone(&schema), futures::stream::pending());
        InTime {
            inner: Box::pin(inner),
            schema,
            sleep: Box::pin(tokio::time::sleep(deadline)),
            timeout_by: "the worker's [cluster] query_timeout_s",
            memory: memory.map(|(pool, limit)| MemoryCheck {
                pool,
                limit,
                every: tokio::time::interval(MEMORY_CHECK_EVERY),
            }),
            done: false,
        }
    }

    #[tokio::test]
    async fn a_waiting_stage_stops_at_its_deadline_and_when_its_buffers_pass_the_limit() {
        // The deadline: one tagged timeout error, then the end.
        let mut stage = waiting(Duration::from_millis(50), None);
        let e = tokio::time::timeout(Duration::from_secs(5), stage.next())
            .await
            .expect("stopped at its deadline")
            .unwrap()
            .unwrap_err();
        match crate::classes::tagged(&e) {
            Some(crate::error::ClusterError::OnWorker { class, message }) => {
                assert_eq!(class, ErrorClass::Timeout);
                assert!(message.contains("[cluster] query_timeout_s"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(stage.next().await.is_none());
        // Memory charged without asking (network buffers): past a quarter over the limit,
        // the stage fails although it never polls the pool itself.
        let shared: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let pool: Arc<dyn MemoryPool> = Arc::new(QueryMemoryPool::new(shared, 1 << 20));
        let buffers = MemoryConsumer::new("buffers").register(&pool);
        buffers.grow(1 << 20);
        let mut stage = waiting(
            Duration::from_secs(3600),
            Some((Arc::clone(&pool), 1 << 20)),
        );
        let early = tokio::time::timeout(Duration::from_millis(300), stage.next()).await;
        assert!(early.is_err(), "within its margin the stage waits");
        buffers.grow(1 << 20);
        let e = tokio::time::timeout(Duration::from_secs(5), stage.next())
            .await
            .expect("checked while it waits")
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(&e, DataFusionError::ResourcesExhausted(m) if m.contains("exceeded on a cluster worker")),
            "{e}"
        );
        assert!(stage.next().await.is_none());
    }

    #[test]
    fn a_stage_of_no_query_or_of_an_ended_one_or_with_bad_limits_is_refused() {
        let shared: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let ended = EndedQueries::new(Duration::from_secs(60));
        let budgets = QueryBudgets::new(None, Duration::from_secs(30));
        let refusal = |h: HeaderMap| budgets.admit(&h, &shared, &ended).unwrap_err().to_string();
        assert!(refusal(headers(None, None, None)).contains("without its query"));
        let q = Uuid::new_v4();
        assert!(refusal(headers(Some(q), Some("lots"), None)).contains("is not a number"));
        assert!(refusal(headers(Some(q), None, Some("-1"))).contains("is not a number"));
        ended.end(q);
        assert!(refusal(headers(Some(q), None, None)).contains("a query that ended"));
    }
}
