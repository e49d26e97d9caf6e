//! The columns a statement names, checked against the policy on the plan as written.
//!
//! A scan is checked for the columns it reads, but the optimizer decides what a scan
//! reads: `SELECT count(*) FROM (SELECT card_number FROM t)` reads no column, and
//! `… WHERE id IS NULL` on a non-null `id` reads no file at all. Answering those for a
//! principal denied `card_number` (without an audit record of the attempt) makes a
//! denial depend on what DataFusion can prove. So every column reference of every
//! expression in the unoptimized plan is traced, through aliases, projections, joins,
//! unions and subqueries, to the table columns it comes from, and each policy table is
//! asked ([`PolicyTableProvider::check_named`]) before anything is optimized or run.
//!
//! DELETE and UPDATE are not traced here: their target is checked column by column by
//! the row-level gate ([`crate::row_level`]), and UPDATE's input names every column.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::Column;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, WriteOp};

use crate::policy_provider::PolicyTableProvider;

/// One table column: (scan of a policy table, column index in its schema).
type Origin = (usize, usize);

/// Fails (audited, by the table's policy provider) if `plan` names a column, or reads a
/// table, that its principal is denied.
pub fn check_named_columns(plan: &LogicalPlan) -> Result<()> {
    let mut trace = Trace::default();
    trace.origins(plan)?;
    for (provider, named) in trace.scans.iter().zip(&trace.named) {
        policy(provider)
            .expect("only policy tables are traced")
            .check_named(named)?;
    }
    Ok(())
}

fn policy(p: &Arc<dyn TableProvider>) -> Option<&PolicyTableProvider> {
    p.as_any().downcast_ref::<PolicyTableProvider>()
}

#[derive(Default)]
struct Trace {
    /// Policy tables scanned, one entry per scan.
    scans: Vec<Arc<dyn TableProvider>>,
    /// Columns named, per scan.
    named: Vec<BTreeSet<usize>>,
}

impl Trace {
    /// The table columns each output column of `plan` comes from; records every column
    /// its expressions (and those below it) name.
    fn origins(&mut self, plan: &LogicalPlan) -> Result<Vec<BTreeSet<Origin>>> {
        if let LogicalPlan::Dml(d) = plan
            && matches!(d.op, WriteOp::Delete | WriteOp::Update)
        {
            return Ok(vec![BTreeSet::new(); plan.schema().fields().len()]);
        }
        if let LogicalPlan::TableScan(scan) = plan {
            let width = scan.projected_schema.fields().len();
            let Ok(provider) = source_as_provider(&scan.source) else {
                return Ok(vec![BTreeSet::new(); width]);
            };
            if policy(&provider).is_none() {
                return Ok(vec![BTreeSet::new(); width]);
            }
            let id = self.scans.len();
            self.scans.push(provider);
            self.named.push(BTreeSet::new());
            let columns: Vec<usize> = match &scan.projection {
                Some(p) => p.clone(),
                None => (0..width).collect(),
            };
            // Filters a scan already carries name their columns too.
            let out: Vec<BTreeSet<Origin>> =
                columns.iter().map(|c| BTreeSet::from([(id, *c)])).collect();
            for f in &scan.filters {
                let refs = resolve(f, &[(plan, out.clone())]);
                self.name(&refs);
            }
            return Ok(out);
        }
        let inputs: Vec<(&LogicalPlan, Vec<BTreeSet<Origin>>)> = plan
            .inputs()
            .into_iter()
            .map(|i| Ok((i, self.origins(i)?)))
            .collect::<Result<_>>()?;
        // Subqueries inside this node's expressions are plans of their own.
        let mut subqueries = Vec::new();
        plan.apply_subqueries(|sub| {
            subqueries.push(sub.clone());
            Ok(TreeNodeRecursion::Jump)
        })?;
        for sub in &subqueries {
            self.origins(sub)?;
        }
        let exprs = plan.expressions();
        for e in &exprs {
            let refs = resolve(e, &inputs);
            self.name(&refs);
        }
        let width = plan.schema().fields().len();
        let all = || {
            inputs
                .iter()
                .flat_map(|(_, o)| o.iter().flatten().copied())
                .collect::<BTreeSet<Origin>>()
        };
        Ok(match plan {
            LogicalPlan::Projection(p) => p.expr.iter().map(|e| resolve(e, &inputs)).collect(),
            LogicalPlan::Aggregate(a) => {
                let mut out: Vec<BTreeSet<Origin>> = a
                    .group_expr
                    .iter()
                    .chain(&a.aggr_expr)
                    .map(|e| resolve(e, &inputs))
                    .collect();
                // Grouping sets add a grouping id: it comes from every group column.
                let grouped = all();
                out.resize(width, grouped);
                out
            }
            LogicalPlan::Window(w) => {
                let mut out = inputs.first().map(|(_, o)| o.clone()).unwrap_or_default();
                out.extend(w.window_expr.iter().map(|e| resolve(e, &inputs)));
                out
            }
            LogicalPlan::Union(_) => (0..width)
                .map(|i| {
                    inputs
                        .iter()
                        .filter_map(|(_, o)| o.get(i))
                        .flatten()
                        .copied()
                        .collect()
                })
                .collect(),
            _ => {
                let concat: Vec<BTreeSet<Origin>> =
                    inputs.iter().flat_map(|(_, o)| o.iter().cloned()).collect();
                let first = inputs.first().map(|(_, o)| o.clone()).unwrap_or_default();
                if concat.len() == width {
                    // Filter, Sort, Limit, SubqueryAlias, Distinct, Repartition, joins.
                    concat
                } else if first.len() == width {
                    // Semi and anti joins keep one side.
                    first
                } else if let Some((_, last)) = inputs.last()
                    && last.len() == width
                {
                    last.clone()
                } else {
                    // A node whose columns cannot be followed: each output may come
                    // from any input column (never fewer names than the statement has).
                    vec![all(); width]
                }
            }
        })
    }

    fn name(&mut self, refs: &BTreeSet<Origin>) {
        for (scan, column) in refs {
            self.named[*scan].insert(*column);
        }
    }
}

/// The table columns expression `e` reads: each of its column references, resolved
/// against the schema of the input that has it (outer references of a correlated
/// subquery are resolved by the outer query, where they are named too).
fn resolve(e: &Expr, inputs: &[(&LogicalPlan, Vec<BTreeSet<Origin>>)]) -> BTreeSet<Origin> {
    let mut out = BTreeSet::new();
    let mut columns: Vec<&Column> = e.column_refs().into_iter().collect();
    // A correlated subquery names the outer columns it compares with.
    let _ = e.apply(|x| {
        let sub = match x {
            Expr::ScalarSubquery(s) => Some(s),
            Expr::Exists(ex) => Some(&ex.subquery),
            Expr::InSubquery(i) => Some(&i.subquery),
            Expr::SetComparison(c) => Some(&c.subquery),
            _ => None,
        };
        for r in sub
            .map(|s| s.outer_ref_columns.as_slice())
            .unwrap_or_default()
        {
            if let Expr::OuterReferenceColumn(_, c) = r {
                columns.push(c);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    for c in columns {
        for (input, origins) in inputs {
            if let Ok(i) = input.schema().index_of_column(c) {
                if let Some(o) = origins.get(i) {
                    out.extend(o.iter().copied());
                }
                break;
            }
        }
    }
    out
}
