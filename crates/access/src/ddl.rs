//! Catalog changes through SQL (`CREATE SCHEMA`, `DROP SCHEMA`, `CREATE TABLE` with
//! columns or `AS SELECT`, `DROP TABLE`, `ALTER TABLE`) under the policy's write rules
//! (`[writes] create`, a table's `write`): a refused or hidden table answers exactly as a
//! missing one. The Iceberg side (partition specs, compatible types) is
//! [`clearice_iceberg::ddl`].

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema as ArrowSchema;
use datafusion::error::{DataFusionError, Result};
use iceberg::spec::{Transform, UnboundPartitionSpec};
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use clearice_iceberg::ddl::{
    AlterColumn, PartitionTerm, iceberg_compatible, iceberg_compatible_type,
};
use clearice_iceberg::{Error, IcebergCatalogProvider, WriteAudit};

use crate::access::{SessionAccess, TableAccess};

/// Catalog changes of one session, checked against the policy and audited.
pub struct Ddl<'a> {
    /// The Iceberg catalog changed.
    pub catalog: &'a IcebergCatalogProvider,
    /// Who asks.
    pub access: &'a SessionAccess,
}

fn namespace(ns: &str) -> NamespaceIdent {
    NamespaceIdent::from_vec(ns.split('.').map(str::to_owned).collect())
        .unwrap_or_else(|_| NamespaceIdent::new(ns.to_owned()))
}

