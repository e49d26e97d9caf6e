//! SQL writes to Iceberg tables: append, and DELETE/UPDATE by copy-on-write.
//!
//! ```text
//!  INSERT INTO t SELECT ...  ──▶ a WriteTarget (decided by clearice-access: the table's
//!                                   │  `write` permission, refused before any IO)
//!                                   ▼
//!                             IcebergWriteExec ── rows, cut at the target file size
//!                                   │             (`write.target-file-size-bytes`)
//!                                   ▼
//!                             FileWriter: PME per the policy's keys, one file per
//!                                   │     partition value, encoded on blocking threads
//!                                   ▼
//!                             one Iceberg commit (fast append, retried on conflict);
//!                             any failure removes every file written
//! ```
//!
//! What a principal may write is decided above this crate (`clearice-access`), which
//! hands over a [`WriteTarget`]; nothing here reads the policy.

use std::any::Any;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use clearice_crypto::{Kms, ScanGrant};
use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array, new_null_array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{FutureExt, StreamExt};
use iceberg::Catalog;
use iceberg::spec::{DataFile, Struct};
use iceberg::table::Table;

use crate::error::Error;
use crate::provider::IcebergTableProvider;
use crate::report::WriteAudit;
use crate::write::{EncryptionSpec, FileWriter, WriteProviders, commit_append};

/// Iceberg's table property for the size of data files.
pub const TARGET_FILE_SIZE: &str = "write.target-file-size-bytes";
/// Iceberg's default target file size.
const DEFAULT_TARGET_FILE_SIZE: u64 = 512 * 1024 * 1024;
/// Files are encoded in memory: the Arrow data buffered for one file is capped here.
const MAX_BUFFERED_BYTES: u64 = 256 * 1024 * 1024;
/// Files encoded at once by one statement.
const FILES_IN_FLIGHT: usize = 2;

/// Everything one write needs, decided when the statement was planned.
pub struct WriteTarget {
    /// `catalog.namespace.table`.
    pub name: String,
    /// Where the commit goes.
    pub catalog: Arc<dyn Catalog>,
    /// The table as loaded when the statement was planned.
    pub table: Table,
    /// The policy's encryption of the table's files.
    pub spec: EncryptionSpec,
    /// Wraps the files' data keys.
    pub kms: Option<Arc<dyn Kms>>,
    /// Providers holding column keys, and who writes.
    pub providers: WriteProviders,
    /// Columns (current names) the principal may not write: any non-NULL value fails.
    pub must_be_null: Vec<String>,
    /// Filled in when the write commits.
    pub audit: WriteAudit,
    /// The table's files as the principal's row-level writes read them (all columns
    /// decrypted: the principal may write every protected column, or such writes are
    /// refused when planned).
    pub source: IcebergTableProvider,
    /// What the rewrite scans may decrypt, and as whom.
    pub grant: ScanGrant,
    /// The rows the writer may change, when not all of them (a row filter): a DELETE or
    /// UPDATE finds and changes only those, and copies the others as they are.
    pub gate: Option<Arc<dyn RowGate>>,
}

/// The rows of a table a writer may change (decided above this crate: a row filter).
/// Applied to the row-level write's scans, inside them, so the statement's condition and
/// new values are evaluated on those rows only (a condition failing on another row would
/// tell it exists) and the other rows are copied untouched.
pub trait RowGate: Send + Sync + fmt::Debug {
    /// `scan` (the table's columns in order, then any columns the write adds) cut to the
    /// rows the writer may change (`changeable`), or to all the others.
    fn apply(
        &self,
        scan: Arc<dyn ExecutionPlan>,
        changeable: bool,
    ) -> Result<Arc<dyn ExecutionPlan>>;
}

impl fmt::Debug for WriteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTarget")
            .field("name", &self.name)
            .field("encrypted_columns", &self.spec.column_keys.keys())
            .finish_non_exhaustive()
    }
}

