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
//! Of DELETE and UPDATE only the subqueries are traced: the target is checked column by
//! column by the row-level gate ([`crate::row_level`]), and UPDATE's input names every
//! column.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::Column;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, WriteOp};

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
    /// its expressions (and those below it) name. Deep plans (a long UNION chain) grow
    /// the stack instead of overflowing it, as DataFusion's own walks do.
    #[recursive::recursive]
    fn origins(&mut self, plan: &LogicalPlan) -> Result<Vec<BTreeSet<Origin>>> {
        if let LogicalPlan::Dml(d) = plan
            && matches!(d.op, WriteOp::Delete | WriteOp::Update)
        {
            let mut subqueries = Vec::new();
            d.input.apply(|node| {
                node.apply_subqueries(|sub| {
                    subqueries.push(sub.clone());
                    Ok(TreeNodeRecursion::Jump)
                })?;
                Ok(TreeNodeRecursion::Continue)
            })?;
            for sub in &subqueries {
                self.origins(sub)?;
            }
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
        // A LATERAL subquery (an input of its own) names the columns of its siblings it
        // refers to.
        for (input, _) in &inputs {
            if let LogicalPlan::Subquery(sub) = input {
                let refs = resolve_columns(&outer_refs(&sub.subquery), &inputs);
                self.name(&refs);
            }
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
            LogicalPlan::Join(j) => {
                let side = |i: usize| inputs.get(i).map(|(_, o)| o.clone()).unwrap_or_default();
                let mut out = match j.join_type {
                    JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => side(0),
                    JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => side(1),
                    JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                        let mut both = side(0);
                        both.extend(side(1));
                        both
                    }
                };
                // A mark column comes from the join condition.
                let on = all();
                out.resize(width, on);
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
    let mut columns: Vec<Column> = e.column_refs().into_iter().cloned().collect();
    // A correlated subquery names the outer columns it compares with, at any depth
    // below it (a reference two levels up is an outer reference of the inner one only).
    let _ = e.apply(|x| {
        let sub = match x {
            Expr::ScalarSubquery(s) => Some(s),
            Expr::Exists(ex) => Some(&ex.subquery),
            Expr::InSubquery(i) => Some(&i.subquery),
            Expr::SetComparison(c) => Some(&c.subquery),
            _ => None,
        };
        if let Some(sub) = sub {
            columns.extend(outer_refs(&sub.subquery));
        }
        Ok(TreeNodeRecursion::Continue)
    });
    resolve_columns(&columns, inputs)
}

/// Every outer reference in `plan` and its subqueries, at any depth.
fn outer_refs(plan: &LogicalPlan) -> Vec<Column> {
    let mut out = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            let _ = e.apply(|x| {
                if let Expr::OuterReferenceColumn(_, c) = x {
                    out.push(c.clone());
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// The table columns `columns` come from, each resolved against the input that has it
/// (one that none has belongs to a query further out, where it is resolved).
fn resolve_columns(
    columns: &[Column],
    inputs: &[(&LogicalPlan, Vec<BTreeSet<Origin>>)],
) -> BTreeSet<Origin> {
    let mut out = BTreeSet::new();
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
