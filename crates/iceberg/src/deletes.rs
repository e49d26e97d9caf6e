//! Row-level deletes applied inside the Iceberg scan: position delete files (v2),
//! deletion vectors in Puffin files (v3) and equality delete files (v2).
//!
//! ```text
//!  position deletes / DVs ─▶ row selection per row group (ParquetAccessPlan): deleted rows
//!                            are never decoded, pruning and parallelism are unchanged
//!  equality deletes       ─▶ one DataSourceExec per set of applicable delete files, which
//!                            also reads the equality columns, then IcebergDeletesExec drops
//!                            matching rows and projects the equality columns away
//! ```
//!
//! Which delete file applies to which data file (partition, sequence numbers) is decided
//! by iceberg's scan planning; delete files are read through the same decrypting reader
//! as data files, so PME-encrypted delete files work like encrypted data files.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::catalog::Session;
use datafusion::common::config::ConfigOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{FutureExt, StreamExt, TryStreamExt};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::DataContentType;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use roaring::RoaringTreemap;

use crate::error::{Error, Result};
use crate::exec::{map_batches, mapped_properties, only_child};
use crate::field_id::{FieldIdExprAdapterFactory, field_id};
use clearice_crypto::KeyScope;
use clearice_pme::DecryptingReaderFactory;
use clearice_storage::Location;

/// Field ids of a position delete file's columns (Iceberg spec, reserved ids).
const FILE_PATH_ID: i32 = 2147483546;
const POS_ID: i32 = 2147483545;
/// Delete files read, or data file footers fetched, at once.
pub(crate) const LOAD_CONCURRENCY: usize = 8;
/// Magic bytes of a `deletion-vector-v1` blob.
const DV_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];

/// A data file's location in a form that compares equal however a writer spelled it
/// (`file:/p`, `file:///p` and `/p` are the same file).
pub(crate) fn canonical(location: &str) -> String {
    match Location::parse(location) {
        Ok(Location::Local(p)) => p,
        Ok(Location::S3 { bucket, key }) => format!("s3://{bucket}/{key}"),
        Err(_) => location.to_owned(),
    }
}

/// Reads whole files of one table: the store, the decrypting reader and the names.
pub(crate) struct FileReading<'a> {
    pub table: &'a str,
    pub state: &'a dyn Session,
    pub store_url: ObjectStoreUrl,
    pub factory: Arc<DecryptingReaderFactory>,
    /// Path of a location in the store (for `PartitionedFile`).
    pub path_of: &'a (dyn Fn(&str) -> Result<String> + Sync),
    pub file_io: &'a iceberg::io::FileIO,
    /// Each file's own key, by path (Iceberg-native encryption).
    pub file_keys: Option<&'a clearice_pme::FileKeys>,
}

impl FileReading<'_> {
    /// Every row of a Parquet file, columns resolved by field id into `schema`.
    async fn read(
        &self,
        location: &str,
        size: u64,
        schema: SchemaRef,
    ) -> DfResult<Vec<RecordBatch>> {
        let path = (self.path_of)(location)?;
        let source = ParquetSource::new(Arc::clone(&schema))
            .with_parquet_file_reader_factory(Arc::clone(&self.factory) as _);
        let config = FileScanConfigBuilder::new(self.store_url.clone(), Arc::new(source))
            .with_file_groups(vec![FileGroup::new(vec![PartitionedFile::new(path, size)])])
            .with_expr_adapter(Some(Arc::new(FieldIdExprAdapterFactory)))
            .build();
        let plan = DataSourceExec::from_data_source(config);
        datafusion::physical_plan::collect(plan, self.state.task_ctx())
            .await
            .map_err(|e| {
                // Decryption failures keep their type (a refused key is a denial, a
                // tampered file is tampering) and already name the file.
                if has_cause::<clearice_pme::DecryptError>(&e) {
                    return e;
                }
                DataFusionError::External(Box::new(Error::DeleteFile {
                    table: self.table.to_owned(),
                    file: location.to_owned(),
                    reason: e.to_string(),
                }))
            })
    }

    /// Row counts of a data file's row groups (from its decrypted footer).
    async fn row_groups(&self, location: &str, size: u64) -> DfResult<Vec<u64>> {
        let path = (self.path_of)(location)?;
        let mut reader = self.factory.create_reader(
            0,
            PartitionedFile::new(path, size),
            None,
            &ExecutionPlanMetricsSet::new(),
        )?;
        let md = reader.get_metadata(None).await?;
        Ok(md
            .row_groups()
            .iter()
            .map(|rg| rg.num_rows() as u64)
            .collect())
    }
}

