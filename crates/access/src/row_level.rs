//! DELETE and UPDATE as written: the row predicate and new values are taken from the
//! statement's plan before any optimizer rule runs, never from the filters DataFusion
//! extracts from an optimized plan (there a decorrelated subquery has become a join and
//! its predicate is gone, and a filter proven false has become an empty relation: the
//! copy-on-write path would change the wrong rows).
//!
//! ```text
//!  Dml(Delete | Update) ──▶ RowLevelStatement::of   shape checked: the table itself,
//!                                │                  [WHERE], no FROM / LIMIT / joins
//!                                ▼
//!                          check_row_level           write rules, audited, before any work
//!                                ▼
//!                          inline_subqueries         uncorrelated subqueries run once as
//!                                │                   the principal: IN → IN list, EXISTS →
//!                                │                   a boolean, scalar → its value;
//!                                │                   correlated ones are refused
//!                                ▼
//!                          IcebergRowLevelExec       the predicate, exact, in both passes
//! ```
//!
//! SQL's three-valued logic is kept: `x IN (subquery)` becomes `x IN (v1, .., vn)` with
//! the subquery's NULL kept in the list, an empty subquery makes `IN` false and `NOT IN`
//! true whatever `x` is.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::{Exists, InList, InSubquery};
use datafusion::logical_expr::{Expr, LogicalPlan, Subquery, WriteOp, lit};
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use crate::policy_provider::PolicyTableProvider;
use clearice_iceberg::Error;
use clearice_iceberg::dml::{IcebergRowLevelExec, RowLevel, count_schema};

/// Values one inlined `IN (subquery)` may hold.
pub const MAX_INLINED_VALUES: usize = 100_000;

/// A DELETE or UPDATE of a catalog table, as written.
pub struct RowLevelStatement {
    /// The target, under the policy.
    pub target: Arc<dyn TableProvider>,
    /// DELETE, or UPDATE with its assignments (column, new value).
    pub kind: RowLevel,
    /// The WHERE condition, subqueries included (`None`: every row).
    pub predicate: Option<Expr>,
}

fn refuse(table: &str, statement: &str, reason: impl Into<String>) -> DataFusionError {
    Error::NotExact {
        table: table.to_owned(),
        statement: statement.to_owned(),
        reason: reason.into(),
    }
    .into()
}

impl RowLevelStatement {
    /// The row-level write `plan` is, if it is a DELETE or UPDATE of a table under the
    /// policy (`plan` as the SQL planner made it: not analyzed, not optimized). A shape
    /// ClearIce cannot execute exactly is refused here, in one line, before any work.
    pub fn of(plan: &LogicalPlan) -> Result<Option<Self>> {
        let LogicalPlan::Dml(d) = plan else {
            return Ok(None);
        };
        if !matches!(d.op, WriteOp::Delete | WriteOp::Update) {
            return Ok(None);
        }
        let Ok(target) = datafusion::datasource::source_as_provider(&d.target) else {
            return Ok(None);
        };
        let Some(policy) = target.as_any().downcast_ref::<PolicyTableProvider>() else {
            return Ok(None);
        };
        let table = policy.inner().name().to_owned();
        let op = if d.op == WriteOp::Delete {
            "DELETE"
        } else {
            "UPDATE"
        };
        let shape = || {
            refuse(
                &table,
                op,
                "FROM, LIMIT, ORDER BY and joins are not supported (write it as one statement on the table, with a WHERE condition)",
            )
        };
        let (body, projection) = match (d.op.clone(), d.input.as_ref()) {
            (WriteOp::Update, LogicalPlan::Projection(p)) => (p.input.as_ref(), Some(&p.expr)),
            (WriteOp::Delete, other) => (other, None),
            _ => return Err(shape()),
        };
        let (scan_side, predicate) = match body {
            LogicalPlan::Filter(f) => (f.input.as_ref(), Some(f.predicate.clone())),
            other => (other, None),
        };
        let scan = match scan_side {
            LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
            other => other,
        };
        match scan {
            LogicalPlan::TableScan(s)
                if datafusion::datasource::source_as_provider(&s.source)
                    .is_ok_and(|p| Arc::ptr_eq(&p, &target)) => {}
            _ => return Err(shape()),
        }
        let kind = match projection {
            None => RowLevel::Delete,
            Some(exprs) => {
                let mut assignments = Vec::new();
                for e in exprs {
                    let (value, name) = match e {
                        Expr::Alias(a) => (a.expr.as_ref(), a.name.clone()),
                        other => {
                            return Err(DataFusionError::Internal(format!(
                                "UPDATE of '{table}': unexpected value {other} (not aliased to its column)"
                            )));
                        }
                    };
                    // Columns the statement does not set are projected as themselves.
                    if matches!(value, Expr::Column(c) if c.name == name) {
                        continue;
                    }
                    assignments.push((name, value.clone()));
                }
                RowLevel::Update(assignments)
            }
        };
        Ok(Some(Self {
            target,
            kind,
            predicate,
        }))
    }

