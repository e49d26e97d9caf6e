//! Scale-out on datafusion-distributed: one coordinator, several workers.
//!
//! ```text
//!  coordinator (clearice [serve] --distributed)      worker (clearice worker)
//!  SQL ─▶ plan: policy decided, audited ─▶           own catalogs, own KMS / providers
//!        RemoteScanExec leaves (key ids, masks)
//!  ClusterRule: DistributedPhysicalOptimizerRule     Worker (gRPC): decodes the stage,
//!    cuts stages; ClearIceCodec signs each scan ───▶   verifies the signature, plans the
//!  NetworkCoalesceExec ◀── Arrow batches (masked) ──   scan again, decrypts, masks
//! ```
//!
//! Policy decisions, masks and audit records are made once, on the coordinator, when the
//! table is resolved. A worker receives a [`ScanRequest`]: table, pinned snapshot, columns,
//! filters, the master key ids the scan may use and the masks; it unwraps keys with its
//! own KMS and masks before a batch leaves it. Plans carry no key bytes and no footer.
//! Each scan is signed with the cluster secret (HMAC-SHA256) and stamped: a worker refuses
//! a scan it cannot verify or that is older than `task_ttl_s`, so a peer that can reach a
//! worker's port cannot make it decrypt for a principal the coordinator did not admit.
//!
//! Every call to a worker is authenticated before its message is read: the coordinator's
//! and the workers' own channels ([`ClusterChannels`]) put a credential made with the same
//! secret in the call's `authorization` header, and the worker's server ([`serve`]) answers
//! any other call `UNAUTHENTICATED` from its headers alone. Messages are bounded by
//! [`MAX_MESSAGE_BYTES`] on both sides.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use clearice_access::MaskOutput;
use clearice_access::remote::{RemoteScanExec, ScanBuilder, ScanRequest};
use clearice_crypto::{KeyScope, Providers};
use clearice_iceberg::IcebergCatalogProvider;
use datafusion::arrow::datatypes::Schema;
use datafusion::catalog::CatalogProvider;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_distributed::{
    BoxCloneSyncChannel, ChannelResolver, DefaultChannelResolver, DistributedExec, DistributedExt,
    DistributedPhysicalOptimizerRule, NetworkCoalesceExec, PartitionIsolatorExec, TaskEstimation,
    TaskEstimator, Worker, WorkerQueryContext, WorkerResolver, WorkerServiceClient,
    WorkerSessionBuilder,
};
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use parking_lot::RwLock;
use prost::Message;
use serde::{Deserialize, Serialize};
use tonic::codegen::{BoxFuture, Service, http};

use crate::fair::YieldExec;
use clearice_access::cause_of;

/// Signs and verifies scans sent to workers (HMAC-SHA256 with the cluster secret).
pub struct TaskSigner {
    key: ring::hmac::Key,
    ttl: Duration,
}

impl fmt::Debug for TaskSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskSigner")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Shortest cluster secret accepted.
pub const MIN_SECRET_BYTES: usize = 32;

impl TaskSigner {
    /// A signer over `secret` (at least [`MIN_SECRET_BYTES`]); scans expire after `ttl`.
    pub fn new(secret: &[u8], ttl: Duration) -> Result<Self, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the cluster secret has {} bytes; at least {MIN_SECRET_BYTES} are needed",
                secret.len()
            ));
        }
        Ok(Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            ttl,
        })
    }

    fn sign(&self, body: &[u8]) -> Vec<u8> {
        ring::hmac::sign(&self.key, body).as_ref().to_vec()
    }

    fn verify(&self, body: &[u8], tag: &[u8]) -> bool {
        ring::hmac::verify(&self.key, body, tag).is_ok()
    }

    /// The `authorization` value of one call to the worker RPC `path` (e.g.
    /// `/worker.WorkerService/ExecuteTask`) made now: `ClearIce-Cluster <unix s>.<hex
    /// HMAC-SHA256 of "clearice-cluster-v1|<path>|<unix s>">`. A worker takes it for that
    /// RPC only, within 5 minutes of its stamp either way.
    pub fn call_credential(&self, path: &str) -> String {
        self.credential_at(path, now_s())
    }

    fn credential_at(&self, path: &str, at: u64) -> String {
        let tag = self.sign(call_message(path, at).as_bytes());
        format!("{CALL_SCHEME}{at}.{}", hex::encode(tag))
    }

    /// Whether `headers` carry a credential of this cluster for a call to `path`, made
    /// within [`CALL_WINDOW`] of now; why not, in one line.
    fn check_call(&self, path: &str, headers: &http::HeaderMap) -> Result<(), &'static str> {
        const MALFORMED: &str =
            "malformed cluster credential (authorization: ClearIce-Cluster <unix s>.<hex tag>)";
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or("no cluster credential: worker calls need the cluster secret")?;
        let (at, tag) = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix(CALL_SCHEME))
            .and_then(|v| v.split_once('.'))
            .ok_or(MALFORMED)?;
        let at: u64 = at.parse().map_err(|_| MALFORMED)?;
        let tag = hex::decode(tag).map_err(|_| MALFORMED)?;
        if !self.verify(call_message(path, at).as_bytes(), &tag) {
            return Err(
                "the cluster credential does not verify with this worker's cluster \
                        secret (another cluster's, or made for another call)",
            );
        }
        if now_s().abs_diff(at) > CALL_WINDOW.as_secs() {
            return Err(
                "the cluster credential is stale (stamped more than 5 minutes from \
                        this worker's clock: a replay, or clocks apart)",
            );
        }
        Ok(())
    }
}

