//! The policy-enforcing table provider and its mask node.
//!
//! ```text
//!  FilterExec / joins / aggregates   ← see only what the principal may see
//!        │
//!  PolicyMaskExec                     masks computed right above the scan; filters on
//!        │                            masked columns are never pushed below it
//!  DataSourceExec (Iceberg files)     decrypts only the columns that are needed, and
//!                                     asks the KMS only for their master keys
//! ```
//!
//! Decisions are made once per query when the table is resolved: `deny` columns fail any
//! plan that reads them (before any data IO), `hide` columns are not in the schema,
//! constant masks read nothing. The write side (who may write, what a write must leave
//! NULL, the checks a row-level write passes first) is in `write.rs`.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use clearice_crypto::{CallContext, ColumnKeys, KeyAccess, KeyScope, ProviderRoute};
use clearice_policy::{
    AuditColumn, ColumnKind, Decision, Mask, MissingKey, Resolved, RuleSource, TableDecision,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::project_schema;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use crate::access::{SessionAccess, TableAccess};
use crate::mask;
use crate::mask_exec::{MaskOutput, PolicyMaskExec};
use crate::remote::{DistributeScans, RemoteScanExec, ScanRequest};
use clearice_iceberg::Error;
use clearice_iceberg::{IcebergTableProvider, Shown};

pub(crate) mod restrictions;
pub(crate) mod row_filter;
mod write;

/// One visible column: its decision and where its values come from.
#[derive(Debug, Clone)]
struct VisibleColumn {
    field: Arc<Field>,
    /// Index in the inner (Iceberg) schema.
    inner: usize,
    resolved: Resolved,
    master_key: Option<String>,
    /// The policy names the column (it has rules: restricted for someone).
    named: bool,
}

/// An Iceberg table as one principal may see it.
#[derive(Debug)]
pub struct PolicyTableProvider {
    inner: IcebergTableProvider,
    access: Arc<SessionAccess>,
    schema: SchemaRef,
    columns: Vec<VisibleColumn>,
    /// Master keys of protected columns by inner index (for key scoping).
    protected_keys: Vec<Option<String>>,
    /// Why the whole table is denied to this principal, if it is (`Error::TableDenied`).
    denied: Option<Error>,
    /// The table's crypto provider (routing each key to the policy's provider).
    crypto: clearice_crypto::ProviderRef,
    /// Keys whose provider could not be asked, and why (scans reading them fail).
    provider_failure: Option<(BTreeSet<String>, clearice_crypto::ProviderError)>,
    /// The table's provider by name, and master keys routed to others (for workers).
    provider_route: ProviderRoute,
    /// The rows this principal may see, if the policy filters them (`row_filter.rs`).
    row_filter: Option<row_filter::BoundRowFilter>,
}

/// A copy of a provider failure for one more error (the variants a failed access check
/// returns keep their fields; others keep their message).
fn copy_failure(e: &clearice_crypto::ProviderError) -> clearice_crypto::ProviderError {
    use clearice_crypto::ProviderError as P;
    match e {
        P::Unauthenticated { provider, reason } => P::Unauthenticated {
            provider: provider.clone(),
            reason: reason.clone(),
        },
        P::Denied {
            provider,
            key_id,
            principal,
            reason,
        } => P::Denied {
            provider: provider.clone(),
            key_id: key_id.clone(),
            principal: principal.clone(),
            reason: reason.clone(),
        },
        P::Unavailable { provider, reason } => P::Unavailable {
            provider: provider.clone(),
            reason: reason.clone(),
        },
        other => P::Unavailable {
            provider: "provider".into(),
            reason: other.to_string(),
        },
    }
}

/// Column kind of an Arrow type, for policy checks.
pub fn column_kind(dt: &DataType) -> ColumnKind {
    match dt {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => ColumnKind::String,
        DataType::Date32 | DataType::Date64 => ColumnKind::Date,
        DataType::Timestamp(..) => ColumnKind::Timestamp,
        DataType::Boolean => ColumnKind::Boolean,
        DataType::List(_) | DataType::LargeList(_) | DataType::Struct(_) | DataType::Map(..) => {
            ColumnKind::Nested
        }
        dt if dt.is_numeric() => ColumnKind::Numeric,
        _ => ColumnKind::Other,
    }
}

/// The table's columns by the names the policy uses: their current names.
fn current_names(inner: &IcebergTableProvider) -> Vec<String> {
    inner
        .schema()
        .fields()
        .iter()
        .map(|f| inner.current_name(f))
        .collect()
}

impl PolicyTableProvider {
    /// Decides every column for the session's principal. Keys of columns the principal
    /// may read are checked with their crypto provider first: a key the provider refuses
    /// (or the KMS lacks) gets the column's `on_missing_key` outcome.
    pub async fn try_new(inner: IcebergTableProvider, access: Arc<SessionAccess>) -> Result<Self> {
        let policy = Arc::clone(access.policy());
        let table = inner.name().to_owned();
        let principal = access.principal().to_owned();
        let (table_decision, rule) = policy.table_access(&principal, &table);
        if rule == RuleSource::UnknownPrincipal {
            let e = Error::UnknownPrincipal {
                table: table.clone(),
                principal,
                policy: policy.source().to_owned(),
            };
            access.record(TableAccess {
                row_filter: None,
                write: None,
                table,
                snapshot_id: inner.snapshot().map(|s| s.snapshot_id()),
                columns: vec![],
                allowed: false,
                error: Some(e.to_string()),
            });
            return Err(e.into());
        }
        let inner_schema = inner.schema();
        // Rules name columns as the table names them now: a snapshot read by time travel
        // may call a column by an older name, which must not escape its rule.
        let policy_names = current_names(&inner);
        // The table's policy with its columns' tags resolved (keys, providers, writers).
        let tpol = policy.table_policy(&table, policy_names.iter().map(String::as_str));
        let tpol = tpol.as_deref();
        // Which provider protects which key: the column's, else the table's, else local.
        let table_provider = tpol
            .map_or(clearice_policy::LOCAL_PROVIDER, |t| t.default_provider())
            .to_owned();
        let routes = tpol.map(|t| t.key_providers()).unwrap_or_default();
        let crypto = access.providers().routed(&table_provider, &routes);
        let context = CallContext {
            principal: principal.clone(),
            file: String::new(),
            application: inner.application_context(),
            credential: access.credential().cloned(),
        };
        // A table Iceberg encrypts itself: every column is under its table key, so a
        // column no rule matches is denied (as any protected column), and the key is
        // needed for any read (the manifests are under it too).
        let native_key = inner.table_key_id().map(str::to_owned);
        let mut native_denial = None;
        let decided: Vec<Resolved> = policy_names
            .iter()
            .map(|n| {
                let r = policy.decide(&principal, &table, n);
                if native_key.is_some() && r.rule == RuleSource::DefaultUnprotected {
                    Resolved {
                        decision: Decision::Deny,
                        rule: RuleSource::DefaultProtected,
                    }
                } else {
                    r
                }
            })
            .collect();
        // A REST catalog's read restrictions for this principal: each column's action
        // with the local rule (the stricter wins, before any key is asked for); what
        // cannot be applied denies the table.
        let (decided, catalog_filter, catalog_denial) =
            match restrictions::load(&inner, &principal).await? {
                restrictions::Outcome::None => (decided, None, None),
                restrictions::Outcome::Deny(why) => (decided, None, Some(why)),
                restrictions::Outcome::Apply(r) => {
                    let decided = decided
                        .into_iter()
                        .enumerate()
                        .map(|(i, local)| match r.columns.get(&i) {
                            None => local,
                            Some((action, d)) => Resolved {
                                decision: local.decision.stricter(d.clone()),
                                rule: RuleSource::Catalog {
                                    action: action.clone(),
                                    local: Box::new(local.rule),
                                },
                            },
                        })
                        .collect();
                    (decided, r.row_filter.map(|f| (f, r.rule)), None)
                }
            };
        let declared = |n: &str| tpol?.columns.get(n)?.master_key.clone();
        if let Some(k) = &native_key {
            if tpol.is_none() && policy.is_enforcing() {
                native_denial = Some(format!(
                    "the policy does not name this table, which Iceberg encrypts under table key '{k}'"
                ));
            }
            if let Some(n) = policy_names
                .iter()
                .find(|n| declared(n).is_some_and(|d| d != *k))
            {
                native_denial = Some(format!(
                    "the policy declares master_key '{}' for column '{n}', but Iceberg encrypts the table under table key '{k}'",
                    declared(n).unwrap_or_default()
                ));
            }
        }
        let master_key_of = |n: &str| declared(n).or_else(|| native_key.clone());
        let mut wanted: BTreeSet<String> = inner_schema
            .fields()
            .iter()
            .zip(&decided)
            .zip(&policy_names)
            .filter(|((_, r), _)| r.decision.needs_value())
            .filter_map(|(_, n)| master_key_of(n))
            .collect();
        wanted.extend(native_key.clone());
        let wanted: Vec<String> = wanted.into_iter().collect();
        // Ask each provider about its keys; one that cannot answer fails only the scans
        // that need its keys.
        let mut by_provider: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for k in &wanted {
            let p = routes.get(k).unwrap_or(&table_provider);
            by_provider.entry(p.as_str()).or_default().push(k.clone());
        }
        let mut key_access = BTreeMap::new();
        let mut provider_failure = None;
        for (name, keys) in by_provider {
            let provider = access
                .providers()
                .get(name)
                .unwrap_or_else(|| access.providers().local());
            match provider.check_access(&context, &keys).await {
                Ok(a) => key_access.extend(a),
                Err(e) => provider_failure = Some((keys.into_iter().collect::<BTreeSet<_>>(), e)),
            }
        }
        let mut columns = Vec::new();
        let mut protected_keys = Vec::new();
        for ((i, f), mut resolved) in inner_schema.fields().iter().enumerate().zip(decided) {
            let pname = &policy_names[i];
            let cpol = tpol.and_then(|t| t.columns.get(pname));
            let master_key = master_key_of(pname);
            protected_keys.push(master_key.clone());
            // on_missing_key: the KMS lacks the key a value-reading rule needs, or the
            // key's provider refuses it to this principal.
            if resolved.decision.needs_value()
                && let Some(k) = &master_key
                && let Some(answer) = key_access.get(k)
                && *answer != KeyAccess::Granted
            {
                let rule = match answer {
                    KeyAccess::Denied => RuleSource::ProviderDenied {
                        provider: routes.get(k).unwrap_or(&table_provider).clone(),
                        key: k.clone(),
                    },
                    _ => RuleSource::MissingKey(k.clone()),
                };
                let fallback = match policy.on_missing_key(&table, pname) {
                    // A missing key fails when read (the KMS names it); a refusal is a
                    // denial of the column.
                    MissingKey::Error if *answer == KeyAccess::Denied => Some(Decision::Deny),
                    MissingKey::Error => None,
                    MissingKey::Null => Some(Decision::Mask(Mask::Null)),
                    MissingKey::Fixed => Some(Decision::Mask(Mask::Fixed(None))),
                    MissingKey::Hide => Some(Decision::Hide),
                };
                if let Some(d) = fallback {
                    resolved = Resolved { decision: d, rule };
                }
            }
            let field = match &resolved.decision {
                Decision::Hide => continue,
                Decision::Mask(m) => {
                    mask::check(m, f.name(), f.data_type())?;
                    let dt = mask::output_type(m, f.data_type());
                    let nullable = f.is_nullable() || matches!(m, Mask::Null);
                    Arc::new(Field::new(f.name(), dt, nullable).with_metadata(f.metadata().clone()))
                }
                _ => Arc::clone(f),
            };
            columns.push(VisibleColumn {
                field,
                inner: i,
                resolved,
                master_key,
                named: cpol.is_some(),
            });
        }
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Arc::clone(&c.field))
                .collect::<Vec<_>>(),
        ));
        // The table key of a table Iceberg encrypts itself: refused (or missing) is the
        // whole table's outcome, naming the key.
        if let Some(k) = &native_key
            && native_denial.is_none()
        {
            let provider = routes.get(k).unwrap_or(&table_provider);
            native_denial = match key_access.get(k) {
                Some(KeyAccess::Granted) => None,
                Some(KeyAccess::Denied) => Some(format!(
                    "crypto provider '{provider}' refuses table key '{k}' (the table is encrypted by Iceberg under it)"
                )),
                Some(KeyAccess::Unknown) => Some(format!(
                    "the KMS does not have table key '{k}' (the table is encrypted by Iceberg under it)"
                )),
                None => provider_failure
                    .as_ref()
                    .filter(|(keys, _)| keys.contains(k))
                    .map(|(_, e)| format!("table key '{k}' cannot be checked: {e}")),
            };
        }
        // A denied table keeps its schema (DESCRIBE, information_schema) but any scan fails.
        let denied = match native_denial {
            Some(reason) if table_decision == TableDecision::Allow => Some(Error::TableDenied {
                table: table.clone(),
                principal: principal.clone(),
                rule: reason,
            }),
            _ => (table_decision != TableDecision::Allow).then(|| Error::TableDenied {
                table: table.clone(),
                principal: principal.clone(),
                rule: rule.to_string(),
            }),
        };
        let denied = denied.or_else(|| {
            catalog_denial.map(|rule| Error::TableDenied {
                table: table.clone(),
                principal: principal.clone(),
                rule,
            })
        });
        // A row filter that does not parse denies the table (fail closed); the catalog's
        // required row filter must hold too.
        let (row_filter, denied) = match row_filter::bind(&policy, &principal, &table) {
            Ok(f) => {
                let f = match catalog_filter {
                    Some((c, rule)) => Some(row_filter::BoundRowFilter::with_catalog(f, c, &rule)),
                    None => f,
                };
                (f.filter(|f| !f.is_all_rows()), denied)
            }
            Err(rule) => (
                None,
                denied.or(Some(Error::TableDenied {
                    table: table.clone(),
                    principal: principal.clone(),
                    rule,
                })),
            ),
        };
        let provider_route = ProviderRoute {
            name: table_provider,
            routes: routes.into_iter().collect(),
        };
        // A table key a crypto provider keeps is unwrapped by it, for this principal.
        let inner = crate::table_keys::bind_table_key(inner, &provider_route, &crypto, context)?;
        Ok(Self {
            inner,
            access,
            schema,
            columns,
            protected_keys,
            denied,
            crypto,
            provider_failure,
            provider_route,
            row_filter,
        })
    }

    /// A copy of the table's denial for this principal, if the table is denied.
    fn denial(&self) -> Option<Error> {
        match &self.denied {
            Some(Error::TableDenied {
                table,
                principal,
                rule,
            }) => Some(Error::TableDenied {
                table: table.clone(),
                principal: principal.clone(),
                rule: rule.clone(),
            }),
            _ => None,
        }
    }

    /// The Iceberg table under the policy.
    pub fn inner(&self) -> &IcebergTableProvider {
        &self.inner
    }

    /// Fails (audited) if the whole table is denied to the principal.
    pub fn check_readable(&self, table: &str) -> Result<()> {
        let under_filter = self.row_filter.as_ref().map(|f| Error::TableDenied {
            table: table.to_owned(),
            principal: self.access.principal().to_owned(),
            rule: format!(
                "its metadata tables count rows outside the {} that applies to the principal",
                f.rule
            ),
        });
        if let Some(e) = self.denial().or(under_filter) {
            self.access.record(TableAccess {
                row_filter: None,
                write: None,
                table: table.to_owned(),
                snapshot_id: self.inner.snapshot().map(|s| s.snapshot_id()),
                columns: vec![],
                allowed: false,
                error: Some(e.to_string()),
            });
            return Err(e.into());
        }
        Ok(())
    }

    /// Whether the principal may read column `name` in plaintext.
    pub fn is_plaintext(&self, name: &str) -> bool {
        self.columns
            .iter()
            .any(|c| c.field.name() == name && c.resolved.decision == Decision::Plaintext)
    }

    /// Columns of `projection` the principal sees through a mask (values a write must not
    /// copy into a table).
    pub fn masked_columns(&self, projection: Option<&[usize]>) -> Vec<String> {
        self.projected(projection)
            .filter(|c| matches!(c.resolved.decision, Decision::Mask(_)))
            .map(|c| c.field.name().clone())
            .collect()
    }

    /// Restricted columns of `projection` the principal reads in plaintext: encrypted
    /// ones, and every column the policy names (its rules restrict someone, encrypted or
    /// not). What `COPY ... TO`, or a copy into another table, would publish.
    pub fn decrypted_columns(&self, projection: Option<&[usize]>) -> Vec<String> {
        self.projected(projection)
            .filter(|c| {
                (c.master_key.is_some() || c.named) && c.resolved.decision == Decision::Plaintext
            })
            .map(|c| c.field.name().clone())
            .collect()
    }

    /// Whether the principal may export this table's decrypted columns (`export`).
    pub fn may_export(&self) -> bool {
        self.access
            .policy()
            .may_export(self.access.principal(), self.inner.name())
    }

    /// The principal.
    pub fn principal(&self) -> &str {
        self.access.principal()
    }

    fn projected<'a>(
        &'a self,
        projection: Option<&'a [usize]>,
    ) -> Box<dyn Iterator<Item = &'a VisibleColumn> + 'a> {
        match projection {
            Some(p) => Box::new(p.iter().filter_map(|i| self.columns.get(*i))),
            None => Box::new(self.columns.iter()),
        }
    }

    /// The master key the policy declares for each of the inner columns `columns`, by
    /// field id and by name (files without field ids).
    fn column_keys(&self, columns: impl Iterator<Item = usize>) -> ColumnKeys {
        let schema = self.inner.table_schema();
        let mut keys = ColumnKeys::default();
        for i in columns {
            let Some(key) = self.protected_keys.get(i).cloned().flatten() else {
                continue;
            };
            let field = schema.field(i);
            if let Some(id) = clearice_iceberg::field_id::field_id(field) {
                keys.by_field_id.insert(id, key.clone());
            }
            keys.by_name.insert(field.name().clone(), key);
        }
        keys
    }

    /// Fails (audited) if the table is denied to the principal, or one of `projected` is.
    fn admit_read(&self, projected: &[&VisibleColumn]) -> Result<()> {
        let table = self.inner.name().to_owned();
        let refuse = |e: Error| -> DataFusionError {
            self.access.record(TableAccess {
                row_filter: None,
                write: None,
                table: table.clone(),
                snapshot_id: self.inner.snapshot().map(|s| s.snapshot_id()),
                columns: self.audit_columns(projected),
                allowed: false,
                error: Some(e.to_string()),
            });
            e.into()
        };
        if let Some(e) = self.denial() {
            return Err(refuse(e));
        }
        if let Some(c) = projected
            .iter()
            .find(|c| c.resolved.decision == Decision::Deny)
        {
            return Err(refuse(Error::ColumnDenied {
                table: table.clone(),
                column: c.field.name().clone(),
                principal: self.access.principal().to_owned(),
                rule: c.resolved.rule.to_string(),
            }));
        }
        Ok(())
    }

    /// Fails (audited) if the statement names a column (by index in [`Self::schema`]) or
    /// reads a table the principal is denied, whether or not the optimizer would keep the
    /// column in the scan: a denial depends on what the statement says, never on what
    /// DataFusion proves it can skip.
    pub fn check_named(&self, columns: &BTreeSet<usize>) -> Result<()> {
        let named: Vec<&VisibleColumn> = columns
            .iter()
            .filter_map(|i| self.columns.get(*i))
            .collect();
        self.admit_read(&named)
    }

    fn audit_columns(&self, cols: &[&VisibleColumn]) -> Vec<AuditColumn> {
        cols.iter()
            .map(|c| AuditColumn {
                name: c.field.name().clone(),
                decision: c.resolved.decision.to_string(),
                rule: c.resolved.rule.to_string(),
                decrypted: c.resolved.decision.needs_value() && c.master_key.is_some(),
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl TableProvider for PolicyTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    // DELETE and UPDATE are planned by `crate::row_level` from the statement as written;
    // DataFusion's DML planner hands over filters taken from the optimized plan (where a
    // subquery's predicate is gone), so a plan that reaches these is refused.
    async fn delete_from(
        &self,
        _state: &dyn Session,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.not_gated("DELETE"))
    }

    async fn update(
        &self,
        _state: &dyn Session,
        _assignments: Vec<(String, Expr)>,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.not_gated("UPDATE"))
    }

    async fn truncate(&self, state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        let target = self.check_row_level("truncate", &[])?;
        clearice_iceberg::dml::IcebergRowLevelExec::try_new(
            state,
            Arc::new(target),
            clearice_iceberg::dml::RowLevel::Delete,
            vec![],
        )
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: datafusion::logical_expr::dml::InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        use datafusion::logical_expr::dml::InsertOp;
        let action = match insert_op {
            InsertOp::Append => "insert",
            InsertOp::Overwrite => "insert_overwrite",
            InsertOp::Replace => {
                return Err(Error::Unsupported {
                    table: self.inner.name().to_owned(),
                    what: "REPLACE INTO (Iceberg tables have no primary key; use MERGE INTO)"
                        .into(),
                }
                .into());
            }
        };
        let target = if insert_op == InsertOp::Overwrite {
            self.check_row_level(action, &[])?
        } else {
            self.admit(self.write_target(action)?)
        };
        // Under a row filter every row written must pass it.
        let input = self.check_inserted_rows(input)?;
        Ok(Arc::new(clearice_iceberg::dml::IcebergWriteExec::new(
            input,
            Arc::new(target),
            insert_op == InsertOp::Overwrite,
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Only filters on plaintext columns may reach the scan (file pruning, row
        // filters); anything touching a masked column runs above the mask. Under a row
        // filter nothing does: a predicate must not see a row outside it.
        if self.row_filter.is_some() {
            return Ok(vec![
                TableProviderFilterPushDown::Unsupported;
                filters.len()
            ]);
        }
        Ok(filters
            .iter()
            .map(|f| {
                let cols = f.column_refs();
                if cols.iter().all(|c| self.is_plaintext(&c.name)) {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = self.inner.name().to_owned();
        let principal = self.access.principal();
        let projected: Vec<&VisibleColumn> = match projection {
            Some(p) => p.iter().map(|i| &self.columns[*i]).collect(),
            None => self.columns.iter().collect(),
        };
        self.admit_read(&projected)?;
        if let Some((keys, e)) = &self.provider_failure
            && projected.iter().any(|c| {
                c.resolved.decision.needs_value()
                    && c.master_key.as_ref().is_some_and(|k| keys.contains(k))
            })
        {
            let e = Error::Provider {
                table: table.clone(),
                source: Box::new(copy_failure(e)),
            };
            self.access.record(TableAccess {
                row_filter: None,
                write: None,
                table,
                snapshot_id: self.inner.snapshot().map(|s| s.snapshot_id()),
                columns: self.audit_columns(&projected),
                allowed: false,
                error: Some(e.to_string()),
            });
            return Err(e.into());
        }
        self.access.record(TableAccess {
            row_filter: self.row_filter.as_ref().map(|f| f.describe()),
            write: None,
            table: table.clone(),
            snapshot_id: self.inner.snapshot().map(|s| s.snapshot_id()),
            columns: self.audit_columns(&projected),
            allowed: true,
            error: None,
        });
        // Inner columns needed: those whose values are shown or masked from the value.
        let mut inner_cols: Vec<usize> = projected
            .iter()
            .filter(|c| c.resolved.decision.needs_value())
            .map(|c| c.inner)
            .collect();
        inner_cols.sort_unstable();
        inner_cols.dedup();
        // Under a row filter the scan also reads the columns the filter needs, and takes
        // neither the statement's predicates nor its limit.
        let (scan_cols, row_filter) = match &self.row_filter {
            Some(f) => {
                let (cols, plan) = self.plan_row_filter(f, &inner_cols)?;
                (cols, Some(plan))
            }
            None => (inner_cols.clone(), None),
        };
        let (filters, limit) = match row_filter {
            Some(_) => (&[][..], None),
            None => (filters, limit),
        };
        // Keys: fail closed. Only the master keys the policy declares for the columns
        // this scan reads may be requested (and the footer key); a column encrypted
        // under any other key (a table or column the policy does not name) stays
        // encrypted, and reading it fails naming the key.
        // Each key is bound to the column it is declared for: a column the policy does
        // not declare, encrypted under the key of one it does, stays encrypted.
        let scope = if self.access.policy().is_enforcing() {
            KeyScope::Columns(self.column_keys(scan_cols.iter().copied()))
        } else {
            KeyScope::All
        };
        let all_plaintext = projected
            .iter()
            .all(|c| c.resolved.decision == Decision::Plaintext);
        // Scale-out: workers plan the same scan again (their own KMS), given the key scope
        // and masks decided here; a principal's own provider token goes with it, sealed
        // for the cluster (clearice-cluster's wire).
        let distribute = state
            .config()
            .get_extension::<DistributeScans>()
            .filter(|_| row_filter.is_none());
        // Statistics in the plan (and `EXPLAIN`): of the columns shown in plaintext only,
        // and none under a row filter (not even the table's row count).
        // A coordinator reads no footer: its workers hold the keys.
        let shown = if row_filter.is_some() {
            Shown::Nothing
        } else if distribute.is_some() {
            Shown::RowCounts
        } else {
            Shown::Columns(Arc::new(
                projected
                    .iter()
                    .filter(|c| c.resolved.decision == Decision::Plaintext)
                    .map(|c| c.inner)
                    .collect(),
            ))
        };
        let inner = match &distribute {
            Some(d) => self.inner.clone().split_into(d.partitions),
            None => self.inner.clone(),
        }
        .with_shown_statistics(shown);
        let grant = self.grant().with_scope(scope);
        // The filters go to the Parquet reader when a mask above blocks DataFusion's own
        // pushdown, and for workers: the leaf they get takes no pushdown either, so row
        // groups are pruned only if the scan has the predicate from the start.
        let set_predicate = !all_plaintext || distribute.is_some();
        let mut inner_plan = inner
            .scan_with(
                state,
                Some(&scan_cols),
                filters,
                limit,
                grant.clone(),
                set_predicate,
            )
            .await?;
        if let Some(f) = row_filter {
            inner_plan = f.apply(inner_plan)?;
        }
        let out_schema = project_schema(&self.schema, projection)?;
        let outputs: Vec<MaskOutput> = projected
            .iter()
            .map(|c| MaskOutput {
                name: c.field.name().clone(),
                decision: c.resolved.decision.clone(),
                input: inner_cols
                    .binary_search(&c.inner)
                    .ok()
                    .filter(|_| c.resolved.decision.needs_value()),
                data_type: c.field.data_type().clone(),
            })
            .collect();
        // Same fields, same order when all are plaintext: the inner scan is the answer.
        let plan: Arc<dyn ExecutionPlan> = if all_plaintext {
            inner_plan
        } else {
            Arc::new(PolicyMaskExec::new(
                inner_plan,
                outputs.clone(),
                Arc::clone(&out_schema),
                principal.to_owned(),
                self.access.mask_key().cloned(),
            ))
        };
        if distribute.is_none() {
            return Ok(plan);
        }
        let ident = self.inner.table().identifier();
        let namespace = ident.namespace().clone().inner();
        let suffix = format!(".{}.{}", namespace.join("."), ident.name());
        let request = ScanRequest {
            catalog: table.strip_suffix(&suffix).unwrap_or(&table).to_owned(),
            namespace,
            table: ident.name().to_owned(),
            snapshot_id: inner.snapshot().map(|s| s.snapshot_id()),
            travel: inner.travelled().is_some(),
            table_fields: inner
                .table_schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
            projection: inner_cols,
            filters: filters.to_vec(),
            limit,
            set_predicate,
            grant,
            mask_key_check: outputs
                .iter()
                .any(|o| o.decision == Decision::Mask(Mask::HmacSha256))
                .then(|| self.access.mask_key().map(|k| k.check().to_owned()))
                .flatten(),
            masks: (!all_plaintext).then_some(outputs),
            partitions: plan.properties().output_partitioning().partition_count(),
            // The masked schema, or the inner scan's (its column order) when plaintext.
            schema: plan.schema(),
        };
        Ok(Arc::new(RemoteScanExec::planned(request, plan)))
    }
}

/// Whether `e` is a NULL literal (through casts and aliases): what DataFusion plans for a
/// column an INSERT does not name.
fn is_null_literal(e: &Expr) -> bool {
    match e {
        Expr::Literal(v, _) => v.is_null(),
        Expr::Alias(a) => is_null_literal(&a.expr),
        Expr::Cast(c) => is_null_literal(&c.expr),
        Expr::TryCast(c) => is_null_literal(&c.expr),
        _ => false,
    }
}