impl WriteTarget {
    fn err(&self, reason: String) -> Error {
        Error::InvalidWrite {
            table: self.name.clone(),
            reason,
        }
    }

    /// Arrow bytes buffered before a file is cut.
    fn file_bytes(&self) -> u64 {
        self.table
            .metadata()
            .properties()
            .get(TARGET_FILE_SIZE)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(DEFAULT_TARGET_FILE_SIZE)
            .clamp(1, MAX_BUFFERED_BYTES)
    }

    /// `batch` in the table's schema: columns by name, absent ones NULL, types cast.
    fn conform(&self, batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, Error> {
        let rows = batch.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let column = match batch.column_by_name(field.name()) {
                Some(c) if c.data_type() == field.data_type() => Arc::clone(c),
                Some(c) => datafusion::arrow::compute::cast(c, field.data_type()).map_err(|e| {
                    self.err(format!(
                        "column '{}' ({}) cannot hold the values written ({}): {e}",
                        field.name(),
                        field.data_type(),
                        c.data_type()
                    ))
                })?,
                None => new_null_array(field.data_type(), rows),
            };
            if !field.is_nullable() && column.null_count() > 0 {
                return Err(self.err(format!(
                    "column '{}' is required (NOT NULL) but the statement writes NULL into it",
                    field.name()
                )));
            }
            if column.null_count() < rows && self.must_be_null.iter().any(|c| c == field.name()) {
                return Err(Error::WriteDenied {
                    what: format!(
                        "column '{}' of table '{}' may not be written",
                        field.name(),
                        self.name
                    ),
                    principal: self.providers.context.principal.clone(),
                    rule: "a protected column is written only by its `write` list".into(),
                });
            }
            columns.push(column);
        }
        RecordBatch::try_new(Arc::clone(schema), columns).map_err(|e| self.err(e.to_string()))
    }

