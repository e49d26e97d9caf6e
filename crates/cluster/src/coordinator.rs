//! The coordinator: which plans go to workers and which workers answer.

use std::sync::Arc;
use std::time::Duration;

use clearice_access::remote::RemoteScanExec;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion_distributed::{
    ChannelResolver, DistributedExt, PartitionIsolatorExec, TaskEstimation, TaskEstimator,
    WorkerResolver,
};
use parking_lot::RwLock;

use clearice_access::cause_of;

use crate::channels::ClusterChannels;
use crate::codec::ClearIceCodec;
use crate::error::ClusterError;
use crate::retry::ClusterRootExec;
use crate::signer::TaskSigner;
use crate::tls::ClusterTls;

/// Splits a [`RemoteScanExec`] over tasks: each task runs a share of its file groups.
#[derive(Debug)]
struct RemoteScans;

impl TaskEstimator for RemoteScans {
    fn task_estimation(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        _cfg: &ConfigOptions,
    ) -> Option<TaskEstimation> {
        let scan = plan.as_any().downcast_ref::<RemoteScanExec>()?;
        Some(TaskEstimation::desired(scan.request().partitions.max(1)))
    }

    fn scale_up_leaf_node(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        task_count: usize,
        _cfg: &ConfigOptions,
    ) -> Option<Arc<dyn ExecutionPlan>> {
        plan.as_any().downcast_ref::<RemoteScanExec>()?;
        if task_count <= 1 {
            return Some(Arc::clone(plan));
        }
        Some(Arc::new(PartitionIsolatorExec::new(
            Arc::clone(plan),
            task_count,
        )))
    }
}

/// Distributes a plan only when every leaf is a catalog scan workers can plan again (or
/// reads nothing) and no node must stay here: writes commit on the coordinator, files
/// by path are read under the coordinator's confinement. Other plans run here, as on one
/// machine.
#[derive(Debug)]
struct ClusterRule {
    workers: Workers,
    /// Result bytes held back while a query can be retried.
    retry_window: usize,
}

fn distributable(plan: &Arc<dyn ExecutionPlan>, scans: &mut usize) -> bool {
    let any = plan.as_any();
    if any.is::<RemoteScanExec>() {
        *scans += 1;
        return true;
    }
    if plan.children().is_empty() {
        return any.is::<EmptyExec>() || any.is::<PlaceholderRowExec>();
    }
    if matches!(
        plan.name(),
        "IcebergWriteExec" | "IcebergRowLevelExec" | "DataSinkExec"
    ) {
        return false;
    }
    plan.children().into_iter().all(|c| distributable(c, scans))
}

