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
//! - writes by a principal under a row filter stay inside it (`write.rs`).
//!
//! The predicate is SQL over the table's columns (named as the table names them now);
//! `principal()` is the principal's name and `principal_attr('x')` its attribute `x`
//! (`NULL` when it has none: no row matches). A predicate that does not parse or names
//! no such column fails the query in one line naming the table and the rule.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::{BatchCoalescer, filter_record_batch};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
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
    BinaryOperator, Expr as SqlExpr, ExprWithAlias, FunctionArg, FunctionArgExpr,
    FunctionArguments, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use futures::StreamExt;

use super::PolicyTableProvider;

mod catalog;
mod write;

/// A row filter ready to plan: its rule, and its predicate with the principal's name and
/// attributes put in; and a REST catalog's required row filter, which must hold too.
#[derive(Debug, Clone)]
pub(crate) struct BoundRowFilter {
    /// Which rules it comes from.
    pub(crate) rule: String,
    /// The policy's predicate, substituted (the rules' predicates OR-ed); `None`: the
    /// policy filters nothing, only the catalog does.
    expr: Option<SqlExpr>,
    /// Its text, for EXPLAIN and the audit log.
    sql: String,
    /// The catalog's required row filter (AND-ed), over the columns' current names.
    catalog: Option<clearice_policy::RowPredicate>,
}

impl BoundRowFilter {
    /// The predicate over `schema`, and the state to plan it physically: fixed settings,
    /// not the session's (its dialect, identifier normalization or time zone must not
    /// change what the filter means), with this statement's start time (`now()` in a
    /// filter is now, not when the process started).
    fn logical(&self, schema: &DFSchema) -> Result<(datafusion::execution::SessionState, Expr)> {
        let mut state = fixed_state().clone();
        let options = Arc::clone(state.config_options());
        state.execution_props_mut().mark_start_execution(options);
        let local = match &self.expr {
            Some(e) => Some(state.create_logical_expr_from_sql_expr(
                ExprWithAlias {
                    expr: e.clone(),
                    alias: None,
                },
                schema,
            )?),
            None => None,
        };
        let catalog = match &self.catalog {
            Some(p) => Some(catalog::to_expr(p, schema)?),
            None => None,
        };
        let expr = match (local, catalog) {
            (Some(l), Some(c)) => l.and(c),
            (Some(e), None) | (None, Some(e)) => e,
            (None, None) => datafusion::logical_expr::lit(true),
        };
        Ok((state, expr))
    }

    /// Whether the policy's own predicate lets every row through (`true`).
    fn local_is_all_rows(&self) -> bool {
        self.expr.is_none() || self.sql.trim().eq_ignore_ascii_case("true")
    }

    /// Whether it lets every row through (`true`): nothing to apply.
    pub(crate) fn is_all_rows(&self) -> bool {
        self.local_is_all_rows() && self.catalog.is_none()
    }

    /// For the audit log and errors.
    pub(super) fn describe(&self) -> String {
        match &self.catalog {
            None => format!("{}: {}", self.rule, self.sql),
            Some(c) if self.local_is_all_rows() => {
                format!("{}: {}", self.rule, catalog::display(c))
            }
            Some(c) => format!("{}: ({}) AND {}", self.rule, self.sql, catalog::display(c)),
        }
    }

    /// `local` (the policy's filter, if any) with a REST catalog's required row filter
    /// `catalog` from `rule` AND-ed to it.
    pub(crate) fn with_catalog(
        local: Option<Self>,
        catalog: clearice_policy::RowPredicate,
        rule: &str,
    ) -> Self {
        match local {
            Some(l) if !l.local_is_all_rows() => Self {
                rule: format!("{} and the {rule}", l.rule),
                catalog: Some(catalog),
                ..l
            },
            _ => Self {
                rule: rule.to_owned(),
                expr: None,
                sql: "true".into(),
                catalog: Some(catalog),
            },
        }
    }
}

/// One rule's predicate as a whole expression: text after it is an error, not ignored.
fn parse_predicate(sql: &str) -> std::result::Result<SqlExpr, String> {
    let mut parser = Parser::new(&GenericDialect {})
        .try_with_sql(sql)
        .map_err(|e| e.to_string())?;
    let expr = parser.parse_expr().map_err(|e| e.to_string())?;
    parser
        .expect_token(&Token::EOF)
        .map_err(|e| e.to_string())?;
    Ok(expr)
}

