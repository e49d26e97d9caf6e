//! The write side of [`PolicyTableProvider`]: who may write the table, what its writes
//! must leave NULL, how its files are encrypted, and the checks a row-level write passes
//! before any work.

use std::collections::BTreeMap;
use std::sync::Arc;

use clearice_crypto::{CallContext, KeyScope, ScanGrant};
use datafusion::catalog::TableProvider;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;

use super::{PolicyTableProvider, is_null_literal};
use crate::access::TableAccess;
use clearice_iceberg::Error;

impl PolicyTableProvider {
    /// What a write by this principal needs: table write permission (refused here,
    /// audited, before anything is written), the policy's encryption of the table's
    /// files, the KMS and the providers holding column keys. Not recorded as allowed
    /// until it is admitted.
    pub fn write_target(&self, action: &str) -> Result<clearice_iceberg::dml::WriteTarget> {
        let table = self.inner.name().to_owned();
        let policy = self.access.policy();
        let principal = self.access.principal();
        let audit = clearice_iceberg::WriteAudit::new(action);
        let refuse = |e: Error| -> DataFusionError {
            self.access.record(TableAccess {
                row_filter: None,
                table: table.clone(),
                snapshot_id: None,
                columns: vec![],
                allowed: false,
                error: Some(e.to_string()),
                write: Some(audit.clone()),
            });
            e.into()
        };
        if !policy.is_known(principal) || !policy.may_write_table(principal, &table) {
            return Err(refuse(Error::WriteDenied {
                what: format!("{action} on table '{table}'"),
                principal: principal.to_owned(),
                rule: match policy.table(&table).and_then(|t| t.write.as_ref()) {
                    Some(_) => "not in the table's `write` list".into(),
                    None => "the table has no `write` list and the principal is not in `[writes] create`".into(),
                },
            }));
        }
        self.inner.check_writable(action).map_err(refuse)?;
        // Under a row filter: INSERT (each row must pass it), DELETE and UPDATE (of the
        // rows it shows) only; the others would touch rows the principal does not see.
        if let Some(f) = &self.row_filter
            && !matches!(action, "insert" | "delete" | "update")
        {
            return Err(refuse(Error::WriteDenied {
                what: format!("{action} on table '{table}'"),
                principal: principal.to_owned(),
                rule: format!(
                    "the principal reads it under a row filter ({}); under a row filter only INSERT, UPDATE and DELETE are supported",
                    f.rule
                ),
            }));
        }
        let gate = self.row_gate()?;
        // A table Iceberg encrypts is written under its table key: the table-level denial
        // (not named by the policy, another declared key, the key refused) holds for
        // writes too.
        if self.inner.table_key_id().is_some()
            && let Some(e) = self.denial()
        {
            return Err(refuse(e));
        }
        if let Some(as_of) = self.inner.travelled() {
            return Err(refuse(Error::InvalidWrite {
                table: table.clone(),
                reason: format!("a table named as of {as_of} cannot be written"),
            }));
        }
        let Some(catalog) = self.inner.catalog() else {
            return Err(refuse(Error::Unsupported {
                table: table.clone(),
                what: "writing a table loaded outside a catalog".into(),
            }));
        };
        // With the tags of its columns resolved: a tagged column is encrypted under its
        // tag's key.
        let names = super::current_names(&self.inner);
        let tpol = policy.table_policy(&table, names.iter().map(String::as_str));
        let tpol = tpol.as_deref();
        // Files written sorted or partitioned by a protected column would give its order
        // or values to every reader. Not protected: a column everyone reads in plaintext
        // that is not encrypted at rest under its own key (a table Iceberg encrypts puts
        // partition values in its paths, as Iceberg Java does).
        let native = self.inner.table_key_id().is_some();
        if let Some(t) = tpol {
            let m = self.inner.table().metadata();
            let schema = m.current_schema();
            let sources = m
                .default_sort_order()
                .fields
                .iter()
                .map(|f| f.source_id)
                .chain(
                    m.default_partition_spec()
                        .fields()
                        .iter()
                        .map(|f| f.source_id),
                );
            for id in sources {
                if let Some(f) = schema.field_by_id(id)
                    && let Some(c) = t.columns.get(&f.name)
                    && !(c.plaintext_to_everyone() && (native || c.master_key.is_none()))
                {
                    return Err(refuse(Error::WriteDenied {
                        what: format!(
                            "{action} on table '{table}', which is sorted or partitioned by protected column '{}'",
                            f.name
                        ),
                        principal: principal.to_owned(),
                        rule: "row order, partition values and paths are visible to every reader"
                            .into(),
                    }));
                }
            }
        }
        let spec = tpol
            .map(crate::encryption::encryption_spec)
            .unwrap_or_default();
        // Columns whose master key a crypto provider holds are encrypted by it.
        let mut by_master_key = BTreeMap::new();
        for (key, provider) in tpol.map(|t| t.key_providers()).unwrap_or_default() {
            if provider != clearice_policy::LOCAL_PROVIDER
                && let Some(p) = self.access.providers().get(&provider)
            {
                by_master_key.insert(key, Arc::clone(p));
            }
        }
        // Protected columns this principal may not write: the statement must leave them
        // NULL (checked on the plan, and again on every row written).
        let must_be_null = self
            .inner
            .schema()
            .fields()
            .iter()
            .map(|f| self.inner.current_name(f))
            .filter(|n| {
                if self.inner.table_key_id().is_some() {
                    !policy.may_write_encrypted_column(principal, &table, n)
                } else {
                    !policy.may_write_column(principal, &table, n)
                }
            })
            .collect();
        Ok(clearice_iceberg::dml::WriteTarget {
            name: table,
            catalog: Arc::clone(catalog),
            table: self.inner.table().clone(),
            spec,
            kms: self.access.resolver().kms().cloned(),
            providers: clearice_iceberg::write::WriteProviders {
                by_master_key,
                context: CallContext {
                    principal: principal.to_owned(),
                    file: String::new(),
                    application: self.inner.application_context(),
                    credential: self.access.credential().cloned(),
                },
            },
            must_be_null,
            audit,
            source: self.inner.clone(),
            grant: self.grant(),
            gate,
        })
    }

