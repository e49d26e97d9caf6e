//! Join and TopK dynamic filters applied to the rows a scan reads, not only to its
//! statistics.
//!
//! DataFusion 53 pushes the filter a hash join derives from its build side (and a TopK
//! from its heap) into the Parquet scan of the probe side. With `pushdown_filters` off
//! (ClearIce's default: row-level evaluation of static predicates inside the Parquet
//! reader measured slower, see `build_session`), the scan uses such a filter only to skip
//! files and row groups by their statistics: every row of a row group whose key range
//! overlaps the build side still flows up to the join, through whatever sits between.
//! TPC-H q17 aggregates all 6M `lineitem` rows into 200k parts before a join keeps the
//! 0.1 % of parts the query asks for.
//!
//! [`RowLevelDynamicFilters`] puts a [`DynamicFilterExec`] of a scan's dynamic filters
//! over the scan, or over the `FilterExec` of static predicates right above it (which
//! then runs first, so the dynamic filters see only its rows). Rows the join would drop
//! are dropped before the aggregates, repartitions and sorts on the way. A filter found to
//! pass nearly every row is switched off for the rest of the stream, so a join that keeps
//! most of its probe side pays for a sample only. Static predicates are left where
//! DataFusion put them. `SET clearice.row_level_dynamic_filters = false` turns it off per
//! session.
//!
//! Wrong rows are worse than a slow query:
//! - a filter is bound to the scan's output by position, and only to table columns the
//!   scan outputs as they are (a projection may compute or rename: `k + 1 AS k`);
//! - only filters whose keys are plain columns are applied (`100 / d` could fail on rows
//!   a `WHERE` removes before the join), and a batch the filter cannot be evaluated on
//!   passes through;
//! - two of DataFusion 53.1's dynamic filters are wrong for some rows, and were so for
//!   pruning already: a `min`/`max` aggregate's (built from some of the aggregates only,
//!   apache/datafusion#24816) is off in ClearIce's sessions ([`dynamic_filter_defaults`]),
//!   and plans with one get no row-level filters; a hash join's on `IS NOT DISTINCT FROM`
//!   keys (NULL keys fail it, apache/datafusion#22964) is taken out of the plan's scans.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::NullEquality;
use datafusion::common::config::{ConfigOptions, OptimizerOptions};
use datafusion::common::plan_err;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfigBuilder;
use datafusion::datasource::physical_plan::{FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_expr::expressions::{Column, lit};
use datafusion::physical_expr::utils::conjunction_opt;
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::FutureExt;

use clearice_iceberg::exec::map_batches;

use crate::options::ClearIceOptions;

/// Rows a complete filter is sampled on before it may be switched off.
const SAMPLE_ROWS: usize = 1 << 16;

/// Dynamic filter settings of ClearIce's sessions: DataFusion's, except the filter of a
/// `min`/`max` aggregate without `GROUP BY`. DataFusion 53.1 builds it from the aggregates
/// over plain columns only, so it prunes pages and row groups that the others need:
/// `SELECT min(k), max(v + 1)` answered a smaller `max` (apache/datafusion#24816).
pub fn dynamic_filter_defaults(optimizer: &mut OptimizerOptions) {
    optimizer.enable_aggregate_dynamic_filter_pushdown = false;
}

/// Drops the rows of its input that fail dynamic filters (each evaluated as it is when
/// the batch arrives). Once every filter is complete (a hash join's build side is) and
/// 64 Ki rows (`SAMPLE_ROWS`) have shown that at least 9 in 10 pass, it passes the rest of its
/// stream through unfiltered: the join above drops them anyway.
#[derive(Debug)]
pub struct DynamicFilterExec {
    predicate: Arc<dyn PhysicalExpr>,
    input: Arc<dyn ExecutionPlan>,
    metrics: ExecutionPlanMetricsSet,
}

impl DynamicFilterExec {
    /// `input` filtered by `predicate`, a conjunction of dynamic filters over its schema.
    pub fn new(predicate: Arc<dyn PhysicalExpr>, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            predicate,
            input,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for DynamicFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DynamicFilterExec: {}", self.predicate)
    }
}

impl ExecutionPlan for DynamicFilterExec {
    fn name(&self) -> &str {
        "DynamicFilterExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn partition_statistics(
        &self,
        partition: Option<usize>,
    ) -> Result<datafusion::common::Statistics> {
        // Fewer rows may come out: the input's figures as bounds.
        Ok(self.input.partition_statistics(partition)?.to_inexact())
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&self.predicate),
            children.swap_remove(0),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let mut filter = Sampled {
            predicate: Arc::clone(&self.predicate),
            filters: split_conjunction(&self.predicate)
                .into_iter()
                .map(Arc::clone)
                .collect(),
            complete: false,
            seen: 0,
            passed: 0,
            off: false,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            unfiltered: MetricBuilder::new(&self.metrics).counter("unfiltered_rows", partition),
        };
        Ok(map_batches(input, schema, move |batch| filter.apply(batch)))
    }
}