/// `table`'s row filter for `principal`, its functions substituted; `Err`: the text does
/// not parse (a message naming the rule).
pub(crate) fn bind(
    policy: &clearice_policy::Policy,
    principal: &str,
    table: &str,
) -> std::result::Result<Option<BoundRowFilter>, String> {
    let Some(f) = policy.row_filter(principal, table) else {
        return Ok(None);
    };
    let mut combined: Option<SqlExpr> = None;
    for predicate in &f.predicates {
        let mut expr = parse_predicate(predicate)
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
        let expr = SqlExpr::Nested(Box::new(expr));
        combined = Some(match combined {
            None => expr,
            Some(left) => SqlExpr::BinaryOp {
                left: Box::new(left),
                op: BinaryOperator::Or,
                right: Box::new(expr),
            },
        });
    }
    let expr = combined.unwrap_or(SqlExpr::Value(Value::Boolean(false).into()));
    let sql = match &expr {
        SqlExpr::Nested(e) => e.to_string(),
        e => e.to_string(),
    };
    Ok(Some(BoundRowFilter {
        rule: f.rule,
        expr: Some(expr),
        sql,
        catalog: None,
    }))
}

/// The columns any row filter of `table` names (by the names the policy uses): renaming
/// or dropping one would change what the filter reads.
pub(crate) fn filter_columns(
    policy: &clearice_policy::Policy,
    table: &str,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let Some(t) = policy.table(table) else {
        return out;
    };
    for (_, predicate) in &t.row_filter {
        // A filter that does not parse denies the table; it names nothing here.
        let Ok(expr) = parse_predicate(predicate) else {
            continue;
        };
        let _ = datafusion::sql::sqlparser::ast::visit_expressions(&expr, |e| {
            // Every part of a compound name: `address.country` may be a struct column's
            // field as well as a qualified column. Unquoted names as DataFusion normalizes
            // them (Unicode lowercase).
            let parts: &[_] = match e {
                SqlExpr::Identifier(i) => std::slice::from_ref(i),
                SqlExpr::CompoundIdentifier(parts) => parts,
                _ => &[],
            };
            for i in parts {
                out.insert(match i.quote_style {
                    None => i.value.to_lowercase(),
                    Some(_) => i.value.clone(),
                });
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
    }
    out
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
        let (state, expr) = filter.logical(&all).map_err(fail)?;
        let volatile = expr.is_volatile();
        let columns = expr.column_refs().iter().map(|c| c.name.clone()).collect();
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
                volatile,
                columns,
                display: filter.describe(),
                failed: format!(
                    "the {} of table '{table}' could not be evaluated on a row of the table",
                    filter.rule
                ),
            },
        ))
    }
}

/// A row filter planned for one scan.
#[derive(Clone)]
pub(super) struct RowFilterPlan {
    predicate: Arc<dyn PhysicalExpr>,
    /// Whether the predicate calls a volatile function (`random()`): a write evaluates
    /// it on each row twice, which must give one answer.
    volatile: bool,
    /// The table columns the predicate reads (current names, exactly as resolved).
    columns: Vec<String>,
    /// Columns of the scan's output to keep, in order (the statement's).
    keep: Vec<usize>,
    display: String,
    /// The one error a failing predicate gives (its own message may quote a value).
    failed: String,
}

/// The settings row filters are planned under: DataFusion's defaults (generic dialect,
/// identifiers normalized, UTC), whatever the session set.
fn fixed_state() -> &'static datafusion::execution::SessionState {
    static STATE: std::sync::OnceLock<datafusion::execution::SessionState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(|| {
        datafusion::execution::SessionStateBuilder::new()
            .with_default_features()
            .build()
    })
}

impl RowFilterPlan {
    /// `scan` (of the columns [`PolicyTableProvider::plan_row_filter`] chose) filtered.
    pub(super) fn apply(self, scan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        self.build(scan, false)
    }