    /// The table written.
    pub fn policy(&self) -> &PolicyTableProvider {
        self.target
            .as_any()
            .downcast_ref::<PolicyTableProvider>()
            .expect("RowLevelStatement::of checked the target")
    }

    /// Checks the statement against the policy (audited), runs its subqueries, and plans
    /// it: the returned plan executes the write and yields one `count` row.
    pub async fn plan(self, state: &SessionState) -> Result<Arc<dyn ExecutionPlan>> {
        let policy = self.policy();
        let table = policy.inner().name().to_owned();
        let (action, values): (&str, Vec<&Expr>) = match &self.kind {
            RowLevel::Delete => ("delete", vec![]),
            RowLevel::Update(a) => ("update", a.iter().map(|(_, e)| e).collect()),
        };
        let used: Vec<&Expr> = self.predicate.iter().chain(values).collect();
        if self.predicate.as_ref().is_some_and(Expr::is_volatile) {
            return Err(refuse(
                &table,
                op_name(action),
                "its condition calls a volatile function (random(), ...): the rows it picks could not be found twice",
            ));
        }
        if let RowLevel::Update(assignments) = &self.kind
            && let Some(c) = policy.filter_reads(assignments.iter().map(|(c, _)| c.as_str()))
        {
            return Err(refuse(
                &table,
                "UPDATE",
                format!(
                    "it sets column '{c}', which the principal's row filter reads (the row could leave the rows the principal sees)"
                ),
            ));
        }
        let target = policy.check_row_level(action, &used)?;
        let predicate = match self.predicate {
            Some(p) => Some(inline_subqueries(p, state, &table, op_name(action)).await?),
            None => None,
        };
        let kind = match self.kind {
            RowLevel::Delete => RowLevel::Delete,
            RowLevel::Update(assignments) => {
                let mut out = Vec::with_capacity(assignments.len());
                for (c, e) in assignments {
                    out.push((c, inline_subqueries(e, state, &table, "UPDATE").await?));
                }
                RowLevel::Update(out)
            }
        };
        IcebergRowLevelExec::try_new(
            state,
            Arc::new(target),
            kind,
            predicate.into_iter().collect(),
        )
    }
}