/// One partition's filtering state.
struct Sampled {
    predicate: Arc<dyn PhysicalExpr>,
    filters: Vec<Arc<dyn PhysicalExpr>>,
    /// Every filter is complete (a join's build side is built).
    complete: bool,
    /// Rows seen and passed since every filter became complete.
    seen: usize,
    passed: usize,
    /// Switched off: batches pass as they are.
    off: bool,
    baseline: BaselineMetrics,
    /// Rows passed through after the filter was switched off.
    unfiltered: Count,
}

impl Sampled {
    fn apply(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        if self.off {
            self.unfiltered.add(batch.num_rows());
            self.baseline.record_output(batch.num_rows());
            return Ok(batch);
        }
        let _timer = self.baseline.elapsed_compute().timer();
        let rows = batch.num_rows();
        // The filter reads plain columns only, but it may see rows that predicates below
        // the join would have removed: if it cannot be evaluated, the batch passes as it
        // would without the filter, and the statement decides.
        let mask = self
            .predicate
            .evaluate(&batch)
            .and_then(|v| v.into_array(rows))
            .ok()
            .filter(|m| m.data_type() == &DataType::Boolean);
        let Some(mask) = mask else {
            self.unfiltered.add(rows);
            self.baseline.record_output(rows);
            return Ok(batch);
        };
        let mask = mask.as_boolean();
        let passed = mask.true_count();
        // A filter still being tightened (a TopK's) is never switched off. Once complete,
        // a filter stays so for the stream's life.
        self.complete = self.complete
            || self.filters.iter().all(|f| {
                f.as_any()
                    .downcast_ref::<DynamicFilterPhysicalExpr>()
                    .is_some_and(|d| d.wait_complete().now_or_never().is_some())
            });
        if self.complete {
            self.seen += batch.num_rows();
            self.passed += passed;
            self.off = self.seen >= SAMPLE_ROWS && self.passed * 10 >= self.seen * 9;
        }
        let out = if passed == batch.num_rows() {
            batch
        } else {
            filter_record_batch(&batch, mask)?
        };
        self.baseline.record_output(out.num_rows());
        Ok(out)
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct RowLevelDynamicFilters {
    /// Plan [`DynamicFilterExec`]s; without, only take the filters DataFusion gets wrong
    /// out of the scans (distributed plans, whose scans run on workers).
    rows: bool,
}

impl RowLevelDynamicFilters {
    /// The rule for plans run in this process.
    pub fn new() -> Self {
        Self { rows: true }
    }

    /// The rule without row-level filters: plans with an `IS NOT DISTINCT FROM` join only
    /// lose their scans' dynamic filters.
    pub fn pruning_only() -> Self {
        Self { rows: false }
    }
}

impl Default for RowLevelDynamicFilters {
    fn default() -> Self {
        Self::new()
    }
}

/// A scan's dynamic filters bound to its output: columns by position, not by name.
struct ScanFilters {
    /// Each filter conjunct, over the table's columns.
    dynamic: Vec<Arc<dyn PhysicalExpr>>,
    /// Output position of each table column the scan outputs as it is (a plain column,
    /// whatever its alias); `None`: the scan outputs the table's columns in order.
    outputs: Option<Vec<(usize, usize)>>,
}

impl ScanFilters {
    /// The dynamic filters of `plan`'s scan, if it is a Parquet scan that prunes with
    /// them only.
    fn of(plan: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let scan = plan.as_any().downcast_ref::<DataSourceExec>()?;
        let (_, source) = scan.downcast_to_file_source::<ParquetSource>()?;
        if source.table_parquet_options().global.pushdown_filters {
            return None;
        }
        let filter = source.filter()?;
        let dynamic: Vec<_> = split_conjunction(&filter)
            .into_iter()
            .filter(|e| e.as_any().is::<DynamicFilterPhysicalExpr>())
            // Keys that are expressions (`100 / d`, casts) could fail on rows that other
            // predicates remove first; plain columns cannot.
            .filter(|e| e.children().iter().all(|c| c.as_any().is::<Column>()))
            .map(Arc::clone)
            .collect();
        if dynamic.is_empty() {
            return None;
        }
        // The projection may compute or rename (`k + 1 AS k`): only a table column output
        // as a plain column is the value the filter reads.
        let outputs = source.projection().map(|p| {
            p.iter()
                .enumerate()
                .filter_map(|(at, e)| {
                    let c = e.expr.as_any().downcast_ref::<Column>()?;
                    Some((c.index(), at))
                })
                .collect()
        });
        Some(Self { dynamic, outputs })
    }

    /// The filters over the scan's output, then through `select` (a `FilterExec`'s
    /// projection: positions of the scan's output); `None` if a column they read is not
    /// there as it is.
    fn bind(&self, select: Option<&[usize]>) -> Option<Arc<dyn PhysicalExpr>> {
        let position = |c: &Column| {
            let at = match &self.outputs {
                None => Some(c.index()),
                Some(outputs) => outputs
                    .iter()
                    .find(|(t, _)| *t == c.index())
                    .map(|(_, at)| *at),
            }?;
            match select {
                None => Some(at),
                Some(select) => select.iter().position(|s| *s == at),
            }
        };
        let bound = self
            .dynamic
            .iter()
            .map(|e| {
                Arc::clone(e)
                    .transform_down(|e| match e.as_any().downcast_ref::<Column>() {
                        Some(c) => match position(c) {
                            Some(at) => Ok(Transformed::yes(
                                Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>
                            )),
                            None => plan_err!("column {} not output as it is", c.name()),
                        },
                        None => Ok(Transformed::no(e)),
                    })
                    .data()
                    .ok()
            })
            .collect::<Option<Vec<_>>>()?;
        conjunction_opt(bound)
    }
}

impl RowLevelDynamicFilters {
    fn rewrite(plan: Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let done =
            |p: Arc<dyn ExecutionPlan>| Ok(Transformed::new(p, true, TreeNodeRecursion::Jump));
        let filtered = |predicate, input| -> Arc<dyn ExecutionPlan> {
            Arc::new(DynamicFilterExec::new(predicate, input))
        };
        // Over the scan's static filter if the columns are still there, else under it.
        if let Some(filter) = plan.as_any().downcast_ref::<FilterExec>()
            && let Some(scan) = ScanFilters::of(filter.input())
        {
            let select = filter.projection().as_ref().map(|p| p.to_vec());
            if let Some(predicate) = scan.bind(select.as_deref()) {
                return done(filtered(predicate, plan));
            }
            if let Some(predicate) = scan.bind(None) {
                let under = filtered(predicate, Arc::clone(filter.input()));
                return done(Arc::clone(&plan).with_new_children(vec![under])?);
            }
            return Ok(Transformed::new(plan, false, TreeNodeRecursion::Jump));
        }
        if let Some(scan) = ScanFilters::of(&plan)
            && let Some(predicate) = scan.bind(None)
        {
            return done(filtered(predicate, plan));
        }
        Ok(Transformed::no(plan))
    }

    /// Whether `plan` holds a `min`/`max` aggregate without `GROUP BY` (a session may
    /// `SET` its dynamic filter back on: see [`dynamic_filter_defaults`]; the filter also
    /// outlives a recursive query's iterations). Such plans get no row-level filters.
    fn has_extreme_aggregate(plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.exists(|node| {
            Ok(node
                .as_any()
                .downcast_ref::<AggregateExec>()
                .is_some_and(|agg| {
                    agg.group_expr().is_empty()
                        && agg.aggr_expr().iter().any(|a| {
                            let name = a.fun().name();
                            name.eq_ignore_ascii_case("min") || name.eq_ignore_ascii_case("max")
                        })
                }))
        })
        .unwrap_or(true)
    }

    /// Whether `plan` holds a hash join on `IS NOT DISTINCT FROM` keys. DataFusion 53.1
    /// gives it a dynamic filter too (apache/datafusion#22964): bounds and membership
    /// that a NULL key fails, so scans prune pages and row groups of NULL keys that
    /// match NULL.
    fn has_null_equal_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.exists(|node| {
            Ok(node
                .as_any()
                .downcast_ref::<HashJoinExec>()
                .is_some_and(|j| j.null_equality() == NullEquality::NullEqualsNull))
        })
        .unwrap_or(true)
    }

    /// `plan`'s Parquet scans without their dynamic filters (their static predicates
    /// kept): for plans with a [`Self::has_null_equal_join`].
    fn without_dynamic_filters(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(scan) = node.as_any().downcast_ref::<DataSourceExec>() else {
                return Ok(Transformed::no(node));
            };
            let Some((config, source)) = scan.downcast_to_file_source::<ParquetSource>() else {
                return Ok(Transformed::no(node));
            };
            let Some(filter) = source.filter() else {
                return Ok(Transformed::no(node));
            };
            let conjuncts = split_conjunction(&filter);
            let kept: Vec<_> = conjuncts
                .iter()
                .filter(|e| !e.as_any().is::<DynamicFilterPhysicalExpr>())
                .map(|e| Arc::clone(e))
                .collect();
            if kept.len() == conjuncts.len() {
                return Ok(Transformed::no(node));
            }
            let predicate = conjunction_opt(kept).unwrap_or_else(|| lit(true));
            let config = FileScanConfigBuilder::from(config.clone())
                .with_source(Arc::new(source.with_predicate(predicate)))
                .build();
            Ok(Transformed::yes(
                DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
            ))
        })
        .data()
    }
}