impl PhysicalOptimizerRule for ClusterRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut scans = 0;
        if !distributable(&plan, &mut scans) || scans == 0 {
            return Ok(plan);
        }
        let distributed = crate::retry::distributed(&plan, config)?;
        Ok(Arc::new(ClusterRootExec::new(
            plan,
            distributed,
            self.workers.clone(),
            self.retry_window,
        )))
    }

    fn name(&self) -> &str {
        "clearice_distributed"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The configured workers that answer: a background probe drops a worker that stops
/// answering and takes it back when it answers again.
#[derive(Debug, Clone)]
pub struct Workers {
    pub(crate) all: Arc<Vec<url::Url>>,
    live: Arc<RwLock<Vec<url::Url>>>,
    /// The coordinator's channels to them (queries and probes).
    pub(crate) channels: ClusterChannels,
}

/// How often workers are probed by default, milliseconds.
pub const PROBE_EVERY_MS: u64 = 500;

impl Workers {
    /// Parses the configured URLs and starts probing them every `probe_every` (needs a
    /// Tokio runtime); calls carry credentials made with `signer`, over mutual TLS with
    /// `tls`. The probe stops when the last clone is dropped.
    pub fn start(
        urls: &[String],
        signer: Arc<TaskSigner>,
        tls: Option<Arc<ClusterTls>>,
        probe_every: Duration,
    ) -> Result<Self, String> {
        let all = urls
            .iter()
            .map(|u| url::Url::parse(u).map_err(|e| format!("worker '{u}': {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let live = Arc::new(RwLock::new(all.clone()));
        let workers = Self {
            all: Arc::new(all),
            live,
            channels: ClusterChannels::new(signer, tls),
        };
        let weak = Arc::downgrade(&workers.live);
        let all = Arc::clone(&workers.all);
        let channels = workers.channels.clone();
        #[expect(
            clippy::disallowed_methods,
            reason = "the background probe of the IO runtime; it ends when the last clone of the workers is dropped"
        )]
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(probe_every).await;
                let Some(live) = weak.upgrade() else { return };
                let mut up = Vec::with_capacity(all.len());
                for url in all.iter() {
                    if probe(&channels, url).await {
                        up.push(url.clone());
                    }
                }
                let mut current = live.write();
                if *current != up {
                    tracing::info!(
                        live = ?up.iter().map(|u| u.as_str()).collect::<Vec<_>>(),
                        "cluster workers changed"
                    );
                    *current = up;
                }
            }
        });
        Ok(workers)
    }

    /// The workers answering now.
    pub fn live(&self) -> Vec<url::Url> {
        self.live.read().clone()
    }

    /// One line for a query that a worker call failed: the workers that do not answer
    /// now (probed at once, and left out of the next queries' plans).
    pub(crate) async fn explain(&self, e: &DataFusionError) -> DataFusionError {
        let channels = self.channels.fresh();
        let mut up = Vec::new();
        let mut down = Vec::new();
        for url in self.all.iter() {
            if probe(&channels, url).await {
                up.push(url.clone());
            } else {
                down.push(url.as_str().trim_end_matches('/').to_owned());
            }
        }
        *self.live.write() = up;
        // The transport's message (the error's own text may quote values).
        let reason = cause_of::<tonic::Status>(e).map_or_else(
            || "a call to it failed".to_owned(),
            |s| s.message().lines().next().unwrap_or_default().to_owned(),
        );
        if down.is_empty() {
            ClusterError::WorkerFailed { reason }.into()
        } else {
            ClusterError::WorkerLost {
                workers: down.join(", "),
                reason,
            }
            .into()
        }
    }

    /// Tells every worker, in the background, that `query` ended (each within 2 s; a
    /// worker that does not answer keeps its scans valid until they expire).
    pub(crate) fn end_query(&self, query: uuid::Uuid) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let all = Arc::clone(&self.all);
        let channels = self.channels.clone();
        runtime.spawn(async move {
            let calls = all.iter().map(|url| {
                let channels = &channels;
                async move {
                    let answer = tokio::time::timeout(
                        Duration::from_secs(2),
                        channels.end_query(url, query),
                    )
                    .await;
                    if !matches!(answer, Ok(Ok(()))) {
                        tracing::debug!(worker = %url, %query, "the end of a query was not taken");
                    }
                }
            });
            futures::future::join_all(calls).await;
        });
    }
}

async fn probe(channels: &ClusterChannels, url: &url::Url) -> bool {
    let Ok(mut client) = channels.get_worker_client_for_url(url).await else {
        return false;
    };
    matches!(
        tokio::time::timeout(
            Duration::from_secs(2),
            client.get_worker_info(datafusion_distributed::GetWorkerInfoRequest {}),
        )
        .await,
        Ok(Ok(_))
    )
}

impl WorkerResolver for Workers {
    fn get_urls(&self) -> DfResult<Vec<url::Url>> {
        let live = self.live();
        if live.is_empty() {
            return Err(ClusterError::NoWorkers {
                configured: self
                    .all
                    .iter()
                    .map(|u| u.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into());
        }
        Ok(live)
    }
}

/// The coordinator's cluster: where scans go and how they are signed.
#[derive(Debug, Clone)]
pub struct Coordinator {
    /// The configured workers, and which answer.
    pub workers: Workers,
    /// Signs the scans sent to them.
    pub signer: Arc<TaskSigner>,
    /// File groups per worker (`[cluster] partitions_per_worker`); `None`: the session's
    /// target partitions.
    pub partitions_per_worker: Option<usize>,
    /// Result bytes of a query held back while it can still be retried on other workers
    /// (`[cluster] retry_window_mb`).
    pub retry_window_bytes: usize,
}

impl Coordinator {
    /// `state` planning catalog scans for the workers.
    pub fn distribute(&self, state: SessionState) -> SessionState {
        let per_worker = self
            .partitions_per_worker
            .unwrap_or(state.config().target_partitions())
            .max(1);
        let partitions = per_worker * self.workers.all.len().max(1);
        let mut state = SessionStateBuilder::new_from_existing(state)
            .with_distributed_worker_resolver(self.workers.clone())
            .with_distributed_channel_resolver(self.workers.channels.clone())
            .with_distributed_user_codec(ClearIceCodec::coordinator(Arc::clone(&self.signer)))
            .with_distributed_task_estimator(RemoteScans)
            .with_physical_optimizer_rule(Arc::new(ClusterRule {
                workers: self.workers.clone(),
                retry_window: self.retry_window_bytes,
            }))
            .build();
        state
            .config_mut()
            .set_extension(Arc::new(clearice_access::remote::DistributeScans {
                partitions,
            }));
        // A worker's stage runs a copy of its plan (see `budget`), so the tree it would
        // report operator metrics for never ran: none are collected from workers.
        if let Err(e) = state.set_distributed_metrics_collection(false) {
            tracing::warn!(error = %e, "worker metrics stay on");
        }
        state
    }
}