    /// Writes every row of `input` and commits them in one snapshot (`commit`); returns
    /// the rows written. Nothing is committed, and every file written is removed, on
    /// failure.
    pub async fn run(
        &self,
        mut input: SendableRecordBatchStream,
        commit: Commit,
        pool: &Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    ) -> Result<u64> {
        // The rows buffered and being encoded count against the query's memory limit.
        let reservation = datafusion::execution::memory_pool::MemoryConsumer::new(format!(
            "IcebergWrite[{}]",
            self.name
        ))
        .register(pool);
        let mut writer = FileWriter::try_new(
            &self.table,
            self.spec.clone(),
            self.kms.clone(),
            self.providers.clone(),
        )?;
        // Rows a row-level write copies in a format 3 table carry their lineage (its
        // rewrite scan adds the columns, see `row_level`).
        if matches!(commit, Commit::Replace { .. }) && self.source.tracks_lineage() {
            let input_schema = input.schema();
            if crate::lineage::fields()
                .iter()
                .any(|f| input_schema.index_of(f.name()).is_err())
            {
                return Err(self
                    .err("the rows to rewrite lack their lineage columns (format 3)".into())
                    .into());
            }
            writer = writer.with_lineage();
        }
        let result = async {
            let schema = Arc::clone(writer.schema());
            let cut = self.file_bytes();
            let (mut pending, mut pending_bytes, mut rows) = (Vec::new(), 0u64, 0u64);
            let mut counted = 0u64;
            let mut files = Vec::new();
            let mut in_flight = futures::stream::FuturesUnordered::new();
            while let Some(batch) = input.next().await {
                let batch = batch?;
                if batch.num_rows() == 0 {
                    continue;
                }
                if let Some(c) = batch.column_by_name(COUNTED)
                    && let Some(flags) = c
                        .as_any()
                        .downcast_ref::<datafusion::arrow::array::BooleanArray>()
                {
                    counted += flags.true_count() as u64;
                }
                let batch = self.conform(&batch, &schema)?;
                rows += batch.num_rows() as u64;
                let size = batch.get_array_memory_size();
                reservation.try_grow(size)?;
                pending_bytes += size as u64;
                pending.push(batch);
                if pending_bytes >= cut {
                    let chunk = std::mem::take(&mut pending);
                    let bytes = std::mem::take(&mut pending_bytes) as usize;
                    in_flight.push(writer.write(chunk).map(move |r| (r, bytes)).boxed());
                    while in_flight.len() >= FILES_IN_FLIGHT {
                        let (done, bytes) = in_flight.next().await.expect("in flight");
                        files.extend(done?);
                        reservation.shrink(bytes);
                    }
                }
            }
            if !pending.is_empty() {
                let bytes = pending_bytes as usize;
                in_flight.push(writer.write(pending).map(move |r| (r, bytes)).boxed());
            }
            while let Some((done, bytes)) = in_flight.next().await {
                files.extend(done?);
                reservation.shrink(bytes);
            }
            pause_before_commit(&files).await;
            let properties = BTreeMap::from([(
                "clearice.principal".to_owned(),
                self.providers.context.principal.clone(),
            )]);
            let committed = match commit {
                Commit::Append if files.is_empty() => {
                    self.audit.committed(None, 0);
                    return Ok(0);
                }
                Commit::Append if crate::native::table_key_id(self.table.metadata()).is_some() => {
                    // iceberg-rust's append cannot encrypt manifests: ClearIce's commit.
                    let committer = self.source.committer().ok_or_else(|| Error::Unsupported {
                        table: self.name.clone(),
                        what: "appending to a table loaded outside a catalog".into(),
                    })?;
                    let m = crate::commit::commit_overwrite(
                        committer,
                        &self.name,
                        &self.table,
                        &HashSet::new(),
                        files,
                        iceberg::spec::Operation::Append,
                        properties.into_iter().collect(),
                    )
                    .await?;
                    self.audit.committed(m.current_snapshot_id(), rows);
                    return Ok(rows);
                }
                Commit::Append => {
                    commit_append(self.catalog.as_ref(), &self.table, files, properties)
                        .await?
                        .metadata()
                        .current_snapshot_id()
                }
                Commit::Replace { removed, reported } => {
                    if removed.is_empty() && files.is_empty() {
                        self.audit.committed(None, 0);
                        return Ok(reported.unwrap_or(0) + counted);
                    }
                    let operation = if files.is_empty() {
                        iceberg::spec::Operation::Delete
                    } else {
                        iceberg::spec::Operation::Overwrite
                    };
                    let committer = self.source.committer().ok_or_else(|| Error::Unsupported {
                        table: self.name.clone(),
                        what: "removing data files from a table loaded outside a catalog".into(),
                    })?;
                    let m = crate::commit::commit_overwrite(
                        committer,
                        &self.name,
                        &self.table,
                        &removed,
                        files,
                        operation,
                        properties.into_iter().collect(),
                    )
                    .await?;
                    let rows = reported.map_or(rows, |r| r + counted);
                    self.audit.committed(m.current_snapshot_id(), rows);
                    return Ok(rows);
                }
                Commit::Overwrite => {
                    let removed = self.replaced_files(&files).await?;
                    if removed.is_empty() && files.is_empty() {
                        // Nothing written into a partitioned table: nothing replaced.
                        self.audit.committed(None, 0);
                        return Ok(0);
                    }
                    let committer = self.source.committer().ok_or_else(|| Error::Unsupported {
                        table: self.name.clone(),
                        what: "removing data files from a table loaded outside a catalog".into(),
                    })?;
                    crate::commit::commit_overwrite(
                        committer,
                        &self.name,
                        &self.table,
                        &removed,
                        files,
                        iceberg::spec::Operation::Overwrite,
                        properties.into_iter().collect(),
                    )
                    .await?
                    .current_snapshot_id()
                }
            };
            self.audit.committed(committed, rows);
            Ok(rows)
        }
        .await;
        if result.is_err() {
            writer.abort().await;
        }
        result
    }
}

