//! `MERGE INTO target USING source ON cond WHEN [NOT] MATCHED [AND c] THEN UPDATE SET ... |
//! DELETE | INSERT ...`, by copy-on-write (DataFusion does not plan MERGE):
//!
//! ```text
//!  1. target ⋈ source on cond, rows some MATCHED clause acts on ─▶ files to rewrite,
//!     rows changed; a target row matched by two source rows is an error (SQL's rule)
//!  2. those files ⟕ source: each row's first applicable clause updates or deletes it
//!  3. source ▷ target (no match anywhere): NOT MATCHED clauses insert
//!  4. 2 ∪ 3 written under the policy, replacing the files of 1 in one commit
//! ```
//!
//! The target is read with every column decrypted (a merge rewrites whole files: the
//! principal must be allowed to write every protected column), its conditions may use
//! only columns the principal reads in plaintext, and the source is read under the policy
//! (a masked source column cannot be merged in).

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::logical_expr::{
    Expr, ExprFunctionExt, JoinType, LogicalPlan, LogicalPlanBuilder, cast, col, lit, when,
};
use datafusion::sql::sqlparser::ast;

use crate::policy_provider::PolicyTableProvider;
use clearice_iceberg::Error;
use clearice_iceberg::FILE_COLUMN;
use clearice_iceberg::dml::{COUNTED, Commit, RewriteSource};

/// Marks source rows (a target row matched iff it is true after the outer join).
const MATCHED: &str = "__clearice_matched";
/// A target row's number within its file (pass 1 only).
const ROW_ID: &str = "__clearice_row";

/// One WHEN clause, its expressions planned against the joined schema.
enum Clause {
    Update {
        cond: Option<Expr>,
        set: Vec<(String, Expr)>,
    },
    Delete {
        cond: Option<Expr>,
    },
    Insert {
        cond: Option<Expr>,
        values: Vec<(String, Expr)>,
    },
}

fn invalid(target: &str, reason: impl Into<String>) -> DataFusionError {
    Error::InvalidWrite {
        table: target.to_owned(),
        reason: reason.into(),
    }
    .into()
}

/// An identifier as DataFusion resolves it: unquoted ones lower-cased (unless the
/// session turned `enable_ident_normalization` off), quoted ones as written.
fn normalized(ident: &ast::Ident, normalize: bool) -> String {
    if normalize && ident.quote_style.is_none() {
        ident.value.to_lowercase()
    } else {
        ident.value.clone()
    }
}

/// The alias a table factor is known by, normalized.
fn alias_of(t: &ast::TableFactor, normalize: bool) -> Option<String> {
    match t {
        ast::TableFactor::Table { alias, name, .. } => Some(match alias {
            Some(a) => normalized(&a.name, normalize),
            None => normalized(name.0.last()?.as_ident()?, normalize),
        }),
        ast::TableFactor::Derived { alias, .. } => {
            alias.as_ref().map(|a| normalized(&a.name, normalize))
        }
        _ => None,
    }
}

/// Whether `e` holds a subquery.
fn has_subquery(e: &ast::Expr) -> bool {
    ast::visit_expressions(e, |e| match e {
        ast::Expr::Subquery(_) | ast::Expr::InSubquery { .. } | ast::Expr::Exists { .. } => {
            std::ops::ControlFlow::Break(())
        }
        _ => std::ops::ControlFlow::Continue(()),
    })
    .is_break()
}