impl Ddl<'_> {
    fn record(&self, target: &str, action: &str, error: Option<String>) -> WriteAudit {
        let audit = WriteAudit::new(action);
        if error.is_none() {
            audit.committed(None, 0);
        }
        self.access.record(TableAccess {
            row_filter: None,
            table: target.to_owned(),
            snapshot_id: None,
            columns: vec![],
            allowed: error.is_none(),
            error,
            write: Some(audit.clone()),
        });
        audit
    }

    fn iceberg_err(&self, target: &str, source: iceberg::Error) -> DataFusionError {
        Error::Iceberg {
            table: target.to_owned(),
            source: Box::new(source),
        }
        .into()
    }

    /// Whether the policy hides table `target` from the principal: DDL then answers as
    /// for a table that does not exist, so its existence does not show.
    fn hidden(&self, target: &str) -> bool {
        self.access
            .policy()
            .table_access(self.access.principal(), target)
            .0
            == clearice_policy::TableDecision::Hide
    }

    /// Refuses (audited) unless the principal may create and drop schemas and tables.
    fn check_create(&self, target: &str, action: &str) -> Result<()> {
        let principal = self.access.principal();
        let allowed = self.access.policy().may_create(principal);
        self.check(
            target,
            action,
            allowed,
            "not in the policy's `[writes] create`",
        )
    }

    /// Refuses (audited) unless the principal may change table `target`.
    fn check_table_write(&self, target: &str, action: &str) -> Result<()> {
        let principal = self.access.principal();
        let allowed = self.access.policy().may_write_table(principal, target);
        self.check(target, action, allowed, TABLE_WRITE_RULE)
    }

    /// [`Self::check_table_write`] as for a table the policy does not name (what a
    /// table that does not exist answers; a hidden table answers the same).
    fn check_missing(&self, target: &str, action: &str) -> Result<()> {
        let allowed = self.access.policy().may_create(self.access.principal());
        self.check(target, action, allowed, TABLE_WRITE_RULE)
    }

    /// `action` on `target` if `allowed` by the policy (and the principal is one of its
    /// users), else a refusal naming `rule`, audited.
    fn check(&self, target: &str, action: &str, allowed: bool, rule: &str) -> Result<()> {
        if allowed && self.access.policy().is_known(self.access.principal()) {
            return Ok(());
        }
        Err(self.refused(target, action, rule))
    }

    /// A refusal of `action` on `target` naming `rule`, audited.
    fn refused(&self, target: &str, action: &str, rule: &str) -> DataFusionError {
        let e = Error::WriteDenied {
            what: format!("{action} '{target}'"),
            principal: self.access.principal().to_owned(),
            rule: rule.to_owned(),
        };
        self.record(target, action, Some(e.to_string()));
        e.into()
    }

    /// `CREATE SCHEMA [IF NOT EXISTS] catalog.ns`.
    pub async fn create_schema(&self, ns: &str, if_not_exists: bool) -> Result<()> {
        let target = format!("{}.{ns}", self.catalog.name());
        self.check_create(&target, "create_schema")?;
        let ident = namespace(ns);
        let cat = self.catalog.iceberg();
        if cat
            .namespace_exists(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            if if_not_exists {
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "schema '{target}' already exists"
            )));
        }
        cat.create_namespace(&ident, HashMap::new())
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        self.record(&target, "create_schema", None);
        self.catalog.refresh_now().await;
        Ok(())
    }

    /// `DROP SCHEMA [IF EXISTS] catalog.ns [CASCADE]`: with CASCADE, its tables are
    /// dropped first (each needs the principal's write permission).
    pub async fn drop_schema(&self, ns: &str, if_exists: bool, cascade: bool) -> Result<()> {
        let target = format!("{}.{ns}", self.catalog.name());
        self.check_create(&target, "drop_schema")?;
        let ident = namespace(ns);
        let cat = self.catalog.iceberg();
        if !cat
            .namespace_exists(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            if if_exists {
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "schema '{target}' not found"
            )));
        }
        let tables = cat
            .list_tables(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        if !tables.is_empty() && !cascade {
            return Err(DataFusionError::Plan(format!(
                "schema '{target}' is not empty ({} tables); DROP SCHEMA ... CASCADE drops them",
                tables.len()
            )));
        }
        for t in &tables {
            self.drop_table(ns, t.name(), false).await?;
        }
        cat.drop_namespace(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        self.record(&target, "drop_schema", None);
        self.catalog.refresh_now().await;
        Ok(())
    }

    /// A new table's `encryption.key-id` must be a key the local KMS has (or cannot say it
    /// lacks: AWS), or, when the policy routes it to a crypto provider, one that provider
    /// has and grants the creator.
    async fn check_table_key(&self, target: &str, key: &str) -> Result<()> {
        let refuse = |why: String| -> DataFusionError {
            Error::InvalidWrite {
                table: target.to_owned(),
                reason: format!(
                    "{} '{key}': {why}",
                    clearice_iceberg::native::TABLE_KEY_PROPERTY
                ),
            }
            .into()
        };
        // Only SQL catalogs take ClearIce's commits of such tables (and load them back).
        if let clearice_iceberg::commit::Committer::Unsupported { reason } =
            self.catalog.committer()
        {
            return Err(refuse(format!(
                "tables Iceberg encrypts itself are created in SQL catalogs only ({reason})"
            )));
        }
        // Every read of a table the policy does not name is denied (fail closed): such a
        // table would be created for nobody.
        let policy = self.access.policy();
        if policy.is_enforcing() && policy.table(target).is_none() {
            return Err(refuse(format!(
                "the policy does not name table '{target}', so nobody could read it; add [tables.\"{target}\"] with its columns first"
            )));
        }
        let owner = policy
            .table(target)
            .map_or(clearice_policy::LOCAL_PROVIDER.to_owned(), |t| {
                t.key_providers()
                    .remove(key)
                    .unwrap_or_else(|| t.default_provider().to_owned())
            });
        if owner != clearice_policy::LOCAL_PROVIDER {
            let Some(provider) = self.access.providers().get(&owner) else {
                return Err(refuse(format!(
                    "the policy routes it to crypto provider '{owner}', which is not configured ([providers.{owner}])"
                )));
            };
            let ctx = clearice_crypto::CallContext {
                principal: self.access.principal().to_owned(),
                file: String::new(),
                application: [("table".to_owned(), target.to_owned())].into(),
                credential: self.access.credential().cloned(),
            };
            let answer = provider
                .check_access(&ctx, &[key.to_owned()])
                .await
                .map_err(|e| refuse(format!("crypto provider '{owner}' cannot be asked: {e}")))?;
            return match answer.get(key) {
                Some(clearice_crypto::KeyAccess::Granted) => Ok(()),
                Some(clearice_crypto::KeyAccess::Unknown) => Err(refuse(format!(
                    "crypto provider '{owner}' does not have this key"
                ))),
                _ => Err(refuse(format!(
                    "crypto provider '{owner}' refuses this key to '{}'",
                    self.access.principal()
                ))),
            };
        }
        let Some(kms) = self.access.resolver().kms() else {
            return Err(refuse("no KMS is configured ([kms])".into()));
        };
        if kms.has_master_key(key) == Some(false) {
            return Err(refuse(format!(
                "KMS '{}' does not have this key",
                kms.name()
            )));
        }
        Ok(())
    }

    /// `CREATE TABLE catalog.ns.name` with `schema` (`partitioning`: the terms of a
    /// `PARTITIONED BY` clause). Returns `false` if it existed and `if_not_exists` was given.
    pub async fn create_table(
        &self,
        ns: &str,
        name: &str,
        schema: &ArrowSchema,
        partitioning: &[PartitionTerm],
        properties: Vec<(String, String)>,
        if_not_exists: bool,
    ) -> Result<bool> {
        let target = format!("{}.{ns}.{name}", self.catalog.name());
        self.check_create(&target, "create_table")?;
        // Refused whether or not it exists ("already exists" would tell).
        if self.hidden(&target) {
            return Err(self.refused(
                &target,
                "create_table",
                "the policy hides this table name from the principal",
            ));
        }
        let invalid = |reason: String| -> DataFusionError {
            Error::InvalidWrite {
                table: target.clone(),
                reason,
            }
            .into()
        };
        let ident = TableIdent::new(namespace(ns), name.to_owned());
        let cat = self.catalog.iceberg();
        if !cat
            .namespace_exists(ident.namespace())
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            return Err(DataFusionError::Plan(format!(
                "schema '{}.{ns}' not found (CREATE SCHEMA creates it)",
                self.catalog.name()
            )));
        }
        if cat
            .table_exists(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            if if_not_exists {
                return Ok(false);
            }
            return Err(DataFusionError::Plan(format!(
                "table '{target}' already exists"
            )));
        }
        let arrow = iceberg_compatible(schema);
        let ischema = iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(&arrow)
            .map_err(|e| invalid(e.to_string()))?;
        let mut props = HashMap::from([("write.format.default".to_owned(), "parquet".to_owned())]);
        let mut sorted_by = None;
        // Iceberg's own table encryption (format 3): every file under its own key, the
        // keys wrapped by the KMS's table key.
        let table_key = properties
            .iter()
            .find(|(k, _)| k == clearice_iceberg::native::TABLE_KEY_PROPERTY)
            .map(|(_, v)| v.clone());
        if let Some(key) = &table_key {
            self.check_table_key(&target, key).await?;
        }
        // Format 2 unless asked for 3; a table Iceberg encrypts is format 3.
        let mut v3 = table_key.is_some();
        for (k, v) in properties {
            match k.as_str() {
                "format-version" if v == "3" => v3 = true,
                "format-version" if v == "2" && table_key.is_none() => {}
                "format-version" => {
                    return Err(invalid(format!(
                        "format-version {v}: ClearIce creates format 2 and 3 tables, and tables Iceberg encrypts ('{}') in format 3",
                        clearice_iceberg::native::TABLE_KEY_PROPERTY
                    )));
                }
                "write.format.default" if !v.eq_ignore_ascii_case("parquet") => {
                    return Err(invalid(format!(
                        "write.format.default {v}: ClearIce writes Parquet"
                    )));
                }
                // Trino's name: the order rows are written in within each file.
                "sorted_by" => sorted_by = Some(v),
                clearice_iceberg::dml::TARGET_FILE_SIZE
                    if v.parse::<u64>().map_or(true, |n| n == 0) =>
                {
                    return Err(invalid(format!(
                        "{k} must be a positive number of bytes, not '{v}'"
                    )));
                }
                _ => {
                    props.insert(k, v);
                }
            }
        }
        clearice_iceberg::parquet_layout::check(&props).map_err(|e| invalid(e.to_string()))?;
        // Rows sorted, or files partitioned, by a protected column would give its order
        // (or its values, in paths and manifests) to every reader: refused. Not
        // protected: a column everyone reads in plaintext, not encrypted under its own key.
        let protected = |c: &str| {
            self.access
                .policy()
                .column_policy(&target, c)
                .is_some_and(|c| {
                    !(c.plaintext_to_everyone() && (table_key.is_some() || c.master_key.is_none()))
                })
        };
        let layout_columns = sorted_by
            .iter()
            .flat_map(|t| t.split(','))
            .filter_map(|t| t.split_whitespace().next())
            .map(str::to_lowercase)
            .chain(partitioning.iter().map(|t| t.column.clone()));
        for c in layout_columns {
            if protected(&c) {
                return Err(Error::WriteDenied {
                    what: format!(
                        "sorting or partitioning table '{target}' by protected column '{c}'"
                    ),
                    principal: self.access.principal().to_owned(),
                    rule: "row order, partition values and paths are visible to every reader"
                        .into(),
                }
                .into());
            }
        }
        let mut creation = TableCreation::builder()
            .name(name.to_owned())
            .schema(ischema.clone())
            .properties(props)
            .build();
        if v3 {
            creation.format_version = iceberg::spec::FormatVersion::V3;
        }
        if let Some(text) = sorted_by {
            let mut order = iceberg::spec::SortOrder::builder();
            for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                let mut words = term.split_whitespace();
                let c = words.next().unwrap_or_default().to_lowercase();
                let field = ischema.field_by_name(&c).ok_or_else(|| {
                    invalid(format!(
                        "sorted_by names column '{c}', which the table does not have"
                    ))
                })?;
                let mut direction = iceberg::spec::SortDirection::Ascending;
                let mut nulls = iceberg::spec::NullOrder::First;
                for w in words.map(str::to_ascii_uppercase) {
                    match w.as_str() {
                        "ASC" => {}
                        "DESC" => {
                            direction = iceberg::spec::SortDirection::Descending;
                            nulls = iceberg::spec::NullOrder::Last;
                        }
                        "NULLS" => {}
                        "FIRST" => nulls = iceberg::spec::NullOrder::First,
                        "LAST" => nulls = iceberg::spec::NullOrder::Last,
                        other => {
                            return Err(invalid(format!(
                                "sorted_by: unexpected '{other}' in '{term}'"
                            )));
                        }
                    }
                }
                order.with_sort_field(iceberg::spec::SortField {
                    source_id: field.id,
                    transform: Transform::Identity,
                    direction,
                    null_order: nulls,
                });
            }
            creation.sort_order = Some(
                order
                    .with_order_id(1)
                    .build(&ischema)
                    .map_err(|e| invalid(e.to_string()))?,
            );
        }
        if !partitioning.is_empty() {
            let terms = partitioning;
            // The spec id is sent too: Iceberg's REST server requires it.
            let mut spec = UnboundPartitionSpec::builder().with_spec_id(0);
            for t in terms {
                let field = ischema.field_by_name(&t.column).ok_or_else(|| {
                    invalid(format!(
                        "PARTITIONED BY names column '{}', which the table does not have",
                        t.column
                    ))
                })?;
                let pname = match t.transform {
                    Transform::Identity => t.column.clone(),
                    Transform::Bucket(n) => format!("{}_bucket_{n}", t.column),
                    Transform::Truncate(n) => format!("{}_trunc_{n}", t.column),
                    other => format!("{}_{}", t.column, other.to_string().to_lowercase()),
                };
                spec = spec
                    .add_partition_field(field.id, pname, t.transform)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            creation.partition_spec = Some(spec.build());
        }
        // A policy that protects columns this table does not have is a mistake the
        // first write would hit: say it now.
        if let Some(t) = self.access.policy().table(&target) {
            for c in t.columns.keys() {
                if ischema.field_by_name(c).is_none() {
                    return Err(invalid(format!(
                        "the policy protects column '{c}', which the new table does not have"
                    )));
                }
            }
        }
        cat.create_table(ident.namespace(), creation)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        self.record(&target, "create_table", None);
        self.catalog.refresh_now().await;
        Ok(true)
    }

    /// `ALTER TABLE catalog.ns.name ADD/DROP/RENAME COLUMN ...`, one commit per
    /// statement. Needs write permission on the table. A column the policy names (rules
    /// or keys follow column names) cannot be renamed, nor another renamed to such a
    /// name: its protection would not follow it.
    pub async fn alter_table(&self, ns: &str, name: &str, ops: &[AlterColumn]) -> Result<()> {
        use iceberg::spec::{NestedField, Schema};
        use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
        let target = format!("{}.{ns}.{name}", self.catalog.name());
        if self.hidden(&target) {
            self.check_missing(&target, "alter_table")?;
            return Err(not_found(&target));
        }
        self.check_table_write(&target, "alter_table")?;
        let policy = self.access.policy();
        let principal = self.access.principal();
        // A principal under a row filter changes no definition (a renamed column would
        // re-point the filter); columns any filter reads are not renamed or dropped.
        use crate::policy_provider::row_filter;
        self.refuse_under_filter(&target, "alter_table")?;
        self.refuse_under_catalog_restrictions(ns, name, &target, "alter_table")
            .await?;
        let filter_columns = row_filter::filter_columns(policy, &target);
        let invalid = |reason: String| -> DataFusionError {
            Error::InvalidWrite {
                table: target.clone(),
                reason,
            }
            .into()
        };
        let ident = TableIdent::new(namespace(ns), name.to_owned());
        let cat = self.catalog.iceberg();
        if !cat
            .table_exists(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            return Err(not_found(&target));
        }
        let table = cat
            .load_table(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        if let Some(key) = clearice_iceberg::native::table_key_id(table.metadata()) {
            return Err(Error::Unsupported {
                table: target.clone(),
                what: format!(
                    "ALTER TABLE of a table Iceberg encrypts itself (table key '{key}'; ClearIce appends to such tables)"
                ),
            }
            .into());
        }
        let schema = table.metadata().current_schema();
        let named = |c: &str| {
            filter_columns.contains(&c.to_lowercase())
                || filter_columns.contains(c)
                || policy
                    .table(&target)
                    .is_some_and(|t| t.columns.contains_key(c))
                // A tagged column renamed would leave its tag (patterns match names).
                || policy.column_policy(&target, c).is_some()
        };
        let renames: Vec<(&str, &str)> = ops
            .iter()
            .filter_map(|o| match o {
                AlterColumn::Rename { from, to } => Some((from.as_str(), to.as_str())),
                _ => None,
            })
            .collect();
        if !renames.is_empty() {
            if renames.len() != ops.len() {
                return Err(invalid(
                    "RENAME COLUMN cannot be combined with other changes in one ALTER TABLE".into(),
                ));
            }
            let mut fields: Vec<iceberg::spec::NestedFieldRef> =
                schema.as_struct().fields().to_vec();
            for (from, to) in &renames {
                if named(from) || named(to) {
                    return Err(Error::WriteDenied {
                        what: format!("renaming column '{from}' of table '{target}' to '{to}'"),
                        principal: principal.to_owned(),
                        rule: "the policy names the column; its rules would not follow the new name (change the policy with the rename)".into(),
                    }
                    .into());
                }
                if schema.field_by_name(to).is_some() {
                    return Err(invalid(format!("column '{to}' already exists")));
                }
                let i = fields
                    .iter()
                    .position(|f| f.name == *from)
                    .ok_or_else(|| invalid(format!("no column '{from}'")))?;
                let mut f = NestedField::clone(&fields[i]);
                f.name = (*to).to_owned();
                fields[i] = Arc::new(f);
            }
            let renamed = Schema::builder()
                .with_schema_id(schema.schema_id() + 1)
                .with_identifier_field_ids(schema.identifier_field_ids())
                .with_fields(fields)
                .build()
                .map_err(|e| invalid(e.to_string()))?;
            self.catalog
                .committer()
                .swap(
                    &target,
                    &table,
                    vec![
                        iceberg::TableUpdate::AddSchema { schema: renamed },
                        iceberg::TableUpdate::SetCurrentSchema { schema_id: -1 },
                    ],
                    &std::sync::atomic::AtomicBool::new(false),
                )
                .await?;
        } else {
            let tx = Transaction::new(&table);
            let mut action = tx.update_schema();
            for o in ops {
                match o {
                    AlterColumn::Add {
                        name: c,
                        data_type,
                        nullable,
                    } => {
                        if !nullable {
                            return Err(invalid(format!(
                                "new column '{c}' must be nullable (existing rows have no value)"
                            )));
                        }
                        if schema.field_by_name(c).is_some() {
                            return Err(invalid(format!("column '{c}' already exists")));
                        }
                        let t =
                            iceberg::arrow::arrow_type_to_type(&iceberg_compatible_type(data_type))
                                .map_err(|e| invalid(format!("column '{c}': {e}")))?;
                        action = action.add_column(AddColumn::optional(c, t));
                    }
                    AlterColumn::Drop { name: c, if_exists } => {
                        if filter_columns.contains(c) || filter_columns.contains(&c.to_lowercase())
                        {
                            return Err(invalid(format!(
                                "column '{c}' is read by a row filter of the table (change the policy first)"
                            )));
                        }
                        if schema.field_by_name(c).is_none() {
                            if *if_exists {
                                continue;
                            }
                            return Err(invalid(format!("no column '{c}'")));
                        }
                        action = action.delete_column(c);
                    }
                    AlterColumn::Rename { .. } => unreachable!("handled above"),
                }
            }
            let tx = action.apply(tx).map_err(|e| self.iceberg_err(&target, e))?;
            tx.commit(cat.as_ref())
                .await
                .map_err(|e| self.iceberg_err(&target, e))?;
        }
        self.record(&target, "alter_table", None);
        self.catalog.refresh_now().await;
        Ok(())
    }

    /// Refuses `action` on `target` by a principal its REST catalog restricts (read
    /// restrictions, or a catalog that cannot be asked for it): ClearIce commits with its
    /// own credential, so the catalog could not refuse it a change to what it may not see.
    async fn refuse_under_catalog_restrictions(
        &self,
        ns: &str,
        name: &str,
        target: &str,
        action: &str,
    ) -> Result<()> {
        use crate::policy_provider::restrictions::{Outcome, load};
        let Some(schema) = self.catalog.schema_provider(ns) else {
            return Ok(());
        };
        let Some(table) = schema.load(name, None).await? else {
            return Ok(());
        };
        let why = match load(&table, self.access.principal()).await? {
            Outcome::None => return Ok(()),
            Outcome::Apply(r) => format!("the principal reads the table under a {}", r.rule),
            Outcome::Deny(why) => why,
        };
        Err(self.refused(target, action, &why))
    }

    /// Refuses `action` on `target` by a principal who reads it under a row filter (or
    /// one that does not parse): it would change rows or columns the filter hides.
    fn refuse_under_filter(&self, target: &str, action: &str) -> Result<()> {
        let policy = self.access.policy();
        let principal = self.access.principal();
        let under_filter = match crate::policy_provider::row_filter::bind(policy, principal, target)
        {
            Ok(f) => f.filter(|f| !f.is_all_rows()).map(|f| f.rule),
            Err(e) => Some(e),
        };
        match under_filter {
            Some(rule) => Err(self.refused(
                target,
                action,
                &format!("the principal reads the table under a row filter ({rule})"),
            )),
            None => Ok(()),
        }
    }

    /// `DROP TABLE [IF EXISTS] catalog.ns.name`: needs write permission on the table.
    /// The catalog forgets the table; its files stay where they are.
    pub async fn drop_table(&self, ns: &str, name: &str, if_exists: bool) -> Result<()> {
        let target = format!("{}.{ns}.{name}", self.catalog.name());
        if self.hidden(&target) {
            self.check_missing(&target, "drop_table")?;
            return if if_exists {
                Ok(())
            } else {
                Err(not_found(&target))
            };
        }
        self.check_table_write(&target, "drop_table")?;
        // Dropping the table would remove the rows a principal's row filter hides from it.
        self.refuse_under_filter(&target, "drop_table")?;
        self.refuse_under_catalog_restrictions(ns, name, &target, "drop_table")
            .await?;
        let ident = TableIdent::new(namespace(ns), name.to_owned());
        let cat = self.catalog.iceberg();
        if !cat
            .table_exists(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?
        {
            if if_exists {
                return Ok(());
            }
            return Err(not_found(&target));
        }
        cat.drop_table(&ident)
            .await
            .map_err(|e| self.iceberg_err(&target, e))?;
        self.record(&target, "drop_table", None);
        self.catalog.refresh_now().await;
        Ok(())
    }
}

/// The rule a refused table change names.
const TABLE_WRITE_RULE: &str = "not in the table's `write` list (or `[writes] create`)";

/// What DDL answers for a table that does not exist (or is hidden from the principal).
fn not_found(target: &str) -> DataFusionError {
    DataFusionError::Plan(format!("table '{target}' not found"))
}
