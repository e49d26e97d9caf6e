//! The policy's rules for what a statement writes, checked on the logical plan before
//! anything executes: protected columns the principal may not write stay NULL, a write
//! never copies values the principal sees masked into a table, and a decrypted
//! restricted column leaves its table (another table, `COPY ... TO`) only when the
//! table's `export` names the principal.

use std::sync::Arc;

use clearice_iceberg::Error;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{LogicalPlan, WriteOp};

use crate::policy_provider::PolicyTableProvider;

/// The policy provider behind a table source, if it is one.
fn policy_table(
    source: &Arc<dyn datafusion::logical_expr::TableSource>,
) -> Option<Arc<dyn datafusion::catalog::TableProvider>> {
    let p = source_as_provider(source).ok()?;
    p.as_any().downcast_ref::<PolicyTableProvider>()?;
    Some(p)
}

/// Whether a DML target is a catalog table under the policy (its writes follow the
/// policy's write rules).
pub fn is_policy_target(source: &Arc<dyn datafusion::logical_expr::TableSource>) -> bool {
    policy_table(source).is_some()
}

/// Checks the writes in `plan` against the policy before anything runs:
/// - an INSERT puts nothing but NULL into protected columns the principal may not write;
/// - a table write (INSERT, CTAS, MERGE) reads no column the principal sees masked, so
///   masked values never go back into a table (a `COPY` of them is what the principal
///   sees: allowed);
/// - `COPY ... TO`, or a write into another table, carries no decrypted protected
///   column out of its table unless the table's `export` lists the principal (otherwise
///   a copy into an unprotected table would publish it).
///
/// `optimize` turns an input plan into one whose scans name the columns they read.
pub fn check_statement(
    plan: &LogicalPlan,
    optimize: &dyn Fn(&LogicalPlan) -> Result<LogicalPlan>,
) -> Result<()> {
    // (input, the table written: None for COPY)
    let mut checks: Vec<(Arc<LogicalPlan>, Option<String>)> = Vec::new();
    let mut problem: Option<DataFusionError> = None;
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::Dml(d) if matches!(d.op, WriteOp::Insert(_) | WriteOp::Ctas) => {
                if let Some(p) = policy_table(&d.target) {
                    let p = p
                        .as_any()
                        .downcast_ref::<PolicyTableProvider>()
                        .expect("policy");
                    if let LogicalPlan::Projection(proj) = d.input.as_ref()
                        && let Err(e) = p.check_insert(&proj.expr)
                    {
                        problem = Some(e);
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    checks.push((Arc::clone(&d.input), Some(p.inner().name().to_owned())));
                }
            }
            LogicalPlan::Copy(c) => checks.push((Arc::clone(&c.input), None)),
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(e) = problem {
        return Err(e);
    }
    for (input, written) in checks {
        check_copied(&input, written.as_deref(), optimize)?;
    }
    Ok(())
}

/// Checks what a write copies from `input` (a plan whose scans are resolved): into a
/// table, no column the principal sees masked; no decrypted protected column leaving its table (for
/// another table `written`, or a file when `None`) unless the table's `export` allows.
pub(crate) fn check_copied(
    input: &LogicalPlan,
    written: Option<&str>,
    optimize: &dyn Fn(&LogicalPlan) -> Result<LogicalPlan>,
) -> Result<()> {
    let optimized = optimize(input)?;
    let mut problem: Option<DataFusionError> = None;
    optimized.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(p) = policy_table(&scan.source)
        {
            let p = p.as_any().downcast_ref::<PolicyTableProvider>().expect("policy");
            let projection = scan.projection.as_deref();
            let table = p.inner().name().to_owned();
            // Masked values written back into a table would replace the real ones (a
            // file export of what the principal sees is fine).
            if written.is_some()
                && let Some(c) = p.masked_columns(projection).first()
            {
                problem = Some(
                    Error::WriteDenied {
                        what: format!(
                            "column '{c}' of table '{table}' is masked for this principal; a write cannot copy masked values into a table"
                        ),
                        principal: p.principal().to_owned(),
                        rule: "masked values never go back into tables".into(),
                    }
                    .into(),
                );
                return Ok(TreeNodeRecursion::Stop);
            }
            // Decrypted values leaving their table (to a file, or another table) are
            // an export.
            if written != Some(table.as_str())
                && !p.may_export()
                && let Some(c) = p.decrypted_columns(projection).first()
            {
                problem = Some(
                    Error::WriteDenied {
                        what: format!(
                            "{} would copy restricted column '{c}' of table '{table}' out of it (decrypted, or as the principal reads it in plaintext)",
                            match written {
                                Some(t) => format!("writing into '{t}'"),
                                None => "COPY".to_owned(),
                            }
                        ),
                        principal: p.principal().to_owned(),
                        rule: "the table's `export` list does not name the principal".into(),
                    }
                    .into(),
                );
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(e) = problem {
        return Err(e);
    }
    Ok(())
}
