//! Per-principal resource limits of confined sessions (`[server.limits]`): statement
//! timeout, concurrent statements, per-query memory, result size.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use serde::Deserialize;

/// `[server.limits]`: what one principal's statements may use. Applied to every
/// confined session (Flight SQL; the shell with `[shell] confine = true`).
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Longest a statement may run (planning and streaming), seconds; default 300;
    /// 0 = no limit.
    #[serde(default)]
    pub statement_timeout_s: Option<f64>,
    /// Statements one principal may run at once (a result being streamed counts);
    /// default 16; 0 = no limit.
    #[serde(default)]
    pub max_concurrent_statements: Option<usize>,
    /// Memory one query may reserve, MiB (operators that can spill spill to disk first,
    /// others fail with a resources-exhausted error); default 1024; 0 = no limit.
    #[serde(default)]
    pub query_memory_mb: Option<u64>,
    /// Rows a result may have; more fail the statement; default no limit.
    #[serde(default)]
    pub max_result_rows: Option<u64>,
    /// Bytes (Arrow in memory) a result may have; default no limit.
    #[serde(default)]
    pub max_result_bytes: Option<u64>,
    /// Partitions (threads) one query may use; default the number of cores.
    #[serde(default)]
    pub query_parallelism: Option<usize>,
}

impl LimitsConfig {
    /// Statement timeout in effect.
    pub fn statement_timeout(&self) -> Option<Duration> {
        match self.statement_timeout_s {
            Some(s) if s <= 0.0 => None,
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => Some(Duration::from_secs(300)),
        }
    }

    /// Concurrent statements per principal in effect.
    pub fn max_concurrent(&self) -> Option<usize> {
        match self.max_concurrent_statements {
            Some(0) => None,
            Some(n) => Some(n),
            None => Some(16),
        }
    }

    /// Per-query memory in bytes in effect.
    pub fn query_memory(&self) -> Option<usize> {
        match self.query_memory_mb {
            Some(0) => None,
            Some(m) => Some((m as usize).saturating_mul(1 << 20)),
            None => Some(1 << 30),
        }
    }
}

/// A statement stopped by a limit. Carried inside DataFusion errors (`External`); Flight
/// maps it to `DEADLINE_EXCEEDED` / `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone, thiserror::Error)]
// Not non_exhaustive: Flight matches every variant, so a new one forces a gRPC code.
pub enum LimitExceeded {
    /// The statement ran longer than the timeout.
    #[error(
        "statement cancelled: it ran longer than the statement timeout of {limit:?} ([server.limits] statement_timeout_s)"
    )]
    Timeout {
        /// The timeout.
        limit: Duration,
    },
    /// The principal already runs as many statements as allowed.
    #[error(
        "too many statements running for principal '{principal}': the limit is {limit} at once ([server.limits] max_concurrent_statements); wait for one to finish"
    )]
    Concurrency {
        /// The principal.
        principal: String,
        /// The limit.
        limit: usize,
    },
    /// The result has more rows than allowed.
    #[error("result has more than {limit} rows ([server.limits] max_result_rows)")]
    Rows {
        /// The limit.
        limit: u64,
    },
    /// The result has more bytes than allowed.
    #[error("result is larger than {limit} bytes ([server.limits] max_result_bytes)")]
    Bytes {
        /// The limit.
        limit: u64,
    },
}

/// The limit inside a DataFusion error, if any.
pub fn limit_of(e: &DataFusionError) -> Option<&LimitExceeded> {
    crate::cause::cause_of(e)
}

/// Concurrency permits per principal, shared by all sessions of an engine.
#[derive(Debug, Default)]
pub struct Permits {
    by_principal: std::sync::Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Permits {
    /// A permit for one more statement of `principal`, or the limit error.
    pub fn acquire(
        &self,
        principal: &str,
        limit: usize,
    ) -> Result<OwnedSemaphorePermit, LimitExceeded> {
        let sem = {
            let mut map = self.by_principal.lock().expect("permits");
            Arc::clone(
                map.entry(principal.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(limit))),
            )
        };
        sem.try_acquire_owned()
            .map_err(|_| LimitExceeded::Concurrency {
                principal: principal.to_owned(),
                limit,
            })
    }
}

