//! Table scans that run on other processes (scale-out).
//!
//! ```text
//!  coordinator                                   worker
//!  PolicyTableProvider::scan                     RemoteScanExec (decoded: request only)
//!    decides columns, masks, key scope, audit       │ first execute: ScanBuilder::build
//!    ▼                                              ▼
//!  RemoteScanExec { request, plan }  ──bytes──▶  IcebergTableProvider (pinned snapshot)
//!    leaf for the distributed planner              .scan_request() = the same plan:
//!    (its plan is never sent)                      DataSourceExec(decrypting reader, own KMS)
//!                                                  └ PolicyMaskExec (masks on the worker)
//! ```
//!
//! A [`ScanRequest`] is everything a worker needs to plan the coordinator's scan again
//! with its own catalog and KMS: table, pinned snapshot, columns, filters, the key scope
//! and masks decided for the principal. It names master keys and never holds key bytes,
//! footers or files' contents. The coordinator's plan for the same request answers
//! `EXPLAIN`, statistics and single-process execution.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use clearice_crypto::{CallContext, MaskKey, ScanGrant};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::TryStreamExt;

use crate::mask_exec::{MaskOutput, PolicyMaskExec};
use clearice_iceberg::IcebergTableProvider;

/// Session config extension: a session that has it plans catalog table scans as
/// [`RemoteScanExec`] leaves a distributed engine can ship to workers.
#[derive(Debug, Clone, Copy)]
pub struct DistributeScans {
    /// File groups per scan (the workers' parallelism): each worker runs a share.
    pub partitions: usize,
}

/// One table scan as the coordinator decided it, for a worker to plan again. Key ids and
/// decisions only: no key bytes, footers or data.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    /// The catalog's name in SQL.
    pub catalog: String,
    /// The table's namespace, level by level.
    pub namespace: Vec<String>,
    /// The table's name in its namespace.
    pub table: String,
    /// The snapshot read (pinned: workers read what the coordinator planned).
    pub snapshot_id: Option<i64>,
    /// The query travelled in time (`FOR VERSION AS OF`): the snapshot's schema applies.
    pub travel: bool,
    /// Field names of the table schema the projection indexes (checked by the worker).
    pub table_fields: Vec<String>,
    /// Table columns read (indices in the table schema).
    pub projection: Vec<usize>,
    /// Filters on plaintext columns (file pruning, row filters).
    pub filters: Vec<Expr>,
    /// Row limit, if any.
    pub limit: Option<usize>,
    /// `filters` also go to the Parquet reader (a mask above blocks DataFusion's pushdown).
    pub set_predicate: bool,
    /// What the scan may decrypt, and as whom (its provider by name: the worker resolves
    /// it with its own providers; the token travels sealed, see clearice-cluster).
    pub grant: ScanGrant,
    /// The principal's masks, one per output column; `None`: every column in plaintext.
    pub masks: Option<Vec<MaskOutput>>,
    /// The check value ([`MaskKey::check`]) of the `hmac_sha256` mask's secret, when a
    /// mask needs it: the worker masks only with a secret of the same check value.
    pub mask_key_check: Option<String>,
    /// The scan's output schema.
    pub schema: SchemaRef,
    /// File groups (output partitions).
    pub partitions: usize,
}

impl ScanRequest {
    /// `catalog.namespace.table`.
    pub fn table_name(&self) -> String {
        format!(
            "{}.{}.{}",
            self.catalog,
            self.namespace.join("."),
            self.table
        )
    }
}

/// Plans a [`ScanRequest`] where it runs (a worker's catalogs and crypto providers).
#[async_trait::async_trait]
pub trait ScanBuilder: fmt::Debug + Send + Sync {
    /// The plan for `request`, with exactly `request.partitions` output partitions.
    async fn build(
        &self,
        request: &ScanRequest,
        ctx: Arc<TaskContext>,
    ) -> Result<Arc<dyn ExecutionPlan>>;

