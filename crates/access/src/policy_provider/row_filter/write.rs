//! Writes under a row filter change only rows the principal sees, and leave only such rows:
//!
//! - DELETE and UPDATE: [`PolicyRowGate`] cuts the row-level write's scans inside them, so
//!   the statement's condition, subqueries' uses and new values are evaluated on the rows
//!   the filter lets through (a condition failing on another row would tell it exists);
//!   the other rows of the files rewritten are copied as they are;
//! - UPDATE may not set a column a row filter of the table reads (the row could leave the
//!   rows the principal sees): refused before any work;
//! - INSERT: every row written must pass the filter ([`RowFilterCheckExec`], PostgreSQL's
//!   `WITH CHECK`), or the statement fails and nothing is committed;
//! - INSERT OVERWRITE, TRUNCATE, MERGE and ALTER by such a principal stay refused.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::common::DFSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::sql::sqlparser::ast::ExprWithAlias;
use futures::StreamExt;

use super::{BoundRowFilter, PolicyTableProvider, RowFilterPlan, fixed_state};

/// The rows of a table one principal's DELETE and UPDATE may change: its row filter.
#[derive(Clone)]
pub(crate) struct PolicyRowGate {
    /// Planned over every column of the table, in order.
    plan: RowFilterPlan,
}

impl fmt::Debug for PolicyRowGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyRowGate({})", self.plan.display)
    }
}

impl clearice_iceberg::dml::RowGate for PolicyRowGate {
    fn apply(
        &self,
        scan: Arc<dyn ExecutionPlan>,
        changeable: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut plan = self.plan.clone();
        // The scan's columns: the table's, then those the write adds (`_file`, lineage).
        plan.keep = (0..scan.schema().fields().len()).collect();
        plan.build(scan, !changeable)
    }
}

impl PolicyTableProvider {
    /// The gate of this principal's DELETE and UPDATE, if it reads the table under a row
    /// filter.
    pub(crate) fn row_gate(&self) -> Result<Option<Arc<dyn clearice_iceberg::dml::RowGate>>> {
        let Some(f) = &self.row_filter else {
            return Ok(None);
        };
        let columns = datafusion::catalog::TableProvider::schema(&self.inner)
            .fields()
            .len();
        let all: Vec<usize> = (0..columns).collect();
        let (_, plan) = self.plan_row_filter(f, &all)?;
        Ok(Some(Arc::new(PolicyRowGate { plan })))
    }

    /// A column of `columns` a row filter of the table reads (compared ignoring case:
    /// refusing too much is safe), if the principal writes under a filter.
    pub(crate) fn filter_reads<'c>(
        &self,
        mut columns: impl Iterator<Item = &'c str>,
    ) -> Option<&'c str> {
        self.row_filter.as_ref()?;
        let read = super::filter_columns(self.access.policy(), self.inner.name());
        columns.find(|c| read.iter().any(|r| r.eq_ignore_ascii_case(c)))
    }

    /// `input` (the rows an INSERT writes, named as the table names its columns), failing
    /// on the first row the principal's row filter does not let through.
    pub(crate) fn check_inserted_rows(
        &self,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(f) = &self.row_filter else {
            return Ok(input);
        };
        let table = self.inner.name();
        let predicate = plan_on(f, &input, table)?;
        Ok(Arc::new(RowFilterCheckExec {
            props: Arc::clone(input.properties()),
            input,
            predicate,
            display: f.describe(),
            denied: Denied {
                what: format!("INSERT into table '{table}' of a row its row filter does not show"),
                principal: self.access.principal().to_owned(),
                rule: format!("rows written under a row filter must pass it ({})", f.rule),
            },
        }))
    }
}

/// The filter's predicate over `input`'s columns, by name.
fn plan_on(
    f: &BoundRowFilter,
    input: &Arc<dyn ExecutionPlan>,
    table: &str,
) -> Result<Arc<dyn PhysicalExpr>> {
    let fail = |e: DataFusionError| {
        DataFusionError::Plan(format!(
            "the {} of table '{table}' does not apply to the rows written: {}",
            f.rule,
            crate::one_line(&e)
        ))
    };
    let mut state = fixed_state().clone();
    let options = Arc::clone(state.config_options());
    state.execution_props_mut().mark_start_execution(options);
    let schema = DFSchema::try_from(input.schema().as_ref().clone())?;
    let expr = state
        .create_logical_expr_from_sql_expr(
            ExprWithAlias {
                expr: f.expr.clone(),
                alias: None,
            },
            &schema,
        )
        .map_err(fail)?;
    state.create_physical_expr(expr, &schema).map_err(fail)
}

/// The error of a row an INSERT may not write.
#[derive(Clone)]
struct Denied {
    what: String,
    principal: String,
    rule: String,
}

impl Denied {
    fn error(&self) -> DataFusionError {
        clearice_iceberg::Error::WriteDenied {
            what: self.what.clone(),
            principal: self.principal.clone(),
            rule: self.rule.clone(),
        }
        .into()
    }
}

/// Passes its input's rows through, failing on the first one the predicate does not let
/// through (false or NULL); its error names the table, principal and rule, never a value.
struct RowFilterCheckExec {
    input: Arc<dyn ExecutionPlan>,
    predicate: Arc<dyn PhysicalExpr>,
    display: String,
    denied: Denied,
    props: Arc<PlanProperties>,
}

impl fmt::Debug for RowFilterCheckExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowFilterCheckExec({})", self.display)
    }
}

impl DisplayAs for RowFilterCheckExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowFilterCheckExec: {}", self.display)
    }
}

impl ExecutionPlan for RowFilterCheckExec {
    fn name(&self) -> &str {
        "RowFilterCheckExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .filter(|_| children.is_empty())
            .ok_or_else(|| DataFusionError::Internal("RowFilterCheckExec has one child".into()))?;
        Ok(Arc::new(Self {
            props: Arc::clone(input.properties()),
            input,
            predicate: Arc::clone(&self.predicate),
            display: self.display.clone(),
            denied: self.denied.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let predicate = Arc::clone(&self.predicate);
        let denied = self.denied.clone();
        let stream = input.map(move |batch| {
            let batch = batch?;
            let refused = || denied.error();
            let verdict = predicate
                .evaluate(&batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(|_| refused())?;
            let verdict = verdict.as_boolean_opt().ok_or_else(refused)?;
            if datafusion::arrow::array::Array::null_count(verdict) > 0
                || verdict.true_count() != batch.num_rows()
            {
                return Err(refused());
            }
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
