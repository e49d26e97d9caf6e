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
//! - INSERT OVERWRITE, TRUNCATE, MERGE, ALTER and DROP by such a principal stay refused;
//!   a filter calling a volatile function refuses DELETE and UPDATE (they evaluate it twice).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::{BoundRowFilter, PolicyTableProvider, RowFilterPlan};

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
        if plan.volatile {
            // Pass 2 evaluates it twice per row (the rows changed, the rows copied): a row
            // could land in both or neither.
            return Err(clearice_iceberg::Error::NotExact {
                table: self.inner.name().to_owned(),
                statement: "DELETE or UPDATE".into(),
                reason: format!(
                    "the principal's {} calls a volatile function (random(), ...)",
                    f.rule
                ),
            }
            .into());
        }
        Ok(Some(Arc::new(PolicyRowGate { plan })))
    }

    /// A column of `columns` the principal's row filter reads (as the planned predicate
    /// resolves it: a struct field read names its column; compared ignoring case too:
    /// refusing too much is safe), if the principal writes under a filter. A filter that
    /// does not plan reads every column.
    pub(crate) fn filter_reads<'c>(
        &self,
        mut columns: impl Iterator<Item = &'c str>,
    ) -> Option<&'c str> {
        let f = self.row_filter.as_ref()?;
        let all: Vec<usize> = (0..datafusion::catalog::TableProvider::schema(&self.inner)
            .fields()
            .len())
            .collect();
        let read = match self.plan_row_filter(f, &all) {
            Ok((_, plan)) => plan.columns,
            Err(_) => return columns.next(),
        };
        columns.find(|c| {
            read.iter()
                .any(|r| r == c || r.to_lowercase() == c.to_lowercase())
        })
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
        // Checked on the values as the table will hold them (the write casts each column
        // to the table's type by name: bulk ingest sends the client's types).
        let table_schema = datafusion::catalog::TableProvider::schema(&self.inner);
        let predicate = plan_on(f, &table_schema, table)?;
        Ok(Arc::new(RowFilterCheckExec {
            props: Arc::clone(input.properties()),
            input,
            predicate,
            table_schema,
            display: f.describe(),
            denied: Denied {
                what: format!("INSERT into table '{table}' of a row its row filter does not show"),
                principal: self.access.principal().to_owned(),
                rule: format!("rows written under a row filter must pass it ({})", f.rule),
            },
        }))
    }
}

/// The filter's predicate over the table's columns, by name.
fn plan_on(
    f: &BoundRowFilter,
    table_schema: &SchemaRef,
    table: &str,
) -> Result<Arc<dyn PhysicalExpr>> {
    let fail = |e: DataFusionError| {
        DataFusionError::Plan(format!(
            "the {} of table '{table}' does not apply to the rows written: {}",
            f.rule,
            crate::one_line(&e)
        ))
    };
    let schema = DFSchema::try_from(table_schema.as_ref().clone())?;
    let (state, expr) = f.logical(&schema).map_err(fail)?;
    state.create_physical_expr(expr, &schema).map_err(fail)
}

/// `batch` as the table will hold it: each table column cast from the batch's column of
/// its name (as `WriteTarget::conform` casts), NULL where the batch has none.
fn as_table_holds(batch: &RecordBatch, table_schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = table_schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(Arc::clone(c)),
            Some(c) => Ok(datafusion::arrow::compute::cast(c, f.data_type())?),
            None => Ok(datafusion::arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    // Nullability as the table's fields say, without checking it here (the write does).
    let fields: Vec<_> = table_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    Ok(RecordBatch::try_new_with_options(
        schema,
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
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
    /// The table's columns: each batch is checked as cast to them.
    table_schema: SchemaRef,
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
            table_schema: Arc::clone(&self.table_schema),
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
        let table_schema = Arc::clone(&self.table_schema);
        let denied = self.denied.clone();
        let stream = input.map(move |batch| {
            let batch = batch?;
            let refused = || denied.error();
            let conformed = as_table_holds(&batch, &table_schema).map_err(|_| refused())?;
            let verdict = predicate
                .evaluate(&conformed)
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