/// Whether `T` is somewhere in the error's cause chain.
fn has_cause<T: std::error::Error + 'static>(e: &DataFusionError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        if let Some(DataFusionError::External(inner)) = err.downcast_ref::<DataFusionError>()
            && inner.is::<T>()
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Equality deletes of one delete file: the equality columns and the deleted keys.
struct EqualityFile {
    field_ids: Vec<i32>,
    keys: HashSet<Box<[u8]>>,
}

/// What deletes apply to the data files of one scan.
#[derive(Default)]
pub(crate) struct Deletes {
    /// Deleted positions by canonical data file location.
    positions: HashMap<String, RoaringTreemap>,
    /// Equality delete files by location.
    equality: BTreeMap<String, EqualityFile>,
    /// Row converters per equality column set (the table schema's types).
    converters: HashMap<Vec<i32>, Arc<RowConverter>>,
}

impl Deletes {
    /// Reads every delete file the tasks name (each once).
    pub(crate) async fn load(
        reading: &FileReading<'_>,
        schema: &SchemaRef,
        tasks: &[FileScanTask],
    ) -> DfResult<Self> {
        let wanted: HashSet<String> = tasks
            .iter()
            .filter(|t| !t.deletes.is_empty())
            .map(|t| canonical(&t.data_file_path))
            .collect();
        let mut files: BTreeMap<&str, &FileScanTaskDeleteFile> = BTreeMap::new();
        for t in tasks {
            for d in &t.deletes {
                files.entry(d.file_path.as_str()).or_insert(d);
            }
        }
        // Delete files are read concurrently (a few at a time), then merged.
        let wanted = &wanted;
        let mut pending = Vec::with_capacity(files.len());
        for (location, d) in files {
            pending.push(
                async move {
                    let mut part = Deletes::default();
                    match d.file_type {
                        DataContentType::PositionDeletes if is_puffin(location) => {
                            part.load_vectors(reading, location, wanted).await?
                        }
                        DataContentType::PositionDeletes => {
                            part.load_positions(reading, d, wanted).await?
                        }
                        DataContentType::EqualityDeletes => {
                            part.load_equality(reading, schema, d).await?
                        }
                        DataContentType::Data => {}
                    }
                    Ok::<_, DataFusionError>(part)
                }
                .boxed(),
            );
        }
        let parts: Vec<Deletes> = futures::stream::iter(pending)
            .buffer_unordered(LOAD_CONCURRENCY)
            .try_collect()
            .await?;
        let mut out = Deletes::default();
        for part in parts {
            for (file, positions) in part.positions {
                *out.positions.entry(file).or_default() |= positions;
            }
            out.equality.extend(part.equality);
            for (ids, c) in part.converters {
                out.converters.entry(ids).or_insert(c);
            }
        }
        Ok(out)
    }