    /// Whether `request` may still run, asked before each partition is executed (a
    /// worker refuses the scans of a query that ended). Admits by default.
    fn admit(&self, _request: &ScanRequest) -> Result<()> {
        Ok(())
    }
}

/// A table scan that may run in another process: a leaf for the distributed planner.
pub struct RemoteScanExec {
    request: Arc<ScanRequest>,
    /// The plan: built by the coordinator, or on a worker's first `execute`.
    plan: Arc<tokio::sync::OnceCell<Arc<dyn ExecutionPlan>>>,
    /// Builds the plan on a worker (absent on the coordinator).
    builder: Option<Arc<dyn ScanBuilder>>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for RemoteScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteScanExec")
            .field("table", &self.request.table_name())
            .field("partitions", &self.request.partitions)
            .finish_non_exhaustive()
    }
}

fn properties_of(request: &ScanRequest) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(&request.schema)),
        Partitioning::UnknownPartitioning(request.partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

impl RemoteScanExec {
    /// The coordinator's node: `plan` is its own plan of `request`.
    pub fn planned(request: ScanRequest, plan: Arc<dyn ExecutionPlan>) -> Self {
        let properties = properties_of(&request);
        Self {
            request: Arc::new(request),
            plan: Arc::new(tokio::sync::OnceCell::new_with(Some(plan))),
            builder: None,
            properties,
        }
    }

    /// A worker's node: `builder` plans `request` when first executed.
    pub fn deferred(request: ScanRequest, builder: Arc<dyn ScanBuilder>) -> Self {
        let properties = properties_of(&request);
        Self {
            request: Arc::new(request),
            plan: Arc::new(tokio::sync::OnceCell::new()),
            builder: Some(builder),
            properties,
        }
    }

    /// What the scan reads, as whom, with which keys and masks.
    pub fn request(&self) -> &ScanRequest {
        &self.request
    }

    /// The plan, if built here (the coordinator's, or a worker's after the first execute).
    pub fn local_plan(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.plan.get()
    }
}

impl DisplayAs for RemoteScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.request;
        write!(f, "RemoteScanExec: table={}", r.table_name())?;
        if let Some(id) = r.snapshot_id {
            write!(f, ", snapshot={id}")?;
        }
        write!(
            f,
            ", partitions={}, principal={}, columns=[",
            r.partitions, r.grant.principal
        )?;
        for (i, field) in r.schema.fields().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match r.masks.as_ref().map(|m| &m[i].decision) {
                Some(d) => write!(f, "{}={d}", field.name())?,
                None => write!(f, "{}", field.name())?,
            }
        }
        f.write_str("]")?;
        if !r.filters.is_empty() {
            let filters: Vec<String> = r.filters.iter().map(|e| e.to_string()).collect();
            write!(f, ", filters=[{}]", filters.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for RemoteScanExec {
    fn name(&self) -> &str {
        "RemoteScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "RemoteScanExec is a leaf".to_owned(),
            ))
        }
    }

    /// A worker's node without the plan it built (that holds the scan's state); the
    /// coordinator's keeps its plan.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        match &self.builder {
            Some(builder) => Ok(Arc::new(Self {
                request: Arc::clone(&self.request),
                plan: Arc::new(tokio::sync::OnceCell::new()),
                builder: Some(Arc::clone(builder)),
                properties: Arc::clone(&self.properties),
            })),
            None => Ok(self),
        }
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        match self.plan.get() {
            Some(p) => p.partition_statistics(partition),
            None => Ok(Statistics::new_unknown(&self.request.schema)),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if let Some(builder) = &self.builder {
            builder.admit(&self.request)?;
        }
        if let Some(plan) = self.plan.get() {
            return plan.execute(partition, context);
        }
        let Some(builder) = self.builder.clone() else {
            return Err(DataFusionError::Internal(format!(
                "RemoteScanExec of {} has neither a plan nor a builder",
                self.request.table_name()
            )));
        };
        let (cell, request) = (Arc::clone(&self.plan), Arc::clone(&self.request));
        let stream = futures::stream::once(async move {
            let plan = cell
                .get_or_try_init(|| builder.build(&request, Arc::clone(&context)))
                .await?;
            let n = plan.properties().output_partitioning().partition_count();
            if n != request.partitions {
                return Err(DataFusionError::Execution(format!(
                    "table {}: this worker planned {n} file groups where the coordinator planned {} \
                     (the table changed during the query?); run the query again",
                    request.table_name(),
                    request.partitions
                )));
            }
            plan.execute(partition, context)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.request.schema),
            stream,
        )))
    }
}

