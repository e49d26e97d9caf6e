//! The worker: plans signed scans with its own catalogs and keys, admits only signed-scan stages, authenticates every call.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use clearice_access::fair::{FairJoins, YieldExec};
use clearice_access::remote::{RemoteScanExec, ScanBuilder, ScanRequest};
use clearice_crypto::Providers;
use clearice_iceberg::IcebergCatalogProvider;
use datafusion::catalog::CatalogProvider;
use datafusion::error::Result as DfResult;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion_distributed::{
    DistributedExt, NetworkCoalesceExec, Worker, WorkerQueryContext, WorkerSessionBuilder,
};
use tonic::codegen::{BoxFuture, Service, http};

use crate::budget::{QueryBudgets, StageExec};
use crate::channels::{ClusterChannels, MAX_MESSAGE_BYTES};
use crate::classes::{ClassifiedExec, Classifier};
use crate::codec::ClearIceCodec;
use crate::error::refused;
use crate::queries::{END_QUERY, EndedQueries, QUERY_HEADER};
use crate::signer::TaskSigner;
use crate::tls::ClusterTls;

/// Plans scans on a worker with its own catalogs and crypto providers.
#[derive(Debug)]
pub struct WorkerScans {
    /// The worker's catalogs, by their names in SQL.
    pub catalogs: Vec<(String, Arc<IcebergCatalogProvider>)>,
    /// The worker's crypto providers (a scan's provider route is resolved with them).
    pub providers: Arc<Providers>,
    /// The worker's `hmac_sha256` mask secret (the policy's `[masks] hmac_key_file`).
    pub mask_key: Option<Arc<clearice_crypto::MaskKey>>,
}

#[async_trait::async_trait]
impl ScanBuilder for WorkerScans {
    async fn build(
        &self,
        request: &ScanRequest,
        ctx: Arc<TaskContext>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let name = request.table_name();
        let started = std::time::Instant::now();
        let catalog = self
            .catalogs
            .iter()
            .find(|(n, _)| *n == request.catalog)
            .map(|(_, c)| c)
            .ok_or_else(|| {
                refused(format!(
                    "table {name}: catalog '{}' is not configured on this worker",
                    request.catalog
                ))
            })?;
        let ns = request.namespace.join(".");
        let mut table = None;
        for attempt in 0..2 {
            if attempt == 1 {
                // Created since this worker listed the catalog.
                catalog.refresh_now().await;
            }
            if let Some(schema) = catalog.schema(&ns)
                && let Some(s) = schema
                    .as_any()
                    .downcast_ref::<clearice_iceberg::IcebergSchemaProvider>()
                && let Some(t) = s.load(&request.table, None).await?
            {
                table = Some(t);
                break;
            }
        }
        let table = table
            .ok_or_else(|| refused(format!("table {name} is not in this worker's catalog")))?;
        if request.grant.route.is_none() {
            return Err(refused(format!(
                "table {name}: the scan names no crypto provider"
            )));
        }
        let grant = request
            .grant
            .clone()
            .resolved(&self.providers)
            .map_err(|p| {
                refused(format!(
                    "table {name}: crypto provider '{p}' is not configured on this worker"
                ))
            })?;
        let state = SessionStateBuilder::new()
            .with_config(ctx.session_config().clone())
            .with_runtime_env(ctx.runtime_env())
            .with_default_features()
            .build();
        let loaded = started.elapsed();
        let plan = clearice_access::remote::scan_request(
            &table,
            &state,
            request,
            grant,
            self.mask_key.as_ref(),
        )
        .await?;
        tracing::debug!(
            table = %name,
            principal = %request.grant.principal,
            load_ms = loaded.as_secs_f64() * 1e3,
            plan_ms = started.elapsed().as_secs_f64() * 1e3,
            "scan planned on this worker"
        );
        Ok(plan)
    }
}

/// Builds each worker query's session: the engine's stores and memory, a metadata cache of
/// its own (decrypted footers do not outlive the query), and ClearIce's codec.
#[derive(Clone)]
pub struct WorkerSessions {
    /// The engine's runtime: object stores, memory pool, disk manager.
    pub runtime: Arc<RuntimeEnv>,
    /// Decodes stage plans (verifies signed scans, plans them with [`WorkerScans`]).
    pub codec: Arc<ClearIceCodec>,
    /// Mutual TLS: the worker's server certificate (client certificates of the cluster CA
    /// required), and its identity on its channels to other workers.
    pub tls: Option<Arc<ClusterTls>>,
    /// Classifies a stage's errors: the class travels with the error to the coordinator.
    pub classify: Classifier,
    /// Each query's memory pool and deadline on this worker, capped by its own config.
    pub budgets: Arc<QueryBudgets>,
}