    async fn load_positions(
        &mut self,
        reading: &FileReading<'_>,
        d: &FileScanTaskDeleteFile,
        wanted: &HashSet<String>,
    ) -> DfResult<()> {
        let schema = Arc::new(Schema::new(vec![
            with_id(Field::new("file_path", DataType::Utf8, false), FILE_PATH_ID),
            with_id(Field::new("pos", DataType::Int64, false), POS_ID),
        ]));
        let batches = reading
            .read(&d.file_path, d.file_size_in_bytes, schema)
            .await?;
        // Delete files group rows by data file: canonicalize each path once per run.
        let mut last: Option<(String, bool)> = None;
        for b in batches {
            let paths = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8)?;
            let paths = paths.as_string::<i32>();
            let pos = b.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                if paths.is_null(i) || pos.is_null(i) {
                    continue;
                }
                let p = paths.value(i);
                let hit = match &last {
                    Some((l, hit)) if l == p => *hit,
                    _ => {
                        let key = canonical(p);
                        let hit = wanted.contains(&key);
                        last = Some((p.to_owned(), hit));
                        hit
                    }
                };
                if hit {
                    self.positions
                        .entry(canonical(p))
                        .or_default()
                        .insert(pos.value(i) as u64);
                }
            }
        }
        Ok(())
    }

    async fn load_vectors(
        &mut self,
        reading: &FileReading<'_>,
        location: &str,
        wanted: &HashSet<String>,
    ) -> DfResult<()> {
        let err = |reason: String| {
            DataFusionError::External(Box::new(Error::DeleteFile {
                table: reading.table.to_owned(),
                file: location.to_owned(),
                reason,
            }))
        };
        let input = reading
            .file_io
            .new_input(location)
            .map_err(|e| err(e.to_string()))?;
        // A natively encrypted table's deletion vectors are AGS1 streams under their own
        // key: decrypted whole (they are small), then read as Puffin from memory.
        let input = match reading.file_keys {
            None => input,
            Some(keys) => {
                let key = keys
                    .get(&(reading.path_of)(location)?)
                    .ok_or_else(|| err("no key for this file in the table's manifests".into()))?;
                let metadata = iceberg::encryption::StandardKeyMetadata::new(key.key.expose())
                    .with_aad_prefix(&key.aad_prefix);
                let plain = iceberg::encryption::EncryptedInputFile::new(input, metadata)
                    .read()
                    .await
                    .map_err(|_| {
                        DataFusionError::External(Box::new(Error::Tampered {
                            table: reading.table.to_owned(),
                            kind: "deletion vector".into(),
                            file: location.to_owned(),
                        }))
                    })?;
                let memory = iceberg::io::FileIO::new_with_memory();
                let at = format!("memory:///dv/{}.puffin", rand::random::<u64>());
                let out = memory.new_output(&at).map_err(|e| err(e.to_string()))?;
                out.write(plain).await.map_err(|e| err(e.to_string()))?;
                memory.new_input(&at).map_err(|e| err(e.to_string()))?
            }
        };
        let puffin = iceberg::puffin::PuffinReader::new(input);
        let blobs = puffin
            .file_metadata()
            .await
            .map_err(|e| err(e.to_string()))?
            .blobs()
            .to_vec();
        for meta in blobs {
            if meta.blob_type() != iceberg::puffin::DELETION_VECTOR_V1 {
                continue;
            }
            let Some(target) = meta.properties().get("referenced-data-file") else {
                return Err(err("deletion vector without 'referenced-data-file'".into()));
            };
            let target = canonical(target);
            if !wanted.contains(&target) {
                continue;
            }
            let blob = puffin.blob(&meta).await.map_err(|e| err(e.to_string()))?;
            let vector = decode_vector(blob.data()).map_err(err)?;
            *self.positions.entry(target).or_default() |= vector;
        }
        Ok(())
    }

    async fn load_equality(
        &mut self,
        reading: &FileReading<'_>,
        schema: &SchemaRef,
        d: &FileScanTaskDeleteFile,
    ) -> DfResult<()> {
        let ids = d.equality_ids.clone().unwrap_or_default();
        let missing = |id: i32| {
            DataFusionError::External(Box::new(Error::DeleteFile {
                table: reading.table.to_owned(),
                file: d.file_path.clone(),
                reason: format!("equality field id {id} is not a column of the scanned schema"),
            }))
        };
        if ids.is_empty() {
            return Err(missing(0));
        }
        let fields = ids
            .iter()
            .map(|id| {
                column_of(schema, *id)
                    .map(|i| Arc::clone(&schema.fields()[i]))
                    .ok_or_else(|| missing(*id))
            })
            .collect::<DfResult<Vec<_>>>()?;
        let converter = self.converter(&ids, &fields)?;
        let file_schema = Arc::new(Schema::new(fields));
        let batches = reading
            .read(&d.file_path, d.file_size_in_bytes, file_schema)
            .await?;
        let mut keys = HashSet::new();
        for b in batches {
            let rows = converter.convert_columns(b.columns())?;
            keys.extend(rows.iter().map(|r| Box::<[u8]>::from(r.as_ref())));
        }
        self.equality.insert(
            d.file_path.clone(),
            EqualityFile {
                field_ids: ids,
                keys,
            },
        );
        Ok(())
    }

    fn converter(&mut self, ids: &[i32], fields: &[FieldRef]) -> DfResult<Arc<RowConverter>> {
        if let Some(c) = self.converters.get(ids) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(RowConverter::new(
            fields
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?);
        self.converters.insert(ids.to_vec(), Arc::clone(&c));
        Ok(c)
    }

    /// The deleted positions of data file `location`, if any.
    pub(crate) fn deleted_positions(&self, location: &str) -> Option<&RoaringTreemap> {
        self.positions
            .get(&canonical(location))
            .filter(|d| !d.is_empty())
    }

    /// The access plan skipping a data file's deleted positions, if it has any.
    pub(crate) async fn access_plan(
        &self,
        reading: &FileReading<'_>,
        task: &FileScanTask,
    ) -> DfResult<Option<ParquetAccessPlan>> {
        let Some(deleted) = self.positions.get(&canonical(&task.data_file_path)) else {
            return Ok(None);
        };
        if deleted.is_empty() {
            return Ok(None);
        }
        let groups = reading
            .row_groups(&task.data_file_path, task.file_size_in_bytes)
            .await?;
        Ok(Some(selection(&groups, deleted)))
    }

    /// Equality delete files that apply to `task`, by location (sorted).
    pub(crate) fn equality_files(&self, task: &FileScanTask) -> Vec<String> {
        let mut v: Vec<String> = task
            .deletes
            .iter()
            .filter(|d| d.file_type == DataContentType::EqualityDeletes)
            .map(|d| d.file_path.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Field ids of the equality columns of `files`.
    pub(crate) fn equality_ids(&self, files: &[String]) -> Vec<i32> {
        let mut ids: Vec<i32> = files
            .iter()
            .filter_map(|f| self.equality.get(f))
            .flat_map(|e| e.field_ids.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The filter dropping rows matched by `files`, over a scan whose output has the
    /// table columns `output` (indices into `schema`).
    pub(crate) fn filter_for(
        &self,
        files: &[String],
        schema: &SchemaRef,
        output: &[usize],
    ) -> DfResult<Vec<EqualityKeys>> {
        let mut by_ids: BTreeMap<Vec<i32>, HashSet<Box<[u8]>>> = BTreeMap::new();
        for f in files {
            if let Some(e) = self.equality.get(f) {
                by_ids
                    .entry(e.field_ids.clone())
                    .or_default()
                    .extend(e.keys.iter().cloned());
            }
        }
        by_ids
            .into_iter()
            .map(|(ids, keys)| {
                let columns = ids
                    .iter()
                    .map(|id| {
                        let i = column_of(schema, *id).expect("checked at load");
                        output.iter().position(|o| *o == i).ok_or_else(|| {
                            DataFusionError::Internal(format!("equality column {id} not scanned"))
                        })
                    })
                    .collect::<DfResult<Vec<_>>>()?;
                let names = ids
                    .iter()
                    .map(|id| {
                        schema
                            .field(column_of(schema, *id).expect("checked"))
                            .name()
                            .clone()
                    })
                    .collect();
                Ok(EqualityKeys {
                    converter: Arc::clone(&self.converters[&ids]),
                    columns,
                    names,
                    keys: Arc::new(keys),
                })
            })
            .collect()
    }
}

fn with_id(f: Field, id: i32) -> Field {
    f.with_metadata(HashMap::from([(
        parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_owned(),
        id.to_string(),
    )]))
}

/// Index of the column with field id `id`.
pub(crate) fn column_of(schema: &SchemaRef, id: i32) -> Option<usize> {
    schema.fields().iter().position(|f| field_id(f) == Some(id))
}

fn is_puffin(location: &str) -> bool {
    location.to_ascii_lowercase().ends_with(".puffin")
}

/// A `deletion-vector-v1` blob: length (4 bytes, big endian), magic, a 64-bit Roaring
/// bitmap in the portable format, CRC-32 (big endian) of magic and bitmap.
fn decode_vector(data: &[u8]) -> std::result::Result<RoaringTreemap, String> {
    if data.len() < 12 {
        return Err("deletion vector blob is too short".into());
    }
    let len = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
    if len + 8 != data.len() || len < 4 {
        return Err(format!(
            "deletion vector length {len} does not match its blob ({} bytes)",
            data.len()
        ));
    }
    if data[4..8] != DV_MAGIC {
        return Err("deletion vector blob has no DV magic".into());
    }
    let body = &data[4..4 + len];
    let crc = u32::from_be_bytes(data[4 + len..].try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err("deletion vector checksum mismatch".into());
    }
    RoaringTreemap::deserialize_from(&body[4..]).map_err(|e| format!("deletion vector: {e}"))
}

/// Row selection per row group that skips `deleted` positions.
fn selection(row_groups: &[u64], deleted: &RoaringTreemap) -> ParquetAccessPlan {
    let mut plan = Vec::with_capacity(row_groups.len());
    let mut positions = deleted.iter().peekable();
    let mut start = 0u64;
    for &n in row_groups {
        let end = start + n;
        let mut selectors = Vec::new();
        let mut at = start;
        while let Some(&p) = positions.peek() {
            if p >= end {
                break;
            }
            positions.next();
            if p < at {
                continue;
            }
            if p > at {
                selectors.push(RowSelector::select((p - at) as usize));
            }
            selectors.push(RowSelector::skip(1));
            at = p + 1;
        }
        if at == start {
            plan.push(RowGroupAccess::Scan);
        } else if selectors.iter().all(|s| s.skip) && at == end {
            plan.push(RowGroupAccess::Skip);
        } else {
            if at < end {
                selectors.push(RowSelector::select((end - at) as usize));
            }
            plan.push(RowGroupAccess::Selection(RowSelection::from(selectors)));
        }
        start = end;
    }
    ParquetAccessPlan::new(plan)
}

/// One set of equality columns and the keys deleted on them.
#[derive(Clone)]
pub(crate) struct EqualityKeys {
    converter: Arc<RowConverter>,
    /// Input columns of the equality fields.
    columns: Vec<usize>,
    names: Vec<String>,
    keys: Arc<HashSet<Box<[u8]>>>,
}

impl fmt::Debug for EqualityKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the keys: they are values of (possibly encrypted) columns.
        f.debug_struct("EqualityKeys")
            .field("columns", &self.names)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// Drops rows matched by equality deletes, then projects the equality columns away.
#[derive(Debug)]
pub struct IcebergDeletesExec {
    input: Arc<dyn ExecutionPlan>,
    deletes: Vec<EqualityKeys>,
    /// Input columns in the output.
    output: Vec<usize>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl IcebergDeletesExec {
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        deletes: Vec<EqualityKeys>,
        output: Vec<usize>,
    ) -> DfResult<Self> {
        let schema = Arc::new(input.schema().project(&output)?);
        let properties = mapped_properties(&input, &schema);
        Ok(Self {
            input,
            deletes,
            output,
            schema,
            properties,
        })
    }
}

impl DisplayAs for IcebergDeletesExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IcebergDeletesExec: equality=[")?;
        for (i, d) in self.deletes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "({}): {} keys", d.names.join(", "), d.keys.len())?;
        }
        f.write_str("]")
    }
}

impl ExecutionPlan for IcebergDeletesExec {
    fn name(&self) -> &str {
        "IcebergDeletesExec"
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

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            only_child("IcebergDeletesExec", children)?,
            self.deletes.clone(),
            self.output.clone(),
        )?))
    }

    /// Filters above commute with the delete (a row is dropped or kept whatever the
    /// filter says), and the output columns are the input's first ones, same indices:
    /// pass them to the scan for pruning.
    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> DfResult<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> DfResult<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let deletes = self.deletes.clone();
        let output = self.output.clone();
        Ok(map_batches(input, Arc::clone(&self.schema), move |batch| {
            let mut keep = vec![true; batch.num_rows()];
            for d in &deletes {
                let cols: Vec<ArrayRef> = d
                    .columns
                    .iter()
                    .map(|c| Arc::clone(batch.column(*c)))
                    .collect();
                let rows = d.converter.convert_columns(&cols)?;
                for (i, row) in rows.iter().enumerate() {
                    if keep[i] && d.keys.contains(row.as_ref()) {
                        keep[i] = false;
                    }
                }
            }
            let kept = filter_record_batch(&batch, &BooleanArray::from(keep))?;
            Ok(kept.project(&output)?)
        }))
    }
}