/// Plans `request` (a coordinator's scan of `table`) here under `grant` (the request's,
/// its provider resolved here: [`ScanGrant::resolved`]): the same files at the same
/// snapshot, the same key scope and masks.
pub async fn scan_request(
    table: &IcebergTableProvider,
    state: &dyn Session,
    request: &ScanRequest,
    grant: ScanGrant,
    mask_key: Option<&Arc<MaskKey>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let name = request.table_name();
    let keyed =
        request.masks.iter().flatten().any(|m| {
            m.decision == clearice_policy::Decision::Mask(clearice_policy::Mask::HmacSha256)
        });
    // The keyed mask with this process's secret, only if it is the coordinator's: another
    // secret would give other hashes (wrong joins), none would fail mid-stream.
    let mask_key = match (keyed, &request.mask_key_check, mask_key) {
        (false, _, _) => None,
        (true, Some(want), Some(k)) if k.check() == want => Some(Arc::clone(k)),
        (true, Some(_), Some(_)) => {
            return Err(DataFusionError::Execution(format!(
                "table {name}: this process's hmac_sha256 secret ([masks] hmac_key_file) is not the coordinator's"
            )));
        }
        (true, _, _) => {
            return Err(DataFusionError::Execution(format!(
                "table {name}: the hmac_sha256 mask's secret ([masks] hmac_key_file) is not loaded here"
            )));
        }
    };
    let table = match (request.snapshot_id, request.travel) {
        (Some(id), true) => table.clone().as_of(clearice_iceberg::AsOf::Version(id))?,
        (Some(id), false) => table.pinned(id)?,
        (None, _) => table.clone(),
    }
    .split_into(request.partitions)
    // The coordinator planned with the statistics: a worker reads no footer for them.
    .with_shown_statistics(clearice_iceberg::Shown::Nothing);
    // A table key a crypto provider keeps: unwrapped by this worker's provider of that
    // name, for the request's principal (as on the coordinator).
    let table = match &grant.route {
        Some(route) => {
            let provider = grant.provider.as_ref().ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "table {name}: the scan's crypto provider is not resolved here"
                ))
            })?;
            let ctx = CallContext {
                principal: grant.principal.clone(),
                file: String::new(),
                application: table.application_context(),
                credential: grant.credential.clone(),
            };
            crate::table_keys::bind_table_key(table, route, provider, ctx)?
        }
        None => table,
    };
    let fields: Vec<String> = table
        .table_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    if fields != request.table_fields {
        return Err(DataFusionError::Execution(format!(
            "table {name}: its schema here ({}) is not the coordinator's ({}); \
                 run the query again",
            fields.join(", "),
            request.table_fields.join(", ")
        )));
    }
    let plan = table
        .scan_with(
            state,
            Some(&request.projection),
            &request.filters,
            request.limit,
            grant,
            request.set_predicate,
        )
        .await?;
    Ok(match &request.masks {
        None => plan,
        Some(masks) => Arc::new(PolicyMaskExec::new(
            plan,
            masks.clone(),
            Arc::clone(&request.schema),
            request.grant.principal.clone(),
            mask_key,
        )),
    })
}
