//! Row filters: the rows of a table one principal may see
//! ([`clearice_policy::Policy::row_filter`]), applied right above the scan:
//!
//! ```text
//!  FilterExec / joins / aggregates / windows   ← the statement: sees filtered rows only
//!        │
//!  PolicyMaskExec                               masks
//!        │
//!  RowFilterExec (a leaf: the scan is inside)   the row filter, on plaintext values
//!     └─ DataSourceExec (+ deletes)             no user predicate, no limit pushed here
//! ```
//!
//! Nothing outside the filter is read by the statement, counted or aggregated:
//! - the statement's own predicates are not pushed into the scan (a predicate that fails
//!   on a row, a division by zero, would tell that row exists), nor its limit;
//! - the scan is inside the leaf, so `EXPLAIN ANALYZE` shows the filtered row count only,
//!   and plans carry no statistics (no `count(*)` answered from file metadata);
//! - metadata tables (`$files`, `$partitions`, ...) count rows: denied under a row filter;
//! - such scans run on the coordinator, never on cluster workers;
//! - writes by a principal under a row filter are refused (not supported yet).
//!
//! The predicate is SQL over the table's columns (named as the table names them now);
//! `principal()` is the principal's name and `principal_attr('x')` its attribute `x`
//! (`NULL` when it has none: no row matches). A predicate that does not parse or names
//! no such column fails the query in one line naming the table and the rule.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::DFSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use futures::StreamExt;

use super::PolicyTableProvider;

/// A row filter ready to plan: its rule, and its predicate with the principal's name and
/// attributes put in.
#[derive(Debug, Clone)]
pub(super) struct BoundRowFilter {
    /// Which rules it comes from.
    pub(super) rule: String,
    /// SQL text, substituted.
    pub(super) sql: String,
}

impl BoundRowFilter {
    /// Whether it lets every row through (`true`): nothing to apply.
    pub(super) fn is_all_rows(&self) -> bool {
        self.sql.trim().eq_ignore_ascii_case("true")
    }

    /// For the audit log and errors.
    pub(super) fn describe(&self) -> String {
        format!("{}: {}", self.rule, self.sql)
    }
}

/// `table`'s row filter for `principal`, its functions substituted; `Err`: the text does
/// not parse (a message naming the rule).
pub(super) fn bind(
    policy: &clearice_policy::Policy,
    principal: &str,
    table: &str,
) -> std::result::Result<Option<BoundRowFilter>, String> {
    let Some(f) = policy.row_filter(principal, table) else {
        return Ok(None);
    };
    let mut expr = Parser::new(&GenericDialect {})
        .try_with_sql(&f.predicate)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| format!("the {} of table '{table}' does not parse: {e}", f.rule))?;
    let mut put = Substitute {
        policy,
        principal,
        error: None,
    };
    let _ = expr.visit(&mut put);
    if let Some(e) = put.error {
        return Err(format!("the {} of table '{table}': {e}", f.rule));
    }
    Ok(Some(BoundRowFilter {
        rule: f.rule,
        sql: expr.to_string(),
    }))
}

/// Replaces `principal()` and `principal_attr('x')` with string literals.
struct Substitute<'a> {
    policy: &'a clearice_policy::Policy,
    principal: &'a str,
    error: Option<String>,
}

impl VisitorMut for Substitute<'_> {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut SqlExpr) -> std::ops::ControlFlow<()> {
        let SqlExpr::Function(f) = expr else {
            return std::ops::ControlFlow::Continue(());
        };
        let name = f.name.to_string().to_ascii_lowercase();
        let args: Vec<&FunctionArg> = match &f.args {
            FunctionArguments::None => vec![],
            FunctionArguments::List(l) => l.args.iter().collect(),
            FunctionArguments::Subquery(_) => {
                self.error = Some("a subquery in a row filter is not supported".into());
                return std::ops::ControlFlow::Break(());
            }
        };
        let value = match (name.as_str(), args.as_slice()) {
            ("principal", []) => Value::SingleQuotedString(self.principal.to_owned()),
            (
                "principal_attr",
                [FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(v)))],
            ) => match &v.value {
                Value::SingleQuotedString(a) => match self.policy.attribute(self.principal, a) {
                    Some(x) => Value::SingleQuotedString(x.to_owned()),
                    None => Value::Null,
                },
                _ => {
                    self.error = Some("principal_attr takes an attribute name in quotes".into());
                    return std::ops::ControlFlow::Break(());
                }
            },
            ("principal" | "principal_attr", _) => {
                self.error = Some(format!("{name}: wrong arguments"));
                return std::ops::ControlFlow::Break(());
            }
            _ => return std::ops::ControlFlow::Continue(()),
        };
        *expr = SqlExpr::Value(value.into());
        std::ops::ControlFlow::Continue(())
    }
}