/// `scope` plus the keys of the equality delete columns `extra` (field id → name and
/// master key).
pub(crate) fn widen(scope: &KeyScope, extra: &BTreeMap<i32, (String, String)>) -> KeyScope {
    let keys: BTreeSet<String> = extra.values().map(|(_, k)| k.clone()).collect();
    match scope {
        KeyScope::All => KeyScope::All,
        KeyScope::MasterKeys(k) => KeyScope::MasterKeys(k.union(&keys).cloned().collect()),
        KeyScope::Except(k) => KeyScope::Except(k.difference(&keys).cloned().collect()),
        KeyScope::Columns(c) => {
            let mut c = c.clone();
            for (id, (name, key)) in extra {
                c.by_field_id.insert(*id, key.clone());
                c.by_name.insert(name.clone(), key.clone());
            }
            KeyScope::Columns(c)
        }
        KeyScope::None(reason) => KeyScope::None(reason.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_skips_deleted_rows() {
        let mut deleted = RoaringTreemap::new();
        deleted.extend([0u64, 1, 5, 10, 11, 12, 13, 14]);
        let plan = selection(&[10, 5, 5], &deleted);
        let groups = plan.inner();
        assert!(matches!(groups[1], RowGroupAccess::Skip));
        assert!(matches!(groups[2], RowGroupAccess::Scan));
        let RowGroupAccess::Selection(s) = &groups[0] else {
            panic!("{groups:?}")
        };
        let selected: usize = s.iter().filter(|r| !r.skip).map(|r| r.row_count).sum();
        assert_eq!(selected, 7);
    }

    #[test]
    fn vectors_decode_and_check() {
        let mut bitmap = RoaringTreemap::new();
        bitmap.extend([3u64, 7, 1 << 33]);
        let mut body = DV_MAGIC.to_vec();
        bitmap.serialize_into(&mut body).unwrap();
        let mut blob = (body.len() as u32).to_be_bytes().to_vec();
        blob.extend_from_slice(&body);
        blob.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        assert_eq!(decode_vector(&blob).unwrap(), bitmap);
        let last = blob.len() - 1;
        blob[last] ^= 1;
        assert!(decode_vector(&blob).unwrap_err().contains("checksum"));
    }

    #[test]
    fn locations_compare_however_spelled() {
        assert_eq!(
            canonical("file:/a/b.parquet"),
            canonical("file:///a/b.parquet")
        );
        assert_eq!(canonical("/a/b.parquet"), canonical("file:///a/b.parquet"));
    }
}