/// A session's limits: the config and the engine's permits.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// `[server.limits]`.
    pub config: LimitsConfig,
    /// Concurrency permits per principal, shared by the engine's sessions.
    pub permits: Arc<Permits>,
}

/// One query's share of the shared memory pool: reservations count against both the
/// query's limit and the shared pool, so a query that wants more than its limit spills or
/// fails alone, and other principals' queries keep their memory.
#[derive(Debug)]
pub struct QueryMemoryPool {
    inner: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
    /// Where the limit is set, for its refusal (`[server.limits] query_memory_mb`).
    setting: String,
}

impl QueryMemoryPool {
    /// A share of `inner` of at most `limit` bytes.
    pub fn new(inner: Arc<dyn MemoryPool>, limit: usize) -> Self {
        Self {
            inner,
            limit,
            used: AtomicUsize::new(0),
            setting: "[server.limits] query_memory_mb".to_owned(),
        }
    }

    /// The same, whose refusal names `setting` as where its limit comes from.
    pub fn set_by(self, setting: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            ..self
        }
    }
}

impl MemoryPool for QueryMemoryPool {
    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.inner.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let grown = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(additional).filter(|&n| n <= self.limit)
            });
        if grown.is_err() {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "query memory limit of {} MiB reached by {} wanting {} more bytes ({})",
                self.limit >> 20,
                reservation.consumer().name(),
                additional,
                self.setting
            )));
        }
        if let Err(e) = self.inner.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// A result stream under the statement's deadline and result-size limits; holds the
/// principal's concurrency permit until it ends or is dropped.
pub struct LimitedStream {
    inner: SendableRecordBatchStream,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
    max_rows: Option<u64>,
    max_bytes: Option<u64>,
    rows: u64,
    bytes: u64,
    done: bool,
    _permit: Option<OwnedSemaphorePermit>,
}

impl LimitedStream {
    /// `inner` under the statement's deadline, the result limits of `config`, holding
    /// `permit` until it ends.
    pub fn new(
        inner: SendableRecordBatchStream,
        deadline: Option<(tokio::time::Instant, Duration)>,
        config: &LimitsConfig,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            inner,
            deadline: deadline.map(|(at, d)| (Box::pin(tokio::time::sleep_until(at)), d)),
            max_rows: config.max_result_rows,
            max_bytes: config.max_result_bytes,
            rows: 0,
            bytes: 0,
            done: false,
            _permit: permit,
        }
    }

    fn fail(&mut self, e: LimitExceeded) -> Poll<Option<Result<RecordBatch>>> {
        self.done = true;
        // Drop the query now (cancels its tasks), not when the client goes away.
        self.inner = Box::pin(datafusion::physical_plan::EmptyRecordBatchStream::new(
            self.inner.schema(),
        ));
        Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))))
    }
}

impl Stream for LimitedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some((sleep, limit)) = &mut self.deadline
            && sleep.as_mut().poll(cx).is_ready()
        {
            let limit = *limit;
            return self.fail(LimitExceeded::Timeout { limit });
        }
        let polled = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(b))) = &polled {
            let (rows, bytes) = (b.num_rows() as u64, b.get_array_memory_size() as u64);
            self.rows += rows;
            self.bytes += bytes;
            if let Some(limit) = self.max_rows
                && self.rows > limit
            {
                return self.fail(LimitExceeded::Rows { limit });
            }
            if let Some(limit) = self.max_bytes
                && self.bytes > limit
            {
                return self.fail(LimitExceeded::Bytes { limit });
            }
        }
        if let Poll::Ready(None) = &polled {
            self.done = true;
        }
        polled
    }
}

impl RecordBatchStream for LimitedStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

use std::future::Future as _;