impl PolicyTableProvider {
    /// The planned row filter of a scan reading inner columns `inner_cols`: the inner
    /// columns to scan (`inner_cols` and those the predicate reads, sorted) and a function
    /// that puts the filter on the scan of them.
    pub(super) fn plan_row_filter(
        &self,
        state: &dyn Session,
        filter: &BoundRowFilter,
        inner_cols: &[usize],
    ) -> Result<(Vec<usize>, RowFilterPlan)> {
        let table = self.inner.name();
        let fail = |e: DataFusionError| {
            DataFusionError::Plan(format!(
                "the {} of table '{table}' does not apply: {}",
                filter.rule,
                crate::one_line(&e)
            ))
        };
        let state = state
            .as_any()
            .downcast_ref::<datafusion::execution::SessionState>()
            .ok_or_else(|| DataFusionError::Internal("row filters need a SessionState".into()))?;
        // Columns by the names the policy uses (the table's current names).
        let inner_schema = self.inner.schema();
        let named = |cols: &mut dyn Iterator<Item = usize>| -> Result<DFSchema> {
            let fields: Vec<Field> = cols
                .map(|i| {
                    let f = inner_schema.field(i);
                    Field::new(self.inner.current_name(f), f.data_type().clone(), true)
                })
                .collect();
            DFSchema::try_from(Schema::new(fields))
        };
        let all = named(&mut (0..inner_schema.fields().len()))?;
        let expr: Expr = state.create_logical_expr(&filter.sql, &all).map_err(fail)?;
        let mut scan_cols: Vec<usize> = inner_cols.to_vec();
        for c in expr.column_refs() {
            let i = all.index_of_column(c).map_err(fail)?;
            scan_cols.push(i);
        }
        scan_cols.sort_unstable();
        scan_cols.dedup();
        let scanned = named(&mut scan_cols.iter().copied())?;
        let predicate = state.create_physical_expr(expr, &scanned).map_err(fail)?;
        let keep = inner_cols
            .iter()
            .map(|c| scan_cols.binary_search(c).unwrap_or_default())
            .collect();
        Ok((
            scan_cols,
            RowFilterPlan {
                predicate,
                keep,
                display: filter.describe(),
            },
        ))
    }
}

/// A row filter planned for one scan.
pub(super) struct RowFilterPlan {
    predicate: Arc<dyn PhysicalExpr>,
    /// Columns of the scan's output to keep, in order (the statement's).
    keep: Vec<usize>,
    display: String,
}

impl RowFilterPlan {
    /// `scan` (of the columns [`PolicyTableProvider::plan_row_filter`] chose) filtered.
    pub(super) fn apply(self, scan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = Arc::new(scan.schema().project(&self.keep)?);
        let props = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(
                scan.properties().output_partitioning().partition_count(),
            ),
            scan.properties().emission_type,
            scan.properties().boundedness,
        );
        Ok(Arc::new(RowFilterExec {
            scan,
            predicate: self.predicate,
            keep: self.keep,
            display: self.display,
            schema,
            props: Arc::new(props),
        }))
    }
}

/// The scan of a row-filtered table, as one leaf: only rows the filter passes leave it.
/// Its scan is not a child, so no plan rule pushes anything into it and no metric or
/// statistic of the unfiltered rows shows.
pub struct RowFilterExec {
    scan: Arc<dyn ExecutionPlan>,
    predicate: Arc<dyn PhysicalExpr>,
    keep: Vec<usize>,
    display: String,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl fmt::Debug for RowFilterExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowFilterExec({})", self.display)
    }
}

impl DisplayAs for RowFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowFilterExec: {}", self.display)
    }
}

impl ExecutionPlan for RowFilterExec {
    fn name(&self) -> &str {
        "RowFilterExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
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
            Err(DataFusionError::Internal("RowFilterExec is a leaf".into()))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.scan.execute(partition, context)?;
        let predicate = Arc::clone(&self.predicate);
        let keep = self.keep.clone();
        let stream = input.map(move |batch| {
            let batch = batch?;
            let verdict = predicate.evaluate(&batch)?.into_array(batch.num_rows())?;
            let verdict = verdict.as_boolean_opt().ok_or_else(|| {
                DataFusionError::Plan("a row filter must be a boolean predicate".into())
            })?;
            // NULL is not true: the row is filtered out.
            let passed = filter_record_batch(&batch, verdict)?;
            Ok(passed.project(&keep)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}