/// How far a call credential's stamp may be from the worker's clock, either way (a
/// replay window and the clock skew tolerated): 5 min.
pub(crate) const CALL_WINDOW: Duration = Duration::from_secs(300);

const CALL_SCHEME: &str = "ClearIce-Cluster ";

/// What a call credential signs. Scan tags sign JSON (`{...}`), so the two never collide.
fn call_message(path: &str, at: u64) -> String {
    format!("clearice-cluster-v1|{path}|{at}")
}

/// Largest gRPC message a worker decodes or sends, and a coordinator or worker decodes
/// from a worker: 64 MiB. Stage plans are small (a scan travels as its signed request, not
/// its files) and result batches are cut to half of this, so only a peer out to exhaust
/// memory sends more: tonic refuses it (`OUT_OF_RANGE`) from the message's 5-byte length
/// prefix, before reading it.
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 << 20;

const SCAN_MAGIC: &[u8; 8] = b"CLRSCAN1";
const YIELD_MAGIC: &[u8; 8] = b"CLRYLD01";
const TAG_BYTES: usize = 32;

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How a distributed query fails because of the cluster (one line each).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A worker did not take a scan: unsigned or altered bytes, expired, or a table its
    /// catalogs do not have.
    #[error("worker refused the scan: {reason}")]
    Refused {
        /// Why, naming the table.
        reason: String,
    },
    /// Workers stopped answering while the query ran.
    #[error(
        "cluster worker {workers} stopped answering during the query ({reason}); the query was \
         stopped, no partial result was returned: run it again (the next queries run on the \
         other workers)"
    )]
    WorkerLost {
        /// The workers that do not answer now.
        workers: String,
        /// The transport's message.
        reason: String,
    },
    /// A worker call failed although every worker answers.
    #[error(
        "a cluster worker failed during the query ({reason}); the query was stopped, no \
         partial result was returned: run it again"
    )]
    WorkerFailed {
        /// The transport's message.
        reason: String,
    },
    /// No configured worker answers.
    #[error("no cluster worker answers (configured: {configured})")]
    NoWorkers {
        /// The configured workers.
        configured: String,
    },
}