/// A boolean column a write's input may carry: rows where it is true are counted in the
/// rows the statement reports (MERGE's inserts); it is not written.
pub const COUNTED: &str = "__clearice_counted";

/// How a write commits.
pub enum Commit {
    /// Add the files (INSERT, CREATE TABLE AS).
    Append,
    /// Replace what the new files overwrite (INSERT OVERWRITE): every data file of an
    /// unpartitioned table; of a partitioned one, the files of the partitions written.
    Overwrite,
    /// Remove `removed` and add the new files (DELETE, UPDATE); `reported`: the rows
    /// the statement reports (deleted or updated), if not the rows written.
    Replace {
        /// Data files the commit removes.
        removed: HashSet<String>,
        /// Rows the statement reports, when not the rows written.
        reported: Option<u64>,
    },
}

impl WriteTarget {
    /// The data files an INSERT OVERWRITE writing `files` replaces.
    async fn replaced_files(&self, files: &[DataFile]) -> Result<HashSet<String>, Error> {
        let m = self.table.metadata();
        let spec_id = m.default_partition_spec_id();
        let unpartitioned = m.default_partition_spec().fields().is_empty();
        let written: HashSet<&Struct> = files.iter().map(DataFile::partition).collect();
        let ierr = |source: iceberg::Error| Error::Iceberg {
            table: self.name.clone(),
            source: Box::new(source),
        };
        let mut out = HashSet::new();
        let Some(snapshot) = m.current_snapshot() else {
            return Ok(out);
        };
        let list = self
            .table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(ierr)?;
        for mf in list.entries() {
            if mf.content != iceberg::spec::ManifestContentType::Data {
                continue;
            }
            let manifest = mf.load_manifest(self.table.file_io()).await.map_err(ierr)?;
            for e in manifest.entries() {
                if !e.is_alive() {
                    continue;
                }
                let f = e.data_file();
                if unpartitioned
                    || (mf.partition_spec_id == spec_id && written.contains(f.partition()))
                {
                    out.insert(e.file_path().to_owned());
                }
            }
        }
        Ok(out)
    }
}

/// Writes its input into an Iceberg table and returns one row: `count` (UInt64), the rows
/// written, as DataFusion's `insert_into` contract asks.
#[derive(Debug)]
pub struct IcebergWriteExec {
    input: Arc<dyn ExecutionPlan>,
    target: Arc<WriteTarget>,
    overwrite: bool,
    properties: Arc<PlanProperties>,
}

/// The schema of a write's result.
pub fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

/// One partition producing the `count` row once its work is done.
fn count_properties() -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(count_schema()),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}

impl IcebergWriteExec {
    /// A write of `input` into `target` (`overwrite`: INSERT OVERWRITE).
    pub fn new(input: Arc<dyn ExecutionPlan>, target: Arc<WriteTarget>, overwrite: bool) -> Self {
        Self {
            input,
            target,
            overwrite,
            properties: count_properties(),
        }
    }
}

impl DisplayAs for IcebergWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IcebergWriteExec: table={}, mode={}, encrypted_columns=[{}]",
            self.target.name,
            if self.overwrite {
                "overwrite"
            } else {
                "append"
            },
            self.target
                .spec
                .column_keys
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl ExecutionPlan for IcebergWriteExec {
    fn name(&self) -> &str {
        "IcebergWriteExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = crate::exec::only_child("IcebergWriteExec", children)?;
        Ok(Arc::new(Self::new(
            input,
            Arc::clone(&self.target),
            self.overwrite,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "IcebergWriteExec has one partition, asked for {partition}"
            )));
        }
        // Every input partition, merged: they are produced in parallel.
        let n = self.input.properties().partitioning.partition_count();
        let schema = self.input.schema();
        let streams = (0..n)
            .map(|p| self.input.execute(p, Arc::clone(&context)))
            .collect::<Result<Vec<_>>>()?;
        let merged: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::select_all(streams),
        ));
        let target = Arc::clone(&self.target);
        let pool = Arc::clone(context.memory_pool());
        let out = count_schema();
        let commit = if self.overwrite {
            Commit::Overwrite
        } else {
            Commit::Append
        };
        let result = futures::stream::once(async move {
            let rows = target.run(merged, commit, &pool).await?;
            Ok(RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![rows]))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out, result)))
    }
}

