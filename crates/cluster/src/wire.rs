//! A scan request on the wire: JSON, signed by the codec; key ids only, never key bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use clearice_access::MaskOutput;
use clearice_access::remote::ScanRequest;
use clearice_crypto::KeyScope;
use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::refused;
use crate::signer::now_s;

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
pub(crate) struct WireScan {
    pub(crate) issued_at: u64,
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
    pub(crate) fn from_request(r: &ScanRequest) -> DfResult<Self> {
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

    pub(crate) fn into_request(self, ctx: &TaskContext) -> DfResult<ScanRequest> {
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