impl From<ClusterError> for DataFusionError {
    fn from(e: ClusterError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// What a worker can refuse a plan for; one line each, naming the table.
fn refused(what: impl fmt::Display) -> DataFusionError {
    ClusterError::Refused {
        reason: what.to_string(),
    }
    .into()
}

/// Key scope on the wire.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireScope {
    All,
    MasterKeys(Vec<String>),
    Except(Vec<String>),
    Columns {
        by_field_id: Vec<(i32, String)>,
        by_name: Vec<(String, String)>,
    },
    None(String),
}

/// One output column's decision on the wire (its type is the schema's).
#[derive(Serialize, Deserialize)]
struct WireMask {
    name: String,
    decision: clearice_policy::Decision,
    input: Option<usize>,
}

/// A [`ScanRequest`] on the wire: JSON, signed. No key bytes: master key ids only.
#[derive(Serialize, Deserialize)]
struct WireScan {
    issued_at: u64,
    catalog: String,
    namespace: Vec<String>,
    table: String,
    snapshot_id: Option<i64>,
    travel: bool,
    table_fields: Vec<String>,
    projection: Vec<usize>,
    /// `LogicalExprList` (datafusion-proto), base64.
    filters: String,
    limit: Option<usize>,
    set_predicate: bool,
    scope: WireScope,
    principal: String,
    /// Base64.
    aad_prefix: Option<String>,
    provider: String,
    routes: BTreeMap<String, String>,
    column_keys: BTreeMap<String, String>,
    masks: Option<Vec<WireMask>>,
    /// Arrow schema (datafusion-proto), base64.
    schema: String,
    partitions: usize,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl WireScan {
    fn from_request(r: &ScanRequest) -> DfResult<Self> {
        let filters = datafusion_proto::logical_plan::to_proto::serialize_exprs(
            &r.filters,
            &DefaultLogicalExtensionCodec {},
        )
        .map_err(|e| DataFusionError::Plan(format!("table {}: filters: {e}", r.table_name())))?;
        let filters = datafusion_proto::protobuf::LogicalExprList { expr: filters }.encode_to_vec();
        let schema = datafusion_proto::protobuf::Schema::try_from(r.schema.as_ref())
            .map_err(|e| DataFusionError::Plan(format!("table {}: schema: {e}", r.table_name())))?
            .encode_to_vec();
        Ok(Self {
            issued_at: now_s(),
            catalog: r.catalog.clone(),
            namespace: r.namespace.clone(),
            table: r.table.clone(),
            snapshot_id: r.snapshot_id,
            travel: r.travel,
            table_fields: r.table_fields.clone(),
            projection: r.projection.clone(),
            filters: b64().encode(filters),
            limit: r.limit,
            set_predicate: r.set_predicate,
            scope: match &r.scope {
                KeyScope::All => WireScope::All,
                KeyScope::MasterKeys(k) => WireScope::MasterKeys(k.iter().cloned().collect()),
                KeyScope::Except(k) => WireScope::Except(k.iter().cloned().collect()),
                KeyScope::Columns(c) => WireScope::Columns {
                    by_field_id: c.by_field_id.iter().map(|(i, k)| (*i, k.clone())).collect(),
                    by_name: c
                        .by_name
                        .iter()
                        .map(|(n, k)| (n.clone(), k.clone()))
                        .collect(),
                },
                KeyScope::None(reason) => WireScope::None(reason.clone()),
            },
            principal: r.principal.clone(),
            aad_prefix: r.aad_prefix.as_ref().map(|p| b64().encode(p)),
            provider: r.provider.clone(),
            routes: r.routes.clone(),
            column_keys: r.column_keys.clone(),
            masks: r.masks.as_ref().map(|m| {
                m.iter()
                    .map(|o| WireMask {
                        name: o.name.clone(),
                        decision: o.decision.clone(),
                        input: o.input,
                    })
                    .collect()
            }),
            schema: b64().encode(schema),
            partitions: r.partitions,
        })
    }

    fn into_request(self, ctx: &TaskContext) -> DfResult<ScanRequest> {
        let table = format!(
            "{}.{}.{}",
            self.catalog,
            self.namespace.join("."),
            self.table
        );
        let bad = |what: &str, e: &dyn fmt::Display| refused(format!("table {table}: {what}: {e}"));
        let filters = b64()
            .decode(&self.filters)
            .map_err(|e| bad("filters", &e))?;
        let filters = datafusion_proto::protobuf::LogicalExprList::decode(filters.as_slice())
            .map_err(|e| bad("filters", &e))?;
        let filters = datafusion_proto::logical_plan::from_proto::parse_exprs(
            &filters.expr,
            ctx,
            &DefaultLogicalExtensionCodec {},
        )
        .map_err(|e| bad("filters", &e))?;
        let schema = b64().decode(&self.schema).map_err(|e| bad("schema", &e))?;
        let schema = datafusion_proto::protobuf::Schema::decode(schema.as_slice())
            .map_err(|e| bad("schema", &e))?;
        let schema: Schema = (&schema).try_into().map_err(|e| bad("schema", &e))?;
        let schema = Arc::new(schema);
        let masks = match self.masks {
            None => None,
            Some(m) => {
                if m.len() != schema.fields().len() {
                    return Err(bad("masks", &"not one per column"));
                }
                Some(
                    m.into_iter()
                        .zip(schema.fields())
                        .map(|(w, f)| MaskOutput {
                            name: w.name,
                            decision: w.decision,
                            input: w.input,
                            data_type: f.data_type().clone(),
                        })
                        .collect(),
                )
            }
        };
        let aad_prefix = match self.aad_prefix {
            Some(p) => Some(b64().decode(p).map_err(|e| bad("aad_prefix", &e))?),
            None => None,
        };
        Ok(ScanRequest {
            catalog: self.catalog,
            namespace: self.namespace,
            table: self.table,
            snapshot_id: self.snapshot_id,
            travel: self.travel,
            table_fields: self.table_fields,
            projection: self.projection,
            filters,
            limit: self.limit,
            set_predicate: self.set_predicate,
            scope: match self.scope {
                WireScope::All => KeyScope::All,
                WireScope::MasterKeys(k) => KeyScope::MasterKeys(k.into_iter().collect()),
                WireScope::Except(k) => KeyScope::Except(k.into_iter().collect()),
                WireScope::Columns {
                    by_field_id,
                    by_name,
                } => KeyScope::Columns(clearice_crypto::ColumnKeys {
                    by_field_id: by_field_id.into_iter().collect(),
                    by_name: by_name.into_iter().collect(),
                }),
                WireScope::None(reason) => KeyScope::None(reason),
            },
            principal: self.principal,
            aad_prefix,
            provider: self.provider,
            routes: self.routes,
            column_keys: self.column_keys,
            masks,
            schema,
            partitions: self.partitions,
        })
    }
}

/// Encodes ClearIce's plan nodes for workers (composed with datafusion-distributed's
/// codec): [`RemoteScanExec`] as a signed [`ScanRequest`], `YieldExec` by its slice size.
/// Any other ClearIce node cannot leave the coordinator (`ClusterRule` keeps such plans
/// local).
#[derive(Debug, Clone)]
pub struct ClearIceCodec {
    signer: Arc<TaskSigner>,
    /// Plans decoded scans (workers only).
    builder: Option<Arc<dyn ScanBuilder>>,
}

impl ClearIceCodec {
    /// The coordinator's codec: encodes and signs.
    pub fn coordinator(signer: Arc<TaskSigner>) -> Self {
        Self {
            signer,
            builder: None,
        }
    }