#[async_trait::async_trait]
impl WorkerSessionBuilder for WorkerSessions {
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> DfResult<SessionState> {
        // Before the plan is decoded: a stage of no query, or of one that ended, is
        // refused here, and the query's tasks share one pool of its memory limit.
        let (budget, memory_pool) =
            self.budgets
                .admit(&ctx.headers, &self.runtime.memory_pool, &self.codec.ended)?;
        let cache_manager = datafusion::execution::cache::cache_manager::CacheManager::try_new(
            &Default::default(),
        )?;
        let runtime = Arc::new(RuntimeEnv {
            memory_pool,
            disk_manager: Arc::clone(&self.runtime.disk_manager),
            cache_manager,
            object_store_registry: Arc::clone(&self.runtime.object_store_registry),
            parquet_encryption_factory_registry: Default::default(),
        });
        let mut state = ctx
            .builder
            .with_runtime_env(runtime)
            .with_distributed_user_codec_arc(Arc::clone(&self.codec) as _)
            .build();
        state.config_mut().set_extension(Arc::new(budget));
        Ok(state)
    }
}

/// [`WorkerSessions`] whose stages read other workers' tasks over [`ClusterChannels`].
struct WorkerSessionsOnChannels {
    sessions: WorkerSessions,
    channels: ClusterChannels,
}

#[async_trait::async_trait]
impl WorkerSessionBuilder for WorkerSessionsOnChannels {
    async fn build_session_state(&self, mut ctx: WorkerQueryContext) -> DfResult<SessionState> {
        ctx.builder = ctx
            .builder
            .with_distributed_channel_resolver(self.channels.clone());
        self.sessions.build_session_state(ctx).await
    }
}

/// A worker service for `sessions`; it runs only stage plans `admitted` (leaves are signed scans), and cuts result
/// batches so that each message stays under [`MAX_MESSAGE_BYTES`]. Serve it with [`serve`].
pub fn worker(sessions: WorkerSessions) -> Worker {
    let channels = ClusterChannels::new(Arc::clone(&sessions.codec.signer), sessions.tls.clone());
    let classify = Arc::clone(&sessions.classify);
    let budgets = Arc::clone(&sessions.budgets);
    let ended = Arc::clone(&sessions.codec.ended);
    let mut worker = Worker::from_session_builder(WorkerSessionsOnChannels { sessions, channels })
        .with_max_message_size(MAX_MESSAGE_BYTES / 2);
    worker.add_on_plan_hook(move |plan| {
        let checked = fair(guard(plan));
        clearice_metrics::worker_call(if checked.as_any().is::<RefusedExec>() {
            clearice_metrics::WorkerCall::Refused
        } else {
            clearice_metrics::WorkerCall::Admitted
        });
        let stage = StageExec::new(checked, Arc::clone(&budgets), Arc::clone(&ended));
        Arc::new(ClassifiedExec::new(Arc::new(stage), Arc::clone(&classify)))
            as Arc<dyn ExecutionPlan>
    });
    worker
}

/// Serves the [`worker`] of `sessions` on `listener` until `shutdown` completes: with
/// [`WorkerSessions::tls`], only over TLS with a client certificate of the cluster CA;
/// only stage plans whose leaves are signed scans run, a call is authenticated with the
/// codec's signer from its headers before its message is read (`Authenticated`), and a
/// message over [`MAX_MESSAGE_BYTES`] is refused from its length prefix.
pub async fn serve(
    sessions: WorkerSessions,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let signer = Arc::clone(&sessions.codec.signer);
    let end_queries = Authenticated {
        inner: EndQueries {
            ended: Arc::clone(&sessions.codec.ended),
            budgets: Arc::clone(&sessions.budgets),
        },
        signer: Arc::clone(&signer),
    };
    let tls = sessions.tls.clone();
    let service = Authenticated {
        inner: worker(sessions)
            .into_worker_server()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        signer,
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls.server())?;
    }
    server
        .add_service(service)
        .add_service(end_queries)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// A worker's gRPC service behind a check of each call's credential, made on the request's
/// headers before its body is read: a call without a credential of this cluster for its
/// RPC (GetWorkerInfo included) is answered `UNAUTHENTICATED` at once, and what it sends
/// after its headers is never read (HTTP/2 flow control stops it at one window).
#[derive(Clone)]
struct Authenticated<S> {
    inner: S,
    signer: Arc<TaskSigner>,
}

/// ClearIce's own worker service: [`END_QUERY`], answered from its headers (its body is
/// not read); the query is recorded where the codec refuses its scans.
#[derive(Clone)]
struct EndQueries {
    ended: Arc<EndedQueries>,
    /// Where the query's started stages are released.
    budgets: Arc<QueryBudgets>,
}