/// One row `count` = `n` (the result of DDL that reports rows).
pub fn count_batch(n: u64) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![n]))],
    )?)
}

/// A row-level write.
#[derive(Debug, Clone)]
pub enum RowLevel {
    /// `DELETE FROM t [WHERE ...]`, `TRUNCATE`.
    Delete,
    /// `UPDATE t SET c = e, ... [WHERE ...]`.
    Update(Vec<(String, datafusion::logical_expr::Expr)>),
}

/// DELETE and UPDATE by copy-on-write: the data files holding a matching row are found
/// (one scan of the condition's columns), read whole, rewritten without the deleted rows
/// (or with the new values) and replaced in one commit. Returns one row `count`: the
/// rows deleted or updated.
pub struct IcebergRowLevelExec {
    target: Arc<WriteTarget>,
    kind: RowLevel,
    filters: Vec<datafusion::logical_expr::Expr>,
    state: datafusion::execution::SessionState,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for IcebergRowLevelExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IcebergRowLevelExec")
            .field("table", &self.target.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl IcebergRowLevelExec {
    /// A row-level write of `target` planned in `state`.
    pub fn try_new(
        state: &dyn datafusion::catalog::Session,
        target: Arc<WriteTarget>,
        kind: RowLevel,
        filters: Vec<datafusion::logical_expr::Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<datafusion::execution::SessionState>()
            .ok_or_else(|| {
                DataFusionError::Internal("row-level write outside a SessionState".into())
            })?
            .clone();
        Ok(Arc::new(Self {
            target,
            kind,
            filters: filters
                .into_iter()
                .map(datafusion::logical_expr::expr_rewriter::unnormalize_col)
                .collect(),
            state,
            properties: count_properties(),
        }))
    }
}

impl DisplayAs for IcebergRowLevelExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.kind {
            RowLevel::Delete => "delete".to_owned(),
            RowLevel::Update(a) => format!(
                "update [{}]",
                a.iter()
                    .map(|(c, _)| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        write!(
            f,
            "IcebergRowLevelExec: table={}, {what}, copy-on-write, filters=[{}]",
            self.target.name,
            self.filters
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl ExecutionPlan for IcebergRowLevelExec {
    fn name(&self) -> &str {
        "IcebergRowLevelExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "IcebergRowLevelExec has one partition, asked for {partition}"
            )));
        }
        let (target, kind, filters, state) = (
            Arc::clone(&self.target),
            self.kind.clone(),
            self.filters.clone(),
            self.state.clone(),
        );
        let result = futures::stream::once(async move {
            let rows = row_level(&target, &kind, &filters, &state).await?;
            count_batch(rows)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            result,
        )))
    }
}

/// Runs a DELETE or UPDATE (see [`IcebergRowLevelExec`]).
async fn row_level(
    target: &WriteTarget,
    kind: &RowLevel,
    filters: &[datafusion::logical_expr::Expr],
    state: &datafusion::execution::SessionState,
) -> Result<u64> {
    use datafusion::functions_aggregate::count::count;
    use datafusion::logical_expr::{Expr, LogicalPlanBuilder, cast, col, lit, when};
    use datafusion::prelude::coalesce;
    let predicate = datafusion::logical_expr::utils::conjunction(filters.iter().cloned());
    // Pass 1 looks for matching rows (its filters may prune files); pass 2 reads every
    // row of the files it rewrites.
    // Format 3: the rows pass 2 copies keep their lineage (`lineage.rs`).
    let lineage = target.source.tracks_lineage();
    if lineage {
        crate::lineage::check_writable(&target.name, &target.source.table_schema(), &target.spec)?;
    }
    // Under a gate, the scans that find and change rows see only the rows the writer may
    // change (`true`); the others (`false`) are copied as they are.
    let source = |files: Option<Arc<HashSet<String>>>, file_column: bool, changeable: bool| {
        let mut inner = target.source.for_rewrite(files, file_column);
        if lineage && !file_column {
            inner = inner.with_lineage();
        }
        let keys = target.grant.clone();
        let mut source = if file_column {
            RewriteSource::pruning(inner, keys)
        } else {
            RewriteSource::whole(inner, keys)
        };
        if let Some(g) = &target.gate {
            source = source.gated(Arc::clone(g), changeable);
        }
        datafusion::datasource::provider_as_source(Arc::new(source))
    };
    // 1. Which data files hold matching rows, and how many.
    let mut b = LogicalPlanBuilder::scan("t", source(None, true, true), None)?;
    if let Some(p) = &predicate {
        b = b.filter(p.clone())?;
    }
    let plan = b
        .aggregate(
            vec![col(crate::provider::FILE_COLUMN)],
            vec![count(lit(1)).alias("n")],
        )?
        .build()?;
    let physical = state.create_physical_plan(&plan).await?;
    let batches = datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
    let mut affected = HashSet::new();
    let mut matched = 0u64;
    for b in &batches {
        let files = b
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
            .ok_or_else(|| DataFusionError::Internal("_file is not Utf8".into()))?;
        let counts = datafusion::arrow::compute::cast(b.column(1), &DataType::UInt64)?;
        let counts = counts
            .as_any()
            .downcast_ref::<UInt64Array>()
            .expect("cast to u64");
        for i in 0..b.num_rows() {
            affected.insert(files.value(i).to_owned());
            matched += counts.value(i);
        }
    }
    if affected.is_empty() {
        target.audit.committed(None, 0);
        return Ok(0);
    }
    // 2. Those files, rewritten.
    let affected = Arc::new(affected);
    let matches = || match &predicate {
        Some(p) => coalesce(vec![p.clone(), lit(false)]),
        None => lit(true),
    };
    let b = LogicalPlanBuilder::scan("t", source(Some(Arc::clone(&affected)), false, true), None)?;
    let schema = datafusion::catalog::TableProvider::schema(&target.source);
    let mut plan = match kind {
        RowLevel::Delete => b.filter(Expr::Not(Box::new(matches())))?.build()?,
        RowLevel::Update(assignments) => {
            let mut exprs = schema
                .fields()
                .iter()
                .map(|f| {
                    let c = col(f.name());
                    let e = match assignments.iter().find(|(n, _)| n == f.name()) {
                        Some((_, e)) => {
                            let new = cast(
                                datafusion::logical_expr::expr_rewriter::unnormalize_col(e.clone()),
                                f.data_type().clone(),
                            );
                            when(matches(), new).otherwise(c)?
                        }
                        None => c,
                    };
                    Ok(e.alias(f.name()))
                })
                .collect::<Result<Vec<_>>>()?;
            if lineage {
                // An updated row keeps its id; its sequence number becomes the commit's.
                use crate::lineage::{LAST_UPDATED, ROW_ID};
                exprs.push(col(ROW_ID));
                exprs.push(
                    when(matches(), lit(datafusion::common::ScalarValue::Int64(None)))
                        .otherwise(col(LAST_UPDATED))?
                        .alias(LAST_UPDATED),
                );
            }
            b.project(exprs)?.build()?
        }
    };
    if target.gate.is_some() {
        // The rows the writer may not change, as they are, beside those it changed.
        let others =
            LogicalPlanBuilder::scan("o", source(Some(Arc::clone(&affected)), false, false), None)?
                .project(
                    plan.schema().fields().iter().map(|f| {
                        Expr::Column(datafusion::common::Column::new(Some("o"), f.name()))
                    }),
                )?
                .build()?;
        plan = LogicalPlanBuilder::from(plan).union(others)?.build()?;
    }
    let physical = state.create_physical_plan(&plan).await?;
    let stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())?;
    let removed: HashSet<String> = affected.iter().cloned().collect();
    target
        .run(
            stream,
            Commit::Replace {
                removed,
                reported: Some(matched),
            },
            &state.runtime_env().memory_pool,
        )
        .await
}