    /// Records the write as allowed (once every check passed); its outcome is filled in
    /// when it commits.
    pub(super) fn admit(
        &self,
        target: clearice_iceberg::dml::WriteTarget,
    ) -> clearice_iceberg::dml::WriteTarget {
        self.access.record(TableAccess {
            row_filter: self.row_filter.as_ref().map(|f| f.describe()),
            table: target.name.clone(),
            snapshot_id: None,
            columns: self.audit_columns(&self.columns.iter().collect::<Vec<_>>()),
            allowed: true,
            error: None,
            write: Some(target.audit.clone()),
        });
        target
    }

    /// Checks a row-level write (DELETE, UPDATE, INSERT OVERWRITE) before it runs:
    /// it rewrites whole data files, so the principal must be allowed to write every
    /// protected column; and its conditions and new values may use only columns the
    /// principal reads in plaintext (else the count of rows changed would reveal values
    /// the principal may not see).
    pub(crate) fn check_row_level(
        &self,
        action: &str,
        exprs: &[&Expr],
    ) -> Result<clearice_iceberg::dml::WriteTarget> {
        let columns: Vec<String> = exprs
            .iter()
            .flat_map(|e| e.column_refs())
            .map(|c| c.name.clone())
            .collect();
        self.check_row_level_columns(action, &columns)
    }

    /// A row-level write that did not come through the statement gate (e.g. under
    /// `EXPLAIN`).
    pub(super) fn not_gated(&self, op: &str) -> DataFusionError {
        Error::NotExact {
            table: self.inner.name().to_owned(),
            statement: op.to_owned(),
            reason: format!(
                "{op} inside another statement (EXPLAIN, PREPARE ... EXECUTE) is not supported; run the {op} itself"
            ),
        }
        .into()
    }