impl tonic::server::NamedService for EndQueries {
    const NAME: &'static str = "clearice.cluster.v1.Cluster";
}

impl Service<http::Request<tonic::body::Body>> for EndQueries {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let query = crate::queries::query_in(request.headers());
        let answer = match (request.uri().path(), query) {
            (END_QUERY, Some(query)) => {
                self.ended.end(query);
                self.budgets.release(&query);
                tonic::Status::new(tonic::Code::Ok, "")
            }
            (END_QUERY, None) => tonic::Status::invalid_argument(format!(
                "EndQuery needs the header {QUERY_HEADER}: <uuid>"
            )),
            (path, _) => tonic::Status::unimplemented(format!("no worker call {path}")),
        };
        std::future::ready(Ok(answer.into_http()))
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<tonic::body::Body>> for Authenticated<S>
where
    S: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let path = request.uri().path();
        if let Err(reason) = self.signer.check_call(path, request.headers()) {
            let peer = request
                .extensions()
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr());
            tracing::warn!(peer = ?peer, path, reason, "worker call refused");
            clearice_metrics::worker_call(clearice_metrics::WorkerCall::Unauthenticated);
            let refusal = tonic::Status::unauthenticated(reason).into_http();
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        // Call the service that was made ready; its clone waits for the next call.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        Box::pin(ready.call(request))
    }
}

/// Whether a decoded stage plan may run on this worker. Whoever reaches a worker's port
/// can send a plan; only a signed scan reads data (its signature was verified when it was
/// decoded). DataFusion's own file scans and sinks would reach the worker's files, so
/// every leaf must be a [`RemoteScanExec`], read nothing, or be a network boundary (its
/// input runs on other workers), and no node may write.
pub(crate) fn admitted(plan: &Arc<dyn ExecutionPlan>) -> Result<(), String> {
    let any = plan.as_any();
    if any.is::<RemoteScanExec>()
        || any.is::<datafusion_distributed::NetworkShuffleExec>()
        || any.is::<NetworkCoalesceExec>()
        || any.is::<datafusion_distributed::NetworkBroadcastExec>()
    {
        return Ok(());
    }
    if plan.name() == "DataSinkExec" {
        return Err("it writes files".into());
    }
    if plan.children().is_empty() && !any.is::<EmptyExec>() && !any.is::<PlaceholderRowExec>() {
        return Err(format!(
            "its leaf {} is not a scan signed by a coordinator",
            plan.name()
        ));
    }
    plan.children().into_iter().try_for_each(admitted)
}

/// `plan` whose quadratic joins yield between bounded slices of work (as a confined
/// session's do, whose plans arrive so): one query's stage neither holds a worker thread
/// from the others nor runs past its deadline on this worker.
fn fair(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    use datafusion::common::tree_node::TreeNode;
    use datafusion::physical_optimizer::PhysicalOptimizerRule;
    let fair_already = plan
        .exists(|node| Ok(node.as_any().is::<YieldExec>()))
        .unwrap_or(false);
    if fair_already {
        return plan;
    }
    match FairJoins.optimize(Arc::clone(&plan), &Default::default()) {
        Ok(fair) => fair,
        Err(e) => {
            let reason = format!("a stage plan whose joins cannot be scheduled fairly: {e}");
            tracing::warn!(reason = %reason, "stage plan refused");
            Arc::new(RefusedExec {
                reason,
                properties: Arc::clone(plan.properties()),
            })
        }
    }
}

/// The plan, or one that fails with why it was not [`admitted`] (the worker's hook cannot
/// return an error).
pub(crate) fn guard(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    match admitted(&plan) {
        Ok(()) => plan,
        Err(reason) => {
            tracing::warn!(reason = %reason, "stage plan refused");
            Arc::new(RefusedExec {
                reason,
                properties: Arc::clone(plan.properties()),
            })
        }
    }
}

/// A refused stage plan: fails when executed.
#[derive(Debug)]
struct RefusedExec {
    reason: String,
    properties: Arc<datafusion::physical_plan::PlanProperties>,
}

impl datafusion::physical_plan::DisplayAs for RefusedExec {
    fn fmt_as(
        &self,
        _t: datafusion::physical_plan::DisplayFormatType,
        f: &mut fmt::Formatter<'_>,
    ) -> fmt::Result {
        write!(f, "RefusedExec: {}", self.reason)
    }
}

impl ExecutionPlan for RefusedExec {
    fn name(&self) -> &str {
        "RefusedExec"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<datafusion::execution::SendableRecordBatchStream> {
        Err(refused(format!("stage plan refused: {}", self.reason)))
    }
}