    /// A worker's codec: verifies, and plans scans with `builder`.
    pub fn worker(signer: Arc<TaskSigner>, builder: Arc<dyn ScanBuilder>) -> Self {
        Self {
            signer,
            builder: Some(builder),
        }
    }

    /// The request in `buf` if it is a scan this codec's secret signed and that has not
    /// expired; what it names is not checked.
    fn verified_scan(&self, buf: &[u8], ctx: &TaskContext) -> DfResult<ScanRequest> {
        let rest = &buf[SCAN_MAGIC.len()..];
        if rest.len() < TAG_BYTES {
            return Err(refused("truncated scan"));
        }
        let (tag, body) = rest.split_at(TAG_BYTES);
        if !self.signer.verify(body, tag) {
            return Err(refused(
                "its signature does not verify with this worker's cluster secret \
                 (not sent by a coordinator of this cluster, or altered)",
            ));
        }
        let wire: WireScan =
            serde_json::from_slice(body).map_err(|e| refused(format!("malformed scan: {e}")))?;
        let age = now_s().saturating_sub(wire.issued_at);
        if age > self.signer.ttl.as_secs() {
            return Err(refused(format!(
                "table {}.{}: signed {age} s ago, longer than the cluster's task_ttl_s ({})",
                wire.catalog,
                wire.table,
                self.signer.ttl.as_secs()
            )));
        }
        wire.into_request(ctx)
    }
}

impl PhysicalExtensionCodec for ClearIceCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if buf.starts_with(SCAN_MAGIC) {
            let request = self.verified_scan(buf, ctx)?;
            let Some(builder) = &self.builder else {
                return Err(DataFusionError::Internal(
                    "a coordinator cannot run a scan it receives".into(),
                ));
            };
            return Ok(Arc::new(RemoteScanExec::deferred(
                request,
                Arc::clone(builder),
            )));
        }
        if let Some(rest) = buf.strip_prefix(YIELD_MAGIC) {
            let n = u64::from_le_bytes(
                rest.try_into()
                    .map_err(|_| refused("malformed YieldExec"))?,
            );
            let input = inputs
                .first()
                .ok_or_else(|| refused("YieldExec without input"))?;
            let max_rows = (n > 0).then_some(n as usize);
            return Ok(Arc::new(YieldExec::new(Arc::clone(input), max_rows)));
        }
        Err(refused("unknown plan node (not encoded by ClearIce)"))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DfResult<()> {
        if let Some(scan) = node.as_any().downcast_ref::<RemoteScanExec>() {
            let body = serde_json::to_vec(&WireScan::from_request(scan.request())?)
                .map_err(|e| DataFusionError::Internal(format!("scan encoding: {e}")))?;
            buf.extend_from_slice(SCAN_MAGIC);
            buf.extend_from_slice(&self.signer.sign(&body));
            buf.extend_from_slice(&body);
            return Ok(());
        }
        if let Some(y) = node.as_any().downcast_ref::<YieldExec>() {
            buf.extend_from_slice(YIELD_MAGIC);
            buf.extend_from_slice(&(y.max_rows().unwrap_or(0) as u64).to_le_bytes());
            return Ok(());
        }
        Err(DataFusionError::NotImplemented(format!(
            "{} cannot be sent to a worker",
            node.name()
        )))
    }
}

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
        let mut distributed =
            DistributedPhysicalOptimizerRule.optimize(Arc::clone(&plan), config)?;
        if !distributed.as_any().is::<DistributedExec>() {
            // One task is enough (one file group, or one worker answering): the planner
            // keeps such plans here, but the scan decrypts on a worker all the same, so
            // the whole plan runs there as one stage.
            let mut plan = plan;
            if plan.output_partitioning().partition_count() > 1 {
                plan = Arc::new(CoalescePartitionsExec::new(plan));
            }
            let stage = NetworkCoalesceExec::try_new(plan, uuid::Uuid::new_v4(), 1, 1, 1)?;
            distributed = Arc::new(DistributedExec::new(Arc::new(stage)));
        }
        Ok(Arc::new(WorkerErrorsExec {
            input: distributed,
            workers: self.workers.clone(),
        }))
    }

    fn name(&self) -> &str {
        "clearice_distributed"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The coordinator's root of a distributed plan: a worker that fails mid-query fails the
/// query with one line naming the workers that stopped answering (and they get no more
/// stages until they answer again). Never sent to a worker.
#[derive(Debug)]
struct WorkerErrorsExec {
    input: Arc<dyn ExecutionPlan>,
    workers: Workers,
}

impl datafusion::physical_plan::DisplayAs for WorkerErrorsExec {
    fn fmt_as(
        &self,
        _t: datafusion::physical_plan::DisplayFormatType,
        f: &mut fmt::Formatter<'_>,
    ) -> fmt::Result {
        write!(f, "WorkerErrorsExec: workers={}", self.workers.all.len())
    }
}

impl ExecutionPlan for WorkerErrorsExec {
    fn name(&self) -> &str {
        "WorkerErrorsExec"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("WorkerErrorsExec: no child".into()))?;
        Ok(Arc::new(Self {
            input,
            workers: self.workers.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<datafusion::execution::SendableRecordBatchStream> {
        use futures::StreamExt;
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let workers = self.workers.clone();
        let stream = input.then(move |item| {
            let workers = workers.clone();
            async move {
                match item {
                    Err(e) if cause_of::<tonic::Status>(&e).is_some() => {
                        Err(workers.explain(&e).await)
                    }
                    other => other,
                }
            }
        });
        Ok(Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream),
        ))
    }
}

/// The configured workers that answer: a background probe drops a worker that stops
/// answering and takes it back when it answers again.
#[derive(Debug, Clone)]
pub struct Workers {
    all: Arc<Vec<url::Url>>,
    live: Arc<RwLock<Vec<url::Url>>>,
    /// The coordinator's channels to them (queries and probes).
    channels: ClusterChannels,
}

/// How often workers are probed.
const PROBE_EVERY: Duration = Duration::from_millis(500);

impl Workers {
    /// Parses the configured URLs and starts probing them (needs a Tokio runtime); calls
    /// carry credentials made with `signer`. The probe stops when the last clone is dropped.
    pub fn start(urls: &[String], signer: Arc<TaskSigner>) -> Result<Self, String> {
        let all = urls
            .iter()
            .map(|u| url::Url::parse(u).map_err(|e| format!("worker '{u}': {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let live = Arc::new(RwLock::new(all.clone()));
        let workers = Self {
            all: Arc::new(all),
            live,
            channels: ClusterChannels::new(signer),
        };
        let weak = Arc::downgrade(&workers.live);
        let all = Arc::clone(&workers.all);
        let channels = workers.channels.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
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
    async fn explain(&self, e: &DataFusionError) -> DataFusionError {
        let channels = ClusterChannels::new(Arc::clone(&self.channels.signer));
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
        let reason = cause_of::<tonic::Status>(e)
            .map(|s| s.message().lines().next().unwrap_or_default().to_owned())
            .unwrap_or_default();
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
pub(crate) struct Coordinator {
    pub(crate) workers: Workers,
    pub(crate) signer: Arc<TaskSigner>,
    pub(crate) partitions_per_worker: Option<usize>,
}

impl Coordinator {
    /// `state` planning catalog scans for the workers.
    pub(crate) fn distribute(&self, state: SessionState) -> SessionState {
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
            }))
            .build();
        state
            .config_mut()
            .set_extension(Arc::new(clearice_access::remote::DistributeScans {
                partitions,
            }));
        state
    }
}

/// Plans scans on a worker with its own catalogs and crypto providers.
#[derive(Debug)]
pub(crate) struct WorkerScans {
    pub(crate) catalogs: Vec<(String, Arc<IcebergCatalogProvider>)>,
    pub(crate) providers: Arc<Providers>,
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
                && let Some(t) = s.load(&request.table).await?
            {
                table = Some(t);
                break;
            }
        }
        let table = table
            .ok_or_else(|| refused(format!("table {name} is not in this worker's catalog")))?;
        let provider = self.providers.routed(&request.provider, &request.routes);
        let state = SessionStateBuilder::new()
            .with_config(ctx.session_config().clone())
            .with_runtime_env(ctx.runtime_env())
            .with_default_features()
            .build();
        let loaded = started.elapsed();
        let plan = clearice_access::remote::scan_request(&table, &state, request, provider).await?;
        tracing::debug!(
            table = %name,
            principal = %request.principal,
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
pub(crate) struct WorkerSessions {
    pub(crate) runtime: Arc<RuntimeEnv>,
    pub(crate) codec: Arc<ClearIceCodec>,
}

#[async_trait::async_trait]
impl WorkerSessionBuilder for WorkerSessions {
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> DfResult<SessionState> {
        let cache_manager = datafusion::execution::cache::cache_manager::CacheManager::try_new(
            &Default::default(),
        )?;
        let runtime = Arc::new(RuntimeEnv {
            memory_pool: Arc::clone(&self.runtime.memory_pool),
            disk_manager: Arc::clone(&self.runtime.disk_manager),
            cache_manager,
            object_store_registry: Arc::clone(&self.runtime.object_store_registry),
            parquet_encryption_factory_registry: Default::default(),
        });
        Ok(ctx
            .builder
            .with_runtime_env(runtime)
            .with_distributed_user_codec_arc(Arc::clone(&self.codec) as _)
            .build())
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

/// A worker service for `sessions`; it runs only stage plans [`admitted`], and cuts result
/// batches so that each message stays under [`MAX_MESSAGE_BYTES`]. Serve it with [`serve`].
pub(crate) fn worker(sessions: WorkerSessions) -> Worker {
    let channels = ClusterChannels::new(Arc::clone(&sessions.codec.signer));
    let mut worker = Worker::from_session_builder(WorkerSessionsOnChannels { sessions, channels })
        .with_max_message_size(MAX_MESSAGE_BYTES / 2);
    worker.add_on_plan_hook(guard);
    worker
}

/// Serves `engine`'s worker service on `listener` until `shutdown` completes. A call is
/// authenticated from its headers before its message is read ([`Authenticated`]), and a
/// message over [`MAX_MESSAGE_BYTES`] is refused from its length prefix.
pub(crate) async fn serve(
    engine: &crate::Engine,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> crate::Result<()> {
    let worker = engine.worker_service()?;
    let signer = engine
        .signer
        .clone()
        .ok_or_else(|| crate::Error::Worker("no cluster secret".into()))?;
    let service = Authenticated {
        inner: worker
            .into_worker_server()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        signer,
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| crate::Error::Worker(e.to_string()))
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
            let refusal = tonic::Status::unauthenticated(reason).into_http();
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        // Call the service that was made ready; its clone waits for the next call.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        Box::pin(ready.call(request))
    }
}

/// The channels of a coordinator to its workers and of a worker to the others (stages
/// reading other stages): datafusion-distributed's (one connection per worker, reused),
/// each call carrying a fresh credential for its RPC ([`TaskSigner::call_credential`]) and
/// its messages bounded by [`MAX_MESSAGE_BYTES`].
#[derive(Clone)]
pub(crate) struct ClusterChannels {
    signer: Arc<TaskSigner>,
    channels: DefaultChannelResolver,
}

impl fmt::Debug for ClusterChannels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterChannels").finish_non_exhaustive()
    }
}

impl ClusterChannels {
    pub(crate) fn new(signer: Arc<TaskSigner>) -> Self {
        Self {
            signer,
            channels: DefaultChannelResolver::default(),
        }
    }
}

#[async_trait::async_trait]
impl ChannelResolver for ClusterChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &url::Url,
    ) -> DfResult<WorkerServiceClient<BoxCloneSyncChannel>> {
        let channel = self.channels.get_channel(url).await?;
        let channel = BoxCloneSyncChannel::new(Credentialed {
            inner: channel,
            signer: Arc::clone(&self.signer),
        });
        Ok(WorkerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

/// A channel that puts a credential for each call's RPC in its `authorization` header.
#[derive(Clone)]
struct Credentialed {
    inner: BoxCloneSyncChannel,
    signer: Arc<TaskSigner>,
}

impl Service<http::Request<tonic::body::Body>> for Credentialed {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = <BoxCloneSyncChannel as Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let credential = self.signer.call_credential(request.uri().path());
        // Always ASCII; a worker refuses a call without it.
        if let Ok(value) = http::HeaderValue::try_from(credential) {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
        }
        self.inner.call(request)
    }
}

/// Whether a decoded stage plan may run on this worker. Whoever reaches a worker's port
/// can send a plan; only a signed scan reads data (its signature was verified when it was
/// decoded). DataFusion's own file scans and sinks would reach the worker's files, so
/// every leaf must be a [`RemoteScanExec`], read nothing, or be a network boundary (its
/// input runs on other workers), and no node may write.
fn admitted(plan: &Arc<dyn ExecutionPlan>) -> Result<(), String> {
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

/// The plan, or one that fails with why it was not [`admitted`] (the worker's hook cannot
/// return an error).
fn guard(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field};

    fn signer(ttl_s: u64) -> Arc<TaskSigner> {
        Arc::new(TaskSigner::new(&[42u8; 32], Duration::from_secs(ttl_s)).unwrap())
    }

    fn request() -> ScanRequest {
        ScanRequest {
            catalog: "lake".into(),
            namespace: vec!["sales".into()],
            table: "customers".into(),
            snapshot_id: Some(7),
            travel: false,
            table_fields: vec!["id".into(), "ssn".into()],
            projection: vec![0, 1],
            filters: vec![datafusion::prelude::col("id").gt(datafusion::prelude::lit(3i64))],
            limit: Some(10),
            set_predicate: true,
            scope: KeyScope::Columns(clearice_crypto::ColumnKeys {
                by_field_id: [(4, "pii_key".to_owned()), (7, "finance_key".to_owned())].into(),
                by_name: [("ssn".to_owned(), "pii_key".to_owned())].into(),
            }),
            principal: "analyst".into(),
            aad_prefix: Some(b"tenant-1".to_vec()),
            provider: "local".into(),
            routes: BTreeMap::new(),
            column_keys: [("ssn".to_owned(), "pii_key".to_owned())].into(),
            masks: Some(vec![
                MaskOutput {
                    name: "id".into(),
                    decision: clearice_policy::Decision::Plaintext,
                    input: Some(0),
                    data_type: DataType::Int64,
                },
                MaskOutput {
                    name: "ssn".into(),
                    decision: clearice_policy::Decision::Mask(clearice_policy::Mask::ShowLast4),
                    input: Some(1),
                    data_type: DataType::Utf8,
                },
            ]),
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("ssn", DataType::Utf8, true),
            ])),
            partitions: 3,
        }
    }

    #[derive(Debug)]
    struct NoBuilder;

    #[async_trait::async_trait]
    impl ScanBuilder for NoBuilder {
        async fn build(
            &self,
            _request: &ScanRequest,
            _ctx: Arc<TaskContext>,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            Err(DataFusionError::Internal("not in this test".into()))
        }
    }

    fn encode(signer: &Arc<TaskSigner>, request: ScanRequest) -> Vec<u8> {
        let plan: Arc<dyn ExecutionPlan> = Arc::new(RemoteScanExec::planned(
            request,
            Arc::new(EmptyExec::new(Arc::new(Schema::empty()))),
        ));
        let mut buf = Vec::new();
        ClearIceCodec::coordinator(Arc::clone(signer))
            .try_encode(plan, &mut buf)
            .unwrap();
        buf
    }

    #[test]
    fn a_scan_request_survives_the_wire() {
        let s = signer(60);
        let buf = encode(&s, request());
        let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
        let plan = codec
            .try_decode(&buf, &[], &TaskContext::default())
            .unwrap();
        let got = plan
            .as_any()
            .downcast_ref::<RemoteScanExec>()
            .unwrap()
            .request();
        let want = request();
        assert_eq!(got.table_name(), "lake.sales.customers");
        assert_eq!(got.snapshot_id, want.snapshot_id);
        assert_eq!(got.projection, want.projection);
        assert_eq!(got.filters, want.filters);
        assert_eq!(got.limit, want.limit);
        assert_eq!(format!("{:?}", got.scope), format!("{:?}", want.scope));
        assert_eq!(got.aad_prefix, want.aad_prefix);
        assert_eq!(got.column_keys, want.column_keys);
        assert_eq!(got.schema, want.schema);
        assert_eq!(got.partitions, 3);
        let masks: Vec<_> = got
            .masks
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    m.decision.clone(),
                    m.input,
                    m.data_type.clone(),
                )
            })
            .collect();
        let want_masks: Vec<_> = want
            .masks
            .unwrap()
            .into_iter()
            .map(|m| (m.name, m.decision, m.input, m.data_type))
            .collect();
        assert_eq!(masks, want_masks);
        // The policy's mask names on the wire.
        assert!(String::from_utf8_lossy(&buf).contains("\"show_last_4\""));
    }

    #[test]
    fn expired_truncated_and_foreign_scans_are_refused() {
        let s = signer(60);
        let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
        let ctx = TaskContext::default();
        // Signed long ago (a replay): re-sign a body with an old stamp.
        let mut wire = WireScan::from_request(&request()).unwrap();
        wire.issued_at = now_s() - 3600;
        let body = serde_json::to_vec(&wire).unwrap();
        let mut old = SCAN_MAGIC.to_vec();
        old.extend_from_slice(&s.sign(&body));
        old.extend_from_slice(&body);
        let e = codec.try_decode(&old, &[], &ctx).unwrap_err().to_string();
        assert!(
            e.contains("longer than the cluster's task_ttl_s (60)"),
            "{e}"
        );
        let e = codec
            .try_decode(&SCAN_MAGIC[..], &[], &ctx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = codec
            .try_decode(b"something else", &[], &ctx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown plan node"), "{e}");
        assert!(TaskSigner::new(&[1u8; 31], Duration::from_secs(1)).is_err());
    }

    #[test]
    fn workers_run_only_plans_whose_leaves_are_signed_scans() {
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::physical_plan::filter::FilterExec;
        let schema = request().schema;
        let scan: Arc<dyn ExecutionPlan> =
            Arc::new(RemoteScanExec::deferred(request(), Arc::new(NoBuilder)));
        let above = |leaf: Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                FilterExec::try_new(datafusion::physical_expr::expressions::lit(true), leaf)
                    .unwrap(),
            )
        };
        assert!(admitted(&above(Arc::clone(&scan))).is_ok());
        // A plan of DataFusion's own (here rows in memory; a file scan alike) is refused,
        // and runs as a node that fails with why.
        let memory: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[vec![]], Arc::clone(&schema), None).unwrap();
        let forged = above(memory);
        let e = admitted(&forged).unwrap_err();
        assert!(e.contains("is not a scan signed by a coordinator"), "{e}");
        let guarded = guard(forged);
        assert_eq!(guarded.name(), "RefusedExec");
        assert_eq!(guarded.schema(), schema);
        let e = guarded
            .execute(0, Arc::new(TaskContext::default()))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("worker refused the scan: stage plan refused"),
            "{e}"
        );
    }

    #[test]
    fn call_credentials_hold_for_their_rpc_secret_and_window_only() {
        const INFO: &str = "/worker.WorkerService/GetWorkerInfo";
        const TASK: &str = "/worker.WorkerService/ExecuteTask";
        let s = signer(60);
        let headers = |value: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(value).unwrap(),
            );
            h
        };
        let fresh = s.call_credential(TASK);
        assert!(fresh.starts_with("ClearIce-Cluster "), "{fresh}");
        assert_eq!(s.check_call(TASK, &headers(&fresh)), Ok(()));
        // Another RPC, another secret, tampered, stale or from too far ahead, absent.
        let e = s.check_call(INFO, &headers(&fresh)).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        let other = TaskSigner::new(&[43u8; 32], Duration::from_secs(60)).unwrap();
        let e = other.check_call(TASK, &headers(&fresh)).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        let (stamp, _) = fresh.split_once('.').unwrap();
        let e = s
            .check_call(TASK, &headers(&format!("{stamp}.{}", "00".repeat(32))))
            .unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        let window = CALL_WINDOW.as_secs();
        let old = s.credential_at(TASK, now_s() - window - 5);
        let e = s.check_call(TASK, &headers(&old)).unwrap_err();
        assert!(e.contains("stale"), "{e}");
        let ahead = s.credential_at(TASK, now_s() + window + 5);
        assert!(s.check_call(TASK, &headers(&ahead)).is_err());
        let skewed = s.credential_at(TASK, now_s() - window + 30);
        assert_eq!(s.check_call(TASK, &headers(&skewed)), Ok(()));
        for bad in ["Bearer x", "ClearIce-Cluster 12", "ClearIce-Cluster x.00"] {
            let e = s.check_call(TASK, &headers(bad)).unwrap_err();
            assert!(e.contains("malformed"), "{bad}: {e}");
        }
        let e = s.check_call(TASK, &http::HeaderMap::new()).unwrap_err();
        assert!(e.contains("no cluster credential"), "{e}");
    }

    #[test]
    fn yield_nodes_round_trip_and_other_nodes_stay_home() {
        let s = signer(60);
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::empty())));
        let node: Arc<dyn ExecutionPlan> = Arc::new(YieldExec::new(Arc::clone(&input), Some(128)));
        let coordinator = ClearIceCodec::coordinator(Arc::clone(&s));
        let mut buf = Vec::new();
        coordinator.try_encode(node, &mut buf).unwrap();
        let worker = ClearIceCodec::worker(s, Arc::new(NoBuilder));
        let back = worker
            .try_decode(&buf, &[input], &TaskContext::default())
            .unwrap();
        let y = back.as_any().downcast_ref::<YieldExec>().unwrap();
        assert_eq!(y.max_rows(), Some(128));
        let e = coordinator
            .try_encode(
                Arc::new(PlaceholderRowExec::new(Arc::new(Schema::empty()))),
                &mut Vec::new(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be sent to a worker"), "{e}");
    }
}