    /// [`Self::check_row_level`] for the target columns (`columns`) a statement uses.
    pub(crate) fn check_row_level_columns(
        &self,
        action: &str,
        columns: &[String],
    ) -> Result<clearice_iceberg::dml::WriteTarget> {
        let target = self.write_target(action)?;
        let table = self.inner.name();
        let principal = self.access.principal();
        // Said before any work: the catalog cannot take the commit.
        if let Some(clearice_iceberg::commit::Committer::Unsupported { reason }) =
            self.inner.committer()
        {
            return Err(Error::Unsupported {
                table: table.to_owned(),
                what: format!("{action} (which removes data files; {reason})"),
            }
            .into());
        }
        let refuse = |what: String, rule: &str| -> DataFusionError {
            let e = Error::WriteDenied {
                what,
                principal: principal.to_owned(),
                rule: rule.to_owned(),
            };
            self.access.record(TableAccess {
                row_filter: None,
                table: table.to_owned(),
                snapshot_id: None,
                columns: vec![],
                allowed: false,
                error: Some(e.to_string()),
                write: Some(target.audit.clone()),
            });
            e.into()
        };
        if let Some(c) = target.must_be_null.first() {
            return Err(refuse(
                format!(
                    "{action} on table '{table}' rewrites its data files, protected column '{c}' included"
                ),
                "row-level writes need the principal in the `write` list of every protected column",
            ));
        }
        for c in columns {
            if !self.is_plaintext(c) {
                return Err(refuse(
                    format!(
                        "{action} on table '{table}' uses column '{c}', which the principal does not read in plaintext"
                    ),
                    "conditions and values of a write use only columns read in plaintext",
                ));
            }
        }
        Ok(self.admit(target))
    }

    /// What this principal's scans of the table may decrypt, and as whom: the keys the
    /// policy declares for its columns, the provider, token and AAD prefix. A scan narrows
    /// the scope to the columns it reads ([`ScanGrant::with_scope`]).
    pub(crate) fn grant(&self) -> ScanGrant {
        ScanGrant {
            principal: self.access.principal().to_owned(),
            aad_prefix: self
                .access
                .policy()
                .table(self.inner.name())
                .and_then(|t| t.aad_prefix.as_ref())
                .map(|p| p.as_bytes().to_vec()),
            route: Some(self.provider_route.clone()),
            provider: Some(Arc::clone(&self.crypto)),
            credential: self.access.credential().cloned(),
            // A rewrite decrypts the columns it rewrites under the keys the policy
            // declares for this table, and no others (fail closed, as scans).
            scope: if self.access.policy().is_enforcing() {
                KeyScope::Columns(self.column_keys(0..self.protected_keys.len()))
            } else {
                KeyScope::All
            },
            column_keys: self
                .inner
                .schema()
                .fields()
                .iter()
                .zip(&self.protected_keys)
                .filter_map(|(f, k)| Some((f.name().clone(), k.clone()?)))
                .collect(),
        }
    }

    /// Refuses an INSERT whose values (`exprs`, one per column of [`TableProvider::schema`]
    /// in order, as DataFusion plans them) put anything but NULL into a protected column
    /// the principal may not write.
    pub fn check_insert(&self, exprs: &[Expr]) -> Result<()> {
        let table = self.inner.name();
        let policy = self.access.policy();
        let principal = self.access.principal();
        for (c, e) in self.columns.iter().zip(exprs) {
            let name = self
                .inner
                .current_name(&self.inner.schema().fields()[c.inner]);
            if policy.may_write_column(principal, table, &name) || is_null_literal(e) {
                continue;
            }
            let e = Error::WriteDenied {
                what: format!("column '{name}' of table '{table}' may not be written"),
                principal: principal.to_owned(),
                rule: "a protected column is written only by its `write` list".into(),
            };
            self.access.record(TableAccess {
                row_filter: None,
                table: table.to_owned(),
                snapshot_id: None,
                columns: self.audit_columns(&[c]),
                allowed: false,
                error: Some(e.to_string()),
                write: Some(clearice_iceberg::WriteAudit::new("insert")),
            });
            return Err(e.into());
        }
        Ok(())
    }
}