impl PhysicalOptimizerRule for RowLevelDynamicFilters {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let on = config
            .extensions
            .get::<ClearIceOptions>()
            .is_none_or(|o| o.row_level_dynamic_filters);
        if Self::has_null_equal_join(&plan) {
            return Self::without_dynamic_filters(plan);
        }
        if !self.rows
            || !on
            || config.execution.parquet.pushdown_filters
            || Self::has_extreme_aggregate(&plan)
        {
            return Ok(plan);
        }
        plan.transform_down(Self::rewrite).data()
    }

    fn name(&self) -> &str {
        "row_level_dynamic_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::execution::session_state::SessionStateBuilder;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A session with the rule, and Parquet tables: `big` (300,000 rows, each key of
    /// 0..100,000 three times, scattered over one row group, so statistics prune nothing),
    /// `small` (3 keys), `dim` (every key once), `nulls` (`big` with the keys of its
    /// last 50,000 rows NULL: whole pages of NULL keys), `small_nulls` (5 and NULL) and
    /// `zeros` (`d` = 0..9, each 10,000 times).
    async fn session(dir: &std::path::Path) -> Result<SessionContext> {
        let mut config = SessionConfig::new()
            .with_target_partitions(2)
            .with_option_extension(ClearIceOptions::default());
        dynamic_filter_defaults(&mut config.options_mut().optimizer);
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(RowLevelDynamicFilters::new()))
            .build();
        let ctx = SessionContext::new_with_state(state);
        let d = dir.display();
        for (name, query) in [
            (
                "big",
                "SELECT (value * 7919) % 100000 AS k, value AS v FROM generate_series(0, 299999)",
            ),
            (
                "small",
                "SELECT * FROM (VALUES (5), (50000), (99999)) AS t(k)",
            ),
            ("dim", "SELECT value AS k FROM generate_series(0, 99999)"),
            (
                "nulls",
                "SELECT CASE WHEN value >= 250000 THEN NULL ELSE (value * 7919) % 100000 END AS k, \
                 value AS v FROM generate_series(0, 299999)",
            ),
            ("small_nulls", "SELECT * FROM (VALUES (5), (NULL)) AS t(k)"),
            (
                "zeros",
                "SELECT value % 10 AS d FROM generate_series(0, 99999)",
            ),
        ] {
            ctx.sql(&format!(
                "COPY ({query}) TO '{d}/{name}.parquet' STORED AS PARQUET"
            ))
            .await?
            .collect()
            .await?;
            ctx.register_parquet(name, format!("{d}/{name}.parquet"), Default::default())
                .await?;
        }
        Ok(ctx)
    }

    /// Rows out of each `DynamicFilterExec`, and rows it let through unfiltered.
    fn filtered(plan: &Arc<dyn ExecutionPlan>) -> Vec<(usize, usize)> {
        let mut rows = Vec::new();
        if plan.as_any().is::<DynamicFilterExec>() {
            let m = plan.metrics().expect("metrics");
            let unfiltered = m.sum_by_name("unfiltered_rows").map_or(0, |v| v.as_usize());
            rows.push((m.output_rows().unwrap_or(0), unfiltered));
        }
        for child in plan.children() {
            rows.extend(filtered(child));
        }
        rows
    }

    /// `sql`'s rows (two BIGINT columns) and what the dynamic filters did.
    async fn run(
        ctx: &SessionContext,
        sql: &str,
    ) -> Result<(Vec<(i64, i64)>, Vec<(usize, usize)>)> {
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let batches: Vec<RecordBatch> = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        let rows = batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_primitive::<Int64Type>();
                let c = b.column(1).as_primitive::<Int64Type>();
                (0..b.num_rows())
                    .map(|i| (a.value(i), c.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok((rows, filtered(&plan)))
    }

    async fn set(ctx: &SessionContext, name: &str, value: bool) -> Result<()> {
        ctx.sql(&format!("SET {name} = {value}"))
            .await?
            .collect()
            .await?;
        Ok(())
    }

    const SELECTIVE: &str =
        "SELECT b.k, b.v FROM small s JOIN big b ON s.k = b.k ORDER BY b.k, b.v";

    #[tokio::test]
    async fn a_joins_dynamic_filter_drops_probe_rows_over_the_scan() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ctx = session(dir.path()).await?;
        let expected: Vec<(i64, i64)> = (0..300_000i64)
            .map(|v| (v * 7919 % 100_000, v))
            .filter(|(k, _)| [5, 50_000, 99_999].contains(k))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(expected.len(), 9);

        // One filter over `big`'s scan, passing only the 9 rows the join keeps.
        assert_eq!(
            run(&ctx, SELECTIVE).await?,
            (expected.clone(), vec![(9, 0)])
        );

        // Off: the same answer, no filter over the scan (the join drops the rows).
        set(&ctx, "clearice.row_level_dynamic_filters", false).await?;
        assert_eq!(run(&ctx, SELECTIVE).await?, (expected.clone(), vec![]));

        // With the Parquet reader's own row filters, the scan applies them itself.
        set(&ctx, "clearice.row_level_dynamic_filters", true).await?;
        set(&ctx, "datafusion.execution.parquet.pushdown_filters", true).await?;
        assert_eq!(run(&ctx, SELECTIVE).await?, (expected, vec![]));
        Ok(())
    }

    #[tokio::test]
    async fn a_filter_that_keeps_nearly_every_row_is_switched_off_after_a_sample() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ctx = session(dir.path()).await?;
        let (rows, filters) = run(
            &ctx,
            "SELECT count(*), sum(b.v) FROM dim d JOIN big b ON d.k = b.k",
        )
        .await?;
        assert_eq!(rows, vec![(300_000, (0..300_000i64).sum())]);
        // Every row passed; after the sample, most passed unfiltered.
        let [(out, unfiltered)] = filters[..] else {
            panic!("one dynamic filter expected: {filters:?}");
        };
        assert_eq!(out, 300_000);
        assert!(
            unfiltered > 0 && unfiltered <= 300_000 - SAMPLE_ROWS,
            "{unfiltered} rows unfiltered"
        );
        Ok(())
    }

    /// `big`'s rows as (k, v), in `v` order.
    fn big() -> impl Iterator<Item = (i64, i64)> {
        (0..300_000i64).map(|v| (v * 7919 % 100_000, v))
    }

    #[tokio::test]
    async fn filters_read_the_scans_columns_not_columns_it_computes_under_their_names() -> Result<()>
    {
        let dir = tempfile::tempdir()?;
        let ctx = session(dir.path()).await?;
        // `k + 1000 AS k`: whether DataFusion computes it over the scan (53.1 does, in a
        // ProjectionExec) or in the scan's own projection, the join's filter on the output
        // `k` must not read the table's `k`.
        let mut expected: Vec<(i64, i64)> = big()
            .map(|(k, v)| (k + 1000, v))
            .filter(|(k, _)| [5, 50_000, 99_999].contains(k))
            .collect();
        expected.sort();
        assert_eq!(expected.len(), 6);
        let (rows, _) = run(
            &ctx,
            "SELECT s.k, b.v FROM small s JOIN (SELECT k + 1000 AS k, v FROM big) b \
             ON s.k = b.k ORDER BY s.k, b.v",
        )
        .await?;
        assert_eq!(rows, expected);
        // A TopK over a negated key.
        let mut expected: Vec<(i64, i64)> = big().map(|(k, v)| (-k, v)).collect();
        expected.sort();
        expected.truncate(5);
        let (rows, _) = run(
            &ctx,
            "SELECT k, v FROM (SELECT -k AS k, v FROM big) ORDER BY k, v LIMIT 5",
        )
        .await?;
        assert_eq!(rows, expected);
        Ok(())
    }

    #[tokio::test]
    async fn dynamic_filters_datafusion_gets_wrong_are_not_planned() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ctx = session(dir.path()).await?;
        // A `min`/`max` aggregate's filter would cover `min(k)` only
        // (apache/datafusion#24816): ClearIce's sessions plan none.
        let (rows, filters) = run(&ctx, "SELECT min(k), max(v + 1) FROM big").await?;
        assert_eq!((rows, filters), (vec![(0, 300_000)], vec![]));
        // NULL keys match on IS NOT DISTINCT FROM: the join's filter would prune the pages
        // of NULL keys (apache/datafusion#22964); such plans' scans lose it.
        let matched: Vec<i64> = big()
            .map(|(k, v)| ((v < 250_000).then_some(k), v))
            .filter(|(k, _)| k.is_none() || *k == Some(5))
            .map(|(_, v)| v)
            .collect();
        let (rows, filters) = run(
            &ctx,
            "SELECT count(*), sum(b.v) FROM small_nulls s JOIN nulls b \
             ON s.k IS NOT DISTINCT FROM b.k",
        )
        .await?;
        assert_eq!(
            (rows, filters),
            (vec![(matched.len() as i64, matched.iter().sum())], vec![])
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_key_that_fails_on_rows_a_predicate_removes_gets_no_row_filter() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ctx = session(dir.path()).await?;
        // `100 / d` fails where `d = 0`, rows the WHERE removes before the join sees them.
        let (rows, filters) = run(
            &ctx,
            "SELECT count(*), sum(b.q) FROM (VALUES (20), (50)) AS s(k) \
             JOIN (SELECT 100 / d AS q FROM zeros WHERE d <> 0) b ON s.k = b.q",
        )
        .await?;
        assert_eq!((rows, filters), (vec![(20_000, 700_000)], vec![]));
        Ok(())
    }
}