/// Replaces each subquery of `expr` by what it evaluates to, running it once in `state`
/// (as the session's principal, under the policy). Correlated subqueries are refused.
pub async fn inline_subqueries(
    expr: Expr,
    state: &SessionState,
    table: &str,
    op: &str,
) -> Result<Expr> {
    let mut subqueries: Vec<Subquery> = Vec::new();
    expr.apply(|e| {
        match e {
            Expr::ScalarSubquery(s)
            | Expr::Exists(Exists { subquery: s, .. })
            | Expr::InSubquery(InSubquery { subquery: s, .. }) => subqueries.push(s.clone()),
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if subqueries.is_empty() {
        return Ok(expr);
    }
    // By subquery plan: its distinct values, and whether it returned more than one row.
    let mut results: HashMap<usize, (Vec<ScalarValue>, bool)> = HashMap::new();
    for s in &subqueries {
        if !s.outer_ref_columns.is_empty() || !s.subquery.all_out_ref_exprs().is_empty() {
            return Err(refuse(
                table,
                op,
                "correlated subqueries (referring to the row being changed) are not supported; use an uncorrelated `col IN (SELECT ...)`",
            ));
        }
        let key = Arc::as_ptr(&s.subquery) as usize;
        if results.contains_key(&key) {
            continue;
        }
        let schema = s.subquery.schema();
        if schema.fields().len() != 1 {
            return Err(refuse(
                table,
                op,
                format!(
                    "a subquery returns {} columns (one expected)",
                    schema.fields().len()
                ),
            ));
        }
        let physical = state.create_physical_plan(s.subquery.as_ref()).await?;
        // Streamed: a subquery over the cap stops at the cap, not after reading it all.
        let mut stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())?;
        let mut values = Vec::new();
        let mut seen = HashSet::new();
        let mut rows = 0usize;
        while let Some(b) = stream.next().await {
            let b = b?;
            rows += b.num_rows();
            let column = b.column(0);
            for i in 0..b.num_rows() {
                let v = ScalarValue::try_from_array(column, i)?;
                if seen.insert(v.clone()) {
                    values.push(v);
                }
                if values.len() > MAX_INLINED_VALUES {
                    return Err(refuse(
                        table,
                        op,
                        format!(
                            "a subquery returns more than {MAX_INLINED_VALUES} distinct values"
                        ),
                    ));
                }
            }
        }
        // Scalar subqueries: SQL's one-row rule (counted on rows, not distinct values).
        results.insert(key, (values, rows > 1));
    }
    expr.transform_down(|e| {
        let replaced = match e {
            Expr::ScalarSubquery(s) => {
                let key = Arc::as_ptr(&s.subquery) as usize;
                let (values, many) = &results[&key];
                if *many {
                    return Err(refuse(
                        table,
                        op,
                        "a scalar subquery returns more than one row",
                    ));
                }
                let data_type = s.subquery.schema().field(0).data_type().clone();
                match values.first() {
                    Some(v) => lit(v.clone()),
                    None => lit(ScalarValue::try_from(&data_type)?),
                }
            }
            Expr::Exists(Exists { subquery, negated }) => {
                let key = Arc::as_ptr(&subquery.subquery) as usize;
                lit(results[&key].0.is_empty() == negated)
            }
            Expr::InSubquery(InSubquery {
                expr,
                subquery,
                negated,
            }) => {
                let key = Arc::as_ptr(&subquery.subquery) as usize;
                let values = &results[&key].0;
                if values.is_empty() {
                    // x IN (empty) is false, x NOT IN (empty) true, even for NULL x.
                    lit(negated)
                } else {
                    Expr::InList(InList {
                        expr,
                        list: values.iter().cloned().map(lit).collect(),
                        negated,
                    })
                }
            }
            other => return Ok(Transformed::no(other)),
        };
        Ok(Transformed::yes(replaced))
    })
    .map(|t| t.data)
}

fn op_name(action: &str) -> &'static str {
    if action == "delete" {
        "DELETE"
    } else {
        "UPDATE"
    }
}

/// A write ClearIce planned itself, as a table whose scan is that write: what a
/// statement's DataFrame runs (one `count` row).
#[derive(Debug)]
pub struct PlannedWrite {
    plan: Arc<dyn ExecutionPlan>,
}

impl PlannedWrite {
    /// The write `plan` (its schema is [`count_schema`]).
    pub fn new(plan: Arc<dyn ExecutionPlan>) -> Self {
        Self { plan }
    }
}

#[async_trait::async_trait]
impl TableProvider for PlannedWrite {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        count_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::clone(&self.plan))
    }
}