/// The rows of a table a row-level write reads back to rewrite: its scans run with the
/// write's own [`ScanGrant`] (the principal's provider, token and AAD prefix; the keys
/// the policy declares for the table's columns).
#[derive(Debug)]
pub struct RewriteSource {
    inner: IcebergTableProvider,
    keys: ScanGrant,
    /// Let filters prune files. Only a scan that looks for rows may: the scan that
    /// rewrites files must read every row of them (a file pruned there would be removed
    /// with rows it should have kept).
    prune: bool,
    /// The rows scanned: those the writer may change (`true`) or the others, per the gate.
    gate: Option<(Arc<dyn RowGate>, bool)>,
}

impl RewriteSource {
    /// A scan that may skip files its filters exclude.
    pub fn pruning(inner: IcebergTableProvider, keys: ScanGrant) -> Self {
        Self {
            inner,
            keys,
            prune: true,
            gate: None,
        }
    }

    /// A scan that reads every row of its files.
    pub fn whole(inner: IcebergTableProvider, keys: ScanGrant) -> Self {
        Self {
            inner,
            keys,
            prune: false,
            gate: None,
        }
    }

    /// The scan cut by `gate` to the rows the writer may change (`changeable`) or the
    /// others. Such a scan reads every column and row of its files and prunes nothing
    /// by the statement's condition (pruning would evaluate it on every file's values).
    pub fn gated(mut self, gate: Arc<dyn RowGate>, changeable: bool) -> Self {
        self.prune = false;
        self.gate = Some((gate, changeable));
        self
    }
}