    /// [`Self::apply`], keeping the rows the filter does not let through if `others`.
    fn build(self, scan: Arc<dyn ExecutionPlan>, others: bool) -> Result<Arc<dyn ExecutionPlan>> {
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
            others,
            display: self.display,
            failed: self.failed,
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
    /// Keep the rows the predicate does not let through instead (a row-level write copies
    /// them as they are).
    others: bool,
    display: String,
    failed: String,
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
        let others = if self.others { " (the other rows)" } else { "" };
        write!(f, "RowFilterExec{others}: {}", self.display)
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
        let target = context.session_config().batch_size().max(1);
        let input = self.scan.execute(partition, context)?;
        let state = Filtering {
            input,
            predicate: Arc::clone(&self.predicate),
            keep: self.keep.clone(),
            others: self.others,
            failed: self.failed.clone(),
            out: Coalesce::new(Arc::clone(&self.schema), target),
        };
        // Batches leave full (`batch_size` rows, the last one less), so how many there
        // are says nothing of the rows filtered out.
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let mut s = state?;
            loop {
                if let Some(b) = s.out.next() {
                    return Some((Ok(b), Some(s)));
                }
                match s.input.next().await {
                    Some(Ok(batch)) => {
                        if let Err(e) = s.push(batch) {
                            return Some((Err(e), None));
                        }
                    }
                    Some(Err(e)) => return Some((Err(e), None)),
                    None => return s.out.finish().map(|b| (b, None)),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// One partition of a [`RowFilterExec`] running.
struct Filtering {
    input: SendableRecordBatchStream,
    predicate: Arc<dyn PhysicalExpr>,
    keep: Vec<usize>,
    others: bool,
    failed: String,
    out: Coalesce,
}

impl Filtering {
    /// Filters `batch` into the output.
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let failed = || DataFusionError::Execution(self.failed.clone());
        let verdict = self
            .predicate
            .evaluate(&batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|_| failed())?;
        let verdict = verdict.as_boolean_opt().ok_or_else(failed)?;
        // NULL is not true: the row is filtered out (or, for the other rows, kept).
        let passed = if self.others {
            // (`prep_null_mask_filter` expects nulls.)
            let others = if datafusion::arrow::array::Array::null_count(verdict) == 0 {
                datafusion::arrow::compute::not(verdict)?
            } else {
                datafusion::arrow::compute::not(
                    &datafusion::arrow::compute::prep_null_mask_filter(verdict),
                )?
            };
            filter_record_batch(&batch, &others)?
        } else {
            filter_record_batch(&batch, verdict)?
        };
        let passed = passed.project(&self.keep)?;
        self.out.push(passed)
    }
}

/// Output batches of `batch_size` rows: arrow's coalescer, or, for a scan of no columns
/// (`count(*)`), a row count.
enum Coalesce {
    Columns(Box<BatchCoalescer>),
    Rows {
        schema: SchemaRef,
        target: usize,
        pending: usize,
        ready: usize,
    },
}

impl Coalesce {
    fn new(schema: SchemaRef, target: usize) -> Self {
        if schema.fields().is_empty() {
            Self::Rows {
                schema,
                target,
                pending: 0,
                ready: 0,
            }
        } else {
            Self::Columns(Box::new(BatchCoalescer::new(schema, target)))
        }
    }

    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        match self {
            Self::Columns(c) => Ok(c.push_batch(batch)?),
            Self::Rows {
                target,
                pending,
                ready,
                ..
            } => {
                *pending += batch.num_rows();
                *ready += *pending / *target;
                *pending %= *target;
                Ok(())
            }
        }
    }

    fn next(&mut self) -> Option<RecordBatch> {
        match self {
            Self::Columns(c) => c.next_completed_batch(),
            Self::Rows {
                schema,
                target,
                ready,
                ..
            } => {
                if *ready == 0 {
                    return None;
                }
                *ready -= 1;
                rows_only(schema, *target).ok()
            }
        }
    }

    /// The last, partial batch, if any.
    fn finish(&mut self) -> Option<Result<RecordBatch>> {
        match self {
            Self::Columns(c) => match c.finish_buffered_batch() {
                Ok(()) => c.next_completed_batch().map(Ok),
                Err(e) => Some(Err(e.into())),
            },
            Self::Rows {
                schema, pending, ..
            } => {
                let n = std::mem::take(pending);
                (n > 0).then(|| rows_only(schema, n))
            }
        }
    }
}

/// A batch of `n` rows and no columns.
fn rows_only(schema: &SchemaRef, n: usize) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(n)),
    )?)
}