/// Runs a MERGE planned in `state` on `target` (the policy provider of its table, named
/// `target_name` in the statement). Returns the rows updated, deleted or inserted.
pub async fn merge(
    state: &SessionState,
    target: &PolicyTableProvider,
    m: &ast::Merge,
) -> Result<u64> {
    let name = target.inner().name().to_owned();
    let normalize = state
        .config()
        .options()
        .sql_parser
        .enable_ident_normalization;
    let t_alias = alias_of(&m.table, normalize)
        .ok_or_else(|| invalid(&name, "MERGE target must be a table"))?;
    let s_alias = alias_of(&m.source, normalize).ok_or_else(|| {
        invalid(
            &name,
            "MERGE source needs an alias (USING (SELECT ...) AS s)",
        )
    })?;
    if t_alias == s_alias {
        return Err(invalid(
            &name,
            "MERGE target and source need different aliases",
        ));
    }
    // The source, under the policy.
    // Planned from the source's AST (a version clause on it stays typed).
    let source_plan = state
        .statement_to_plan(clearice_iceberg::sql::select_star_from(m.source.clone())?)
        .await?;
    // Denials follow what the source names, not what its optimized plan reads.
    crate::named::check_named_columns(&source_plan)?;
    let columns = source_cols(source_plan.schema());
    let source_plan = LogicalPlanBuilder::from(source_plan)
        .project(
            columns
                .into_iter()
                .chain([lit(true).alias(MATCHED)])
                .collect::<Vec<_>>(),
        )?
        .alias(TableReference::bare(s_alias.as_str()))?
        .build()?;
    // The target as the rewrite reads it.
    // Pass 1 (with `_file`) looks for matches and may prune; the others read whole files.
    // Format 3: the target rows step 2 copies keep their lineage, inserted rows get new
    // ids (`clearice_iceberg::lineage`).
    let lineage = target.inner().tracks_lineage();
    let write = |files: Option<Arc<HashSet<String>>>, file_column: bool| {
        let rewrite = files.is_some() && !file_column;
        let mut inner = target.inner().for_rewrite(files, file_column);
        if lineage && rewrite {
            inner = inner.with_lineage();
        }
        let keys = target.grant();
        datafusion::datasource::provider_as_source(Arc::new(if file_column {
            RewriteSource::pruning(inner, keys)
        } else {
            RewriteSource::whole(inner, keys)
        }))
    };
    let t_ref = TableReference::bare(t_alias.as_str());
    let s_ref = TableReference::bare(s_alias.as_str());
    let t_all = LogicalPlanBuilder::scan(t_ref.clone(), write(None, true), None)?.build()?;
    let joined = t_all.schema().join(source_plan.schema())?;
    let expr = |e: &ast::Expr| -> Result<Expr> {
        if has_subquery(e) {
            return Err(Error::NotExact {
                table: name.clone(),
                statement: "MERGE".into(),
                reason: "subqueries in ON, WHEN conditions or values are not supported (put them in the USING source)".into(),
            }
            .into());
        }
        state.create_logical_expr_from_sql_expr(
            ast::ExprWithAlias {
                expr: e.clone(),
                alias: None,
            },
            &joined,
        )
    };
    let on = expr(&m.on)?;
    let target_schema = target.inner().table_schema();
    let column = |id: &ast::ObjectName| -> Result<String> {
        let c =
            id.0.last()
                .and_then(|p| p.as_ident())
                .map(|i| normalized(i, normalize))
                .ok_or_else(|| invalid(&name, format!("MERGE: '{id}' is not a column")))?;
        if target_schema.field_with_name(&c).is_err() {
            return Err(invalid(
                &name,
                format!("MERGE: the target has no column '{c}'"),
            ));
        }
        Ok(c)
    };
    let mut clauses = Vec::new();
    for c in &m.clauses {
        let cond = c.predicate.as_ref().map(&expr).transpose()?;
        let clause = match (&c.clause_kind, &c.action) {
            (ast::MergeClauseKind::Matched, ast::MergeAction::Update(u)) => {
                if u.update_predicate.is_some() || u.delete_predicate.is_some() {
                    return Err(invalid(
                        &name,
                        "MERGE: UPDATE ... WHERE / DELETE WHERE (Oracle) is not supported; use WHEN MATCHED AND ...",
                    ));
                }
                let mut set = Vec::new();
                for a in &u.assignments {
                    let ast::AssignmentTarget::ColumnName(n) = &a.target else {
                        return Err(invalid(&name, "MERGE: tuple assignments are not supported"));
                    };
                    set.push((column(n)?, expr(&a.value)?));
                }
                Clause::Update { cond, set }
            }
            (ast::MergeClauseKind::Matched, ast::MergeAction::Delete { .. }) => {
                Clause::Delete { cond }
            }
            (
                ast::MergeClauseKind::NotMatched | ast::MergeClauseKind::NotMatchedByTarget,
                ast::MergeAction::Insert(i),
            ) => {
                let columns: Vec<String> = if i.columns.is_empty() {
                    target_schema
                        .fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect()
                } else {
                    i.columns.iter().map(&column).collect::<Result<_>>()?
                };
                let values: Vec<Expr> = match &i.kind {
                    ast::MergeInsertKind::Values(v) if v.rows.len() == 1 => {
                        v.rows[0].iter().map(&expr).collect::<Result<_>>()?
                    }
                    ast::MergeInsertKind::Values(_) => {
                        return Err(invalid(&name, "MERGE: INSERT takes one VALUES row"));
                    }
                    ast::MergeInsertKind::Row => columns
                        .iter()
                        .map(|c| Expr::Column(Column::new(Some(s_ref.clone()), c)))
                        .collect(),
                };
                if values.len() != columns.len() {
                    return Err(invalid(
                        &name,
                        format!(
                            "MERGE: INSERT names {} columns but gives {} values",
                            columns.len(),
                            values.len()
                        ),
                    ));
                }
                Clause::Insert {
                    cond,
                    values: columns.into_iter().zip(values).collect(),
                }
            }
            (kind, action) => {
                return Err(DataFusionError::NotImplemented(format!(
                    "MERGE: WHEN {kind} THEN {} is not supported (WHEN MATCHED: UPDATE or DELETE; WHEN NOT MATCHED: INSERT)",
                    match action {
                        ast::MergeAction::Insert(_) => "INSERT",
                        ast::MergeAction::Update(_) => "UPDATE",
                        ast::MergeAction::Delete { .. } => "DELETE",
                    }
                )));
            }
        };
        clauses.push(clause);
    }
    // Policy: the target columns its conditions and values use must be plaintext for
    // the principal; the rewrite needs write permission on every protected column. Every
    // column reference is resolved against the joined schema (as the plan will resolve
    // it), so a target column is found however it is spelled or qualified; one that
    // does not resolve to exactly one column is refused.
    let mut exprs: Vec<&Expr> = vec![&on];
    for c in &clauses {
        match c {
            Clause::Update { cond, set } => {
                exprs.extend(cond.iter());
                exprs.extend(set.iter().map(|(_, e)| e));
            }
            Clause::Delete { cond } => exprs.extend(cond.iter()),
            Clause::Insert { cond, values } => {
                exprs.extend(cond.iter());
                exprs.extend(values.iter().map(|(_, e)| e));
            }
        }
    }
    let mut used: Vec<String> = Vec::new();
    for e in exprs {
        for c in e.column_refs() {
            let (qualifier, field) = joined.qualified_field_from_column(c).map_err(|_| {
                invalid(
                    &name,
                    format!("MERGE: '{c}' is not one column of the target or the source"),
                )
            })?;
            if qualifier == Some(&t_ref) {
                used.push(field.name().clone());
            } else if qualifier != Some(&s_ref) {
                return Err(invalid(
                    &name,
                    format!("MERGE: '{c}' is not a column of the target or the source"),
                ));
            }
        }
    }
    let write_target = target.check_row_level_columns("merge", &used)?;
    if lineage {
        clearice_iceberg::lineage::check_writable(
            &name,
            &target.inner().table_schema(),
            &write_target.spec,
        )?;
    }
    let no_lineage = || lit(datafusion::common::ScalarValue::Int64(None));
    crate::write_rules::check_copied(&source_plan, Some(&name), &|p| state.optimize(p))?;
    let matched = || col(Column::new(Some(s_ref.clone()), MATCHED)).is_true();
    let acts = |cond: &Option<Expr>| match cond {
        Some(c) => matched().and(c.clone().is_true()),
        None => matched(),
    };
    let matched_clauses: Vec<&Clause> = clauses
        .iter()
        .filter(|c| !matches!(c, Clause::Insert { .. }))
        .collect();
    let insert_clauses: Vec<&Clause> = clauses
        .iter()
        .filter(|c| matches!(c, Clause::Insert { .. }))
        .collect();
    let cond_of = |c: &Clause| match c {
        Clause::Update { cond, .. } | Clause::Delete { cond } | Clause::Insert { cond, .. } => {
            cond.clone()
        }
    };

    // 1. Files holding rows a MATCHED clause acts on; no target row matched twice.
    let mut files = HashSet::new();
    let mut changed = 0u64;
    if !matched_clauses.is_empty() {
        let row_id = datafusion::functions_window::expr_fn::row_number()
            .partition_by(vec![col(Column::new(Some(t_ref.clone()), FILE_COLUMN))])
            .build()?
            .alias(ROW_ID);
        let t_numbered = LogicalPlanBuilder::from(t_all.clone())
            .window(vec![row_id])?
            .build()?;
        let any_acts = matched_clauses
            .iter()
            .map(|c| acts(&cond_of(c)))
            .reduce(Expr::or)
            .expect("non-empty");
        let per_row = LogicalPlanBuilder::from(t_numbered)
            .join_on(source_plan.clone(), JoinType::Inner, vec![on.clone()])?
            .filter(any_acts)?
            .aggregate(
                vec![
                    col(Column::new(Some(t_ref.clone()), FILE_COLUMN)).alias("f"),
                    col(ROW_ID),
                ],
                vec![datafusion::functions_aggregate::count::count(lit(1)).alias("k")],
            )?
            .aggregate(
                vec![col("f")],
                vec![
                    datafusion::functions_aggregate::count::count(lit(1)).alias("rows"),
                    datafusion::functions_aggregate::min_max::max(col("k")).alias("most"),
                ],
            )?
            .build()?;
        for b in collect(state, per_row).await? {
            let f = b
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| DataFusionError::Internal("file column".into()))?;
            let rows = datafusion::arrow::compute::cast(b.column(1), &DataType::Int64)?;
            let most = datafusion::arrow::compute::cast(b.column(2), &DataType::Int64)?;
            let rows = rows.as_any().downcast_ref::<Int64Array>().expect("i64");
            let most = most.as_any().downcast_ref::<Int64Array>().expect("i64");
            for i in 0..b.num_rows() {
                if most.value(i) > 1 {
                    return Err(invalid(
                        &name,
                        "MERGE: a target row matches more than one source row (make the ON condition match at most one)",
                    ));
                }
                files.insert(f.value(i).to_owned());
                changed += rows.value(i) as u64;
            }
        }
    }
    let files = Arc::new(files);
    let mut parts: Vec<LogicalPlan> = Vec::new();
    let out_cols = |exprs: Vec<Expr>, counted: bool| -> Vec<Expr> {
        exprs
            .into_iter()
            .chain([lit(counted).alias(COUNTED)])
            .collect()
    };
    // 2. Those files rewritten: each row's first applicable clause.
    if !files.is_empty() {
        let t_some =
            LogicalPlanBuilder::scan(t_ref.clone(), write(Some(Arc::clone(&files)), false), None)?
                .build()?;
        let mut action = when(lit(false), lit(0i64));
        for (k, c) in matched_clauses.iter().enumerate() {
            action = action.when(acts(&cond_of(c)), lit(k as i64 + 1));
        }
        let action = action.otherwise(lit(0i64))?;
        let deleting: Vec<i64> = matched_clauses
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Clause::Delete { .. }))
            .map(|(k, _)| k as i64 + 1)
            .collect();
        let mut b = LogicalPlanBuilder::from(t_some).join_on(
            source_plan.clone(),
            JoinType::Left,
            vec![on.clone()],
        )?;
        if !deleting.is_empty() {
            b = b.filter(Expr::Not(Box::new(
                action
                    .clone()
                    .in_list(deleting.iter().map(|k| lit(*k)).collect(), false),
            )))?;
        }
        let mut exprs = target_schema
            .fields()
            .iter()
            .map(|f| {
                let current = col(Column::new(Some(t_ref.clone()), f.name()));
                let mut e = when(lit(false), current.clone());
                let mut any = false;
                for (k, c) in matched_clauses.iter().enumerate() {
                    if let Clause::Update { set, .. } = c
                        && let Some((_, v)) = set.iter().find(|(n, _)| n == f.name())
                    {
                        e = e.when(
                            action.clone().eq(lit(k as i64 + 1)),
                            cast(v.clone(), f.data_type().clone()),
                        );
                        any = true;
                    }
                }
                Ok(if any { e.otherwise(current)? } else { current }.alias(f.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        if lineage {
            // A copied row keeps its id and sequence number; an updated one its id.
            use clearice_iceberg::lineage::{LAST_UPDATED, ROW_ID as LINEAGE_ROW_ID};
            let updating: Vec<Expr> = matched_clauses
                .iter()
                .enumerate()
                .filter(|(_, c)| matches!(c, Clause::Update { .. }))
                .map(|(k, _)| lit(k as i64 + 1))
                .collect();
            exprs.push(col(Column::new(Some(t_ref.clone()), LINEAGE_ROW_ID)).alias(LINEAGE_ROW_ID));
            let last = col(Column::new(Some(t_ref.clone()), LAST_UPDATED));
            exprs.push(
                if updating.is_empty() {
                    last
                } else {
                    when(action.clone().in_list(updating, false), no_lineage()).otherwise(last)?
                }
                .alias(LAST_UPDATED),
            );
        }
        parts.push(b.project(out_cols(exprs, false))?.build()?);
    }
    // 3. Source rows matching no target row: the first applicable NOT MATCHED clause.
    if !insert_clauses.is_empty() {
        let t_all_plain =
            LogicalPlanBuilder::scan(t_ref.clone(), write(None, false), None)?.build()?;
        let b = LogicalPlanBuilder::from(source_plan.clone()).join_on(
            t_all_plain,
            JoinType::LeftAnti,
            vec![on.clone()],
        )?;
        let applies = |c: &Option<Expr>| match c {
            Some(c) => c.clone().is_true(),
            None => lit(true),
        };
        let mut action = when(lit(false), lit(0i64));
        for (k, c) in insert_clauses.iter().enumerate() {
            action = action.when(applies(&cond_of(c)), lit(k as i64 + 1));
        }
        let action = action.otherwise(lit(0i64))?;
        let mut exprs = target_schema
            .fields()
            .iter()
            .map(|f| {
                let mut e = when(lit(false), lit(datafusion::common::ScalarValue::Null));
                for (k, c) in insert_clauses.iter().enumerate() {
                    if let Clause::Insert { values, .. } = c
                        && let Some((_, v)) = values.iter().find(|(n, _)| n == f.name())
                    {
                        e = e.when(action.clone().eq(lit(k as i64 + 1)), v.clone());
                    }
                }
                Ok(cast(
                    e.otherwise(lit(datafusion::common::ScalarValue::Null))?,
                    f.data_type().clone(),
                )
                .alias(f.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        if lineage {
            // New rows: ids and sequence number assigned when read.
            exprs.push(no_lineage().alias(clearice_iceberg::lineage::ROW_ID));
            exprs.push(no_lineage().alias(clearice_iceberg::lineage::LAST_UPDATED));
        }
        parts.push(
            b.filter(action.gt(lit(0i64)))?
                .project(out_cols(exprs, true))?
                .build()?,
        );
    }
    let Some(first) = parts.first().cloned() else {
        write_target.audit.committed(None, 0);
        return Ok(0);
    };
    let mut all = LogicalPlanBuilder::from(first);
    for p in parts.into_iter().skip(1) {
        all = all.union(p)?;
    }
    let plan = all.build()?;
    let physical = state.create_physical_plan(&plan).await?;
    let stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())?;
    let removed: HashSet<String> = files.iter().cloned().collect();
    write_target
        .run(
            stream,
            Commit::Replace {
                removed,
                reported: Some(changed),
            },
            &state.runtime_env().memory_pool,
        )
        .await
}

async fn collect(
    state: &SessionState,
    plan: LogicalPlan,
) -> Result<Vec<datafusion::arrow::array::RecordBatch>> {
    let physical = state.create_physical_plan(&plan).await?;
    datafusion::physical_plan::collect(physical, state.task_ctx()).await
}

/// Every column of `schema`, qualified as it is.
fn source_cols(schema: &DFSchema) -> Vec<Expr> {
    schema
        .iter()
        .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
        .collect()
}