#[async_trait::async_trait]
impl datafusion::catalog::TableProvider for RewriteSource {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        datafusion::catalog::TableProvider::schema(&self.inner)
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&datafusion::logical_expr::Expr],
    ) -> Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        use datafusion::logical_expr::TableProviderFilterPushDown as Push;
        let push = if self.prune {
            Push::Inexact
        } else {
            Push::Unsupported
        };
        Ok(vec![push; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::logical_expr::Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let keys = self.keys.clone();
        let filters = if self.prune { filters } else { &[] };
        let Some((gate, changeable)) = &self.gate else {
            return self
                .inner
                .scan_with(state, projection, filters, limit, keys, false)
                .await;
        };
        // Every column, so the gate's predicate has what it reads; then the projection.
        let scan = self
            .inner
            .scan_with(state, None, &[], None, keys, false)
            .await?;
        let gated = gate.apply(scan, *changeable)?;
        let Some(projection) = projection else {
            return Ok(gated);
        };
        let schema = gated.schema();
        let exprs: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = projection
            .iter()
            .map(|&i| {
                let name = schema.field(i).name();
                let column = datafusion::physical_expr::expressions::Column::new(name, i);
                (Arc::new(column) as _, name.clone())
            })
            .collect();
        Ok(Arc::new(
            datafusion::physical_plan::projection::ProjectionExec::try_new(exprs, gated)?,
        ))
    }
}

/// Test failpoint: with `CLEARICE_TEST_PAUSE_BEFORE_COMMIT=FILE`, a write whose data files
/// are written writes their paths to FILE and waits a minute before committing (tests
/// kill the process there to check that an interrupted write changes nothing).
async fn pause_before_commit(files: &[DataFile]) {
    let Some(marker) = std::env::var_os("CLEARICE_TEST_PAUSE_BEFORE_COMMIT") else {
        return;
    };
    let paths: Vec<&str> = files.iter().map(DataFile::file_path).collect();
    let text = paths.join("\n");
    let _ = tokio::fs::write(&marker, text).await;
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
}
