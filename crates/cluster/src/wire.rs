//! A scan request on the wire: JSON, signed by the codec; key ids only, never key bytes.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use clearice_access::MaskOutput;
use clearice_access::remote::ScanRequest;
use clearice_crypto::{AccessToken, ScanGrant};
use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::refused;
use crate::signer::{TaskSigner, now_s};

/// One output column's decision on the wire (its type is the schema's).
#[derive(Serialize, Deserialize)]
struct WireMask {
    name: String,
    decision: clearice_policy::Decision,
    input: Option<usize>,
}

/// A [`ScanRequest`] on the wire: JSON, signed. No key bytes: master key ids only.
#[derive(Serialize, Deserialize)]
pub(crate) struct WireScan {
    pub(crate) issued_at: u64,
    /// The attempt of the query this scan was signed for (a UUID): a worker refuses the
    /// scan once the coordinator said that query ended.
    pub(crate) query: String,
    pub(crate) catalog: String,
    namespace: Vec<String>,
    pub(crate) table: String,
    snapshot_id: Option<i64>,
    travel: bool,
    table_fields: Vec<String>,
    projection: Vec<usize>,
    /// `LogicalExprList` (datafusion-proto), base64.
    filters: String,
    limit: Option<usize>,
    set_predicate: bool,
    /// The grant as the coordinator decided it (its resolved provider never travels, its
    /// token travels sealed in [`WireScan::credential`]).
    grant: ScanGrant,
    /// The principal's own provider token, sealed for cluster members and bound to this
    /// scan's table, principal and time (base64): not readable in a plan or message dump.
    #[serde(default)]
    credential: Option<String>,
    masks: Option<Vec<WireMask>>,
    /// The check value of the `hmac_sha256` mask's secret (never the secret).
    #[serde(default)]
    mask_key_check: Option<String>,
    /// Arrow schema (datafusion-proto), base64.
    schema: String,
    partitions: usize,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl WireScan {
    /// `catalog.namespace.table`, for messages.
    pub(crate) fn table_name(&self) -> String {
        format!(
            "{}.{}.{}",
            self.catalog,
            self.namespace.join("."),
            self.table
        )
    }

    /// The wire form of `r`, its principal's token sealed by `signer`.
    pub(crate) fn from_request(
        r: &ScanRequest,
        query: uuid::Uuid,
        signer: &TaskSigner,
    ) -> DfResult<Self> {
        let filters = datafusion_proto::logical_plan::to_proto::serialize_exprs(
            &r.filters,
            &DefaultLogicalExtensionCodec {},
        )
        .map_err(|e| DataFusionError::Plan(format!("table {}: filters: {e}", r.table_name())))?;
        let filters = datafusion_proto::protobuf::LogicalExprList { expr: filters }.encode_to_vec();
        let schema = datafusion_proto::protobuf::Schema::try_from(r.schema.as_ref())
            .map_err(|e| DataFusionError::Plan(format!("table {}: schema: {e}", r.table_name())))?
            .encode_to_vec();
        let issued_at = now_s();
        let credential = match &r.grant.credential {
            None => None,
            Some(token) => {
                let context = seal_context(
                    &query.to_string(),
                    &r.catalog,
                    &r.namespace,
                    &r.table,
                    &r.grant.principal,
                    issued_at,
                );
                let sealed = signer
                    .seal(token.expose().as_bytes(), &context)
                    .map_err(|e| {
                        DataFusionError::Internal(format!(
                            "table {}: the principal's provider token: {e}",
                            r.table_name()
                        ))
                    })?;
                Some(b64().encode(sealed))
            }
        };
        Ok(Self {
            issued_at,
            query: query.to_string(),
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
            grant: r.grant.clone(),
            credential,
            masks: r.masks.as_ref().map(|m| {
                m.iter()
                    .map(|o| WireMask {
                        name: o.name.clone(),
                        decision: o.decision.clone(),
                        input: o.input,
                    })
                    .collect()
            }),
            mask_key_check: r.mask_key_check.clone(),
            schema: b64().encode(schema),
            partitions: r.partitions,
        })
    }

    /// The request this scan carries, its token opened with `signer`.
    pub(crate) fn into_request(
        self,
        ctx: &TaskContext,
        signer: &TaskSigner,
    ) -> DfResult<ScanRequest> {
        let table = self.table_name();
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
        let mut grant = self.grant;
        grant.credential = match &self.credential {
            None => None,
            Some(sealed) => {
                let context = seal_context(
                    &self.query,
                    &self.catalog,
                    &self.namespace,
                    &self.table,
                    &grant.principal,
                    self.issued_at,
                );
                let token = b64()
                    .decode(sealed)
                    .ok()
                    .and_then(|s| signer.open(&s, &context))
                    .and_then(|t| String::from_utf8(t.to_vec()).ok())
                    .ok_or_else(|| {
                        bad(
                            "the principal's provider token",
                            &"does not open with this worker's cluster secret for this scan",
                        )
                    })?;
                Some(AccessToken::new(token))
            }
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
            grant,
            masks,
            mask_key_check: self.mask_key_check,
            schema,
            partitions: self.partitions,
        })
    }
}

/// What a sealed token is bound to: the scan's query, table, principal and signing time.
fn seal_context(
    query: &str,
    catalog: &str,
    namespace: &[String],
    table: &str,
    principal: &str,
    issued_at: u64,
) -> Vec<u8> {
    serde_json::to_vec(&(
        "clearice-cluster-token-v1",
        query,
        catalog,
        namespace,
        table,
        principal,
        issued_at,
    ))
    .unwrap_or_default()
}
