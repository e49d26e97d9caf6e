//! ClearIce's plan nodes encoded for workers: signed scans, yield nodes; nothing else leaves.

use std::sync::Arc;

use clearice_access::remote::{RemoteScanExec, ScanBuilder, ScanRequest};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use clearice_access::compact::CompactViewsExec;
use clearice_access::fair::YieldExec;

use crate::error::refused;
use crate::queries::EndedQueries;
use crate::signer::{TaskSigner, now_s};
use crate::wire::WireScan;

pub(crate) const SCAN_MAGIC: &[u8; 8] = b"CLRSCAN3";

pub(crate) const YIELD_MAGIC: &[u8; 8] = b"CLRYLD01";
pub(crate) const COMPACT_MAGIC: &[u8; 8] = b"CLRCMP01";

pub(crate) const TAG_BYTES: usize = 32;

/// Encodes ClearIce's plan nodes for workers (composed with datafusion-distributed's
/// codec): [`RemoteScanExec`] as a signed [`ScanRequest`], `YieldExec` by its slice size,
/// `CompactViewsExec` by its name.
/// Any other ClearIce node cannot leave the coordinator (`ClusterRule` keeps such plans
/// local).
#[derive(Debug, Clone)]
pub struct ClearIceCodec {
    pub(crate) signer: Arc<TaskSigner>,
    /// The queries coordinators ended (workers only: their scans are refused).
    pub(crate) ended: Arc<EndedQueries>,
    /// Plans decoded scans (workers only).
    builder: Option<Arc<dyn ScanBuilder>>,
}

impl ClearIceCodec {
    /// The coordinator's codec: encodes and signs.
    pub fn coordinator(signer: Arc<TaskSigner>) -> Self {
        Self {
            ended: Arc::new(EndedQueries::new(signer.ttl)),
            signer,
            builder: None,
        }
    }

    /// A worker's codec: verifies, and plans scans with `builder`.
    pub fn worker(signer: Arc<TaskSigner>, builder: Arc<dyn ScanBuilder>) -> Self {
        Self {
            ended: Arc::new(EndedQueries::new(signer.ttl)),
            signer,
            builder: Some(builder),
        }
    }

    /// The request in `buf` if it is a scan this codec's secret signed, that has not
    /// expired and whose query has not ended, with that query; what it names is not
    /// checked.
    fn verified_scan(&self, buf: &[u8], ctx: &TaskContext) -> DfResult<(ScanRequest, uuid::Uuid)> {
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
                "table {}: signed {age} s ago, longer than the cluster's task_ttl_s ({})",
                wire.table_name(),
                self.signer.ttl.as_secs()
            )));
        }
        let query = uuid::Uuid::parse_str(&wire.query)
            .map_err(|_| refused(format!("table {}: malformed query id", wire.table_name())))?;
        self.ended.admit(&query, &wire.table_name())?;
        Ok((wire.into_request(ctx, &self.signer)?, query))
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
            let (request, query) = self.verified_scan(buf, ctx)?;
            let Some(builder) = &self.builder else {
                return Err(DataFusionError::Internal(
                    "a coordinator cannot run a scan it receives".into(),
                ));
            };
            // Checked again before each partition runs: a task set up before its query
            // ended runs no partition after.
            let builder = Arc::new(UntilEnded {
                query,
                ended: Arc::clone(&self.ended),
                inner: Arc::clone(builder),
            });
            return Ok(Arc::new(RemoteScanExec::deferred(request, builder)));
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
        if buf == COMPACT_MAGIC {
            let input = inputs
                .first()
                .ok_or_else(|| refused("CompactViewsExec without input"))?;
            return Ok(Arc::new(CompactViewsExec::new(Arc::clone(input))));
        }
        Err(refused("unknown plan node (not encoded by ClearIce)"))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DfResult<()> {
        if let Some(scan) = node.as_any().downcast_ref::<RemoteScanExec>() {
            // Signed for the query being started (see `encoding_for`), or not sent.
            let query = crate::queries::encoding_query().ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "table {}: a scan is sent to workers only as part of a query",
                    scan.request().table_name()
                ))
            })?;
            let wire = WireScan::from_request(scan.request(), query, &self.signer)?;
            let body = serde_json::to_vec(&wire)
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
        if node.as_any().is::<CompactViewsExec>() {
            buf.extend_from_slice(COMPACT_MAGIC);
            return Ok(());
        }
        Err(DataFusionError::NotImplemented(format!(
            "{} cannot be sent to a worker",
            node.name()
        )))
    }
}

/// A worker's scan builder for the scans of one query: admits them while it runs.
#[derive(Debug)]
struct UntilEnded {
    query: uuid::Uuid,
    ended: Arc<EndedQueries>,
    inner: Arc<dyn ScanBuilder>,
}

#[async_trait::async_trait]
impl ScanBuilder for UntilEnded {
    async fn build(
        &self,
        request: &ScanRequest,
        ctx: Arc<TaskContext>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.inner.build(request, ctx).await
    }

    fn admit(&self, request: &ScanRequest) -> DfResult<()> {
        self.ended.admit(&self.query, &request.table_name())?;
        self.inner.admit(request)
    }
}
