//! Where DataFusion's CPU work runs: a runtime of its own, apart from the one that serves
//! the network (as InfluxDB's dedicated executor does). A query that computes for
//! minutes, or one that never yields, then cannot stall accepting connections, logins,
//! cancellations or timers of the front end's runtime.
//!
//! [`CpuExecutor::run`] runs a future (planning) there; [`CpuExecutor::execute_stream`]
//! starts a query there and hands its batches over through a small bounded channel, so
//! the front end only moves finished batches. Dropping what they return aborts the work.

use std::future::Future;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

/// Batches in flight between the CPU runtime and the front end, per query.
const HANDOFF_BATCHES: usize = 2;

/// A handle to the runtime that runs DataFusion's work.
#[derive(Debug, Clone)]
pub struct CpuExecutor {
    handle: tokio::runtime::Handle,
}

/// Aborts a spawned task when dropped (its caller went away).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn task_failed(e: tokio::task::JoinError) -> DataFusionError {
    DataFusionError::Execution(format!("query task failed: {e}"))
}

impl CpuExecutor {
    /// Runs work on the runtime behind `handle`.
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        Self { handle }
    }

    /// Runs `fut` on the CPU runtime and waits for it; dropping the returned future
    /// aborts it.
    pub async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let mut task = AbortOnDrop(self.handle.spawn(fut));
        (&mut task.0).await.map_err(task_failed)
    }

    /// Starts a query on the CPU runtime: `start` plans it and returns its stream (and
    /// anything else the caller needs from planning); the batches are produced there and
    /// handed over through a bounded channel. `map` runs on each batch on the CPU runtime
    /// too (conversion for the wire). Dropping the returned stream aborts the query.
    pub async fn execute_stream<T: Send + 'static>(
        &self,
        start: impl Future<Output = Result<(SendableRecordBatchStream, T)>> + Send + 'static,
        map: impl Fn(RecordBatch) -> Result<RecordBatch> + Send + 'static,
    ) -> Result<(SendableRecordBatchStream, T)> {
        let (started_tx, started_rx) = oneshot::channel();
        let (tx, rx) = mpsc::channel(HANDOFF_BATCHES);
        let task = self.handle.spawn(async move {
            let (mut stream, extra) = match start.await {
                Ok(s) => s,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            if started_tx.send(Ok((stream.schema(), extra))).is_err() {
                return;
            }
            while let Some(item) = stream.next().await {
                let item = item.and_then(&map);
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let mut guard = AbortOnDrop(task);
        let (schema, extra) = match started_rx.await {
            Ok(r) => r?,
            // The task ended without a word: it panicked or was cancelled.
            Err(_) => {
                return Err(match (&mut guard.0).await {
                    Err(e) => task_failed(e),
                    Ok(()) => DataFusionError::Execution("query task ended early".into()),
                });
            }
        };
        let mut rx = rx;
        let batches = futures::stream::poll_fn(move |cx| {
            let _abort_when_dropped = &guard;
            rx.poll_recv(cx)
        });
        let stream = RecordBatchStreamAdapter::new(schema, batches);
        Ok((Box::pin(stream), extra))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn cpu_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// While a task that never yields holds every thread of the CPU runtime, the front
    /// end's runtime still answers and its timers still fire.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_task_that_never_yields_does_not_stall_the_front_end() {
        let rt = cpu_runtime();
        let cpu = CpuExecutor::new(rt.handle().clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let hog = tokio::spawn(async move {
            cpu.run(async move {
                // Busy without an await point.
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .await
        });
        let started = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        hog.await.unwrap().unwrap();
        rt.shutdown_background();
    }

    /// Batches cross runtimes in order, mapped on the CPU side; dropping the stream
    /// stops the producer.
    #[tokio::test]
    async fn streams_cross_runtimes_and_stop_when_dropped() {
        let rt = cpu_runtime();
        let cpu = CpuExecutor::new(rt.handle().clone());
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, s) = (Arc::clone(&produced), Arc::clone(&schema));
        let start = async move {
            let batches = futures::stream::iter(0..).map(move |i: i64| {
                p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(RecordBatch::try_new(
                    Arc::clone(&s),
                    vec![Arc::new(Int64Array::from(vec![i]))],
                )?)
            });
            let stream: SendableRecordBatchStream =
                Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), batches));
            Ok((stream, "planned"))
        };
        let (mut stream, extra) = cpu
            .execute_stream(start, |b| {
                let doubled =
                    datafusion::arrow::compute::kernels::numeric::add(b.column(0), b.column(0))?;
                Ok(RecordBatch::try_new(b.schema(), vec![doubled])?)
            })
            .await
            .unwrap();
        assert_eq!(extra, "planned");
        for i in 0..5_i64 {
            let b = stream.next().await.unwrap().unwrap();
            let v = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            assert_eq!(v.value(0), 2 * i);
        }
        drop(stream);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after_drop = produced.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            produced.load(std::sync::atomic::Ordering::Relaxed),
            after_drop
        );
        assert!(after_drop < 5 + HANDOFF_BATCHES + 3, "{after_drop}");
        rt.shutdown_background();
    }

    /// A planning error reaches the caller as it is.
    #[tokio::test]
    async fn a_planning_error_is_returned() {
        let rt = cpu_runtime();
        let cpu = CpuExecutor::new(rt.handle().clone());
        let start =
            async { Err::<(SendableRecordBatchStream, ()), _>(DataFusionError::Plan("no".into())) };
        let e = cpu.execute_stream(start, Ok).await.err().unwrap();
        assert!(matches!(e, DataFusionError::Plan(_)), "{e}");
        rt.shutdown_background();
    }
}
