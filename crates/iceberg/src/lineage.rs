//! Row lineage (format v3): rows a row-level write copies into new files keep their
//! identity, as the Iceberg spec asks ("Row Lineage"):
//!
//! ```text
//!  the rewrite scan, one data file per partition, in file order
//!    ─▶ LineageExec: each row's position (deleted positions skipped)
//!       _row_id                       = the file's value, else first_row_id + position
//!       _last_updated_sequence_number = the file's value, else the file's data sequence number
//!  ─▶ DELETE keeps both; UPDATE sets the updated rows' sequence number to NULL
//!  ─▶ the new files carry both columns (reserved field ids); the commit writes each
//!     kept file's inherited first_row_id into its EXISTING entry
//! ```
//!
//! A data file's `first_row_id` is inherited as Iceberg Java's `ManifestReader` does:
//! the manifest's `first_row_id` plus the record counts of the live files before it
//! in the manifest that had none.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, SchemaRef};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::StreamExt;
use iceberg::spec::{DataFile, DataFileBuilder, Manifest, ManifestFile, ManifestStatus};
use iceberg::table::Table;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use roaring::RoaringTreemap;

/// The row id column (reserved field id 2147483540).
pub const ROW_ID: &str = "_row_id";
/// The column of the sequence number that last updated a row (reserved id 2147483539).
pub const LAST_UPDATED: &str = "_last_updated_sequence_number";
const ROW_ID_FIELD: i32 = 2147483540;
const LAST_UPDATED_FIELD: i32 = 2147483539;

/// The two lineage columns, as a v3 data file stores them.
pub(crate) fn fields() -> [Field; 2] {
    let field = |name: &str, id: i32| {
        Field::new(name, DataType::Int64, true).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_owned(),
            id.to_string(),
        )]))
    };
    [
        field(ROW_ID, ROW_ID_FIELD),
        field(LAST_UPDATED, LAST_UPDATED_FIELD),
    ]
}

/// Fails unless a row-level write can keep the lineage of `table`'s rows (format 3):
/// its own columns must not take the lineage columns' names, and the lineage columns of
/// a table whose columns are PME-encrypted would be written in plaintext (an UPDATE's
/// sequence numbers would tell which rows its condition on a protected column picked).
pub fn check_writable(
    table: &str,
    schema: &SchemaRef,
    spec: &crate::write::EncryptionSpec,
) -> crate::error::Result<()> {
    let refuse = |what: String| {
        Err(crate::error::Error::Unsupported {
            table: table.to_owned(),
            what,
        })
    };
    for f in fields() {
        if schema.index_of(f.name()).is_ok() {
            return refuse(format!(
                "rewriting rows of a format 3 table with a column named '{}' (the name of a row lineage column)",
                f.name()
            ));
        }
    }
    if !spec.column_keys.is_empty() {
        return refuse(
            "rewriting rows of a format 3 table whose columns are PME-encrypted (their row lineage would be stored in plaintext)".into(),
        );
    }
    Ok(())
}

/// What a data file's rows inherit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inherited {
    /// The `_row_id` of the file's first row, if assigned (a table upgraded to v3 has
    /// files without).
    pub first_row_id: Option<i64>,
    /// The file's data sequence number.
    pub sequence_number: Option<i64>,
}

/// The `first_row_id` each live entry of `manifest` (listed as `mf`) has, stored or
/// inherited, in entry order (deleted entries: `None`). A manifest without a
/// `first_row_id` (a table upgraded to format 3) gives none, as Iceberg Java reads it.
pub(crate) fn first_row_ids(mf: &ManifestFile, manifest: &Manifest) -> Vec<Option<i64>> {
    let Some(first) = mf.first_row_id else {
        return vec![None; manifest.entries().len()];
    };
    let mut next = Some(first as i64);
    manifest
        .entries()
        .iter()
        .map(|e| {
            if e.status() == ManifestStatus::Deleted {
                return None;
            }
            let f = e.data_file();
            match (f.first_row_id(), next.as_mut()) {
                (Some(id), _) => Some(id),
                (None, Some(n)) => {
                    let id = *n;
                    *n += f.record_count() as i64;
                    Some(id)
                }
                (None, None) => None,
            }
        })
        .collect()
}

/// What every live data file of `table`'s snapshot `snapshot_id` inherits, by location.
pub(crate) async fn of_snapshot(
    table: &Table,
    snapshot_id: i64,
) -> iceberg::Result<HashMap<String, Inherited>> {
    let mut out = HashMap::new();
    let Some(snapshot) = table.metadata().snapshot_by_id(snapshot_id) else {
        return Ok(out);
    };
    let list = table.manifest_list_reader(snapshot).load().await?;
    for mf in list.entries() {
        if mf.content != iceberg::spec::ManifestContentType::Data {
            continue;
        }
        let manifest = mf.load_manifest(table.file_io()).await?;
        let ids = first_row_ids(mf, &manifest);
        for (e, first_row_id) in manifest.entries().iter().zip(ids) {
            if e.is_alive() {
                out.insert(
                    e.file_path().to_owned(),
                    Inherited {
                        first_row_id,
                        sequence_number: e.sequence_number(),
                    },
                );
            }
        }
    }
    Ok(out)
}

/// `file` with `first_row_id` (what a rewritten manifest stores for a kept file), in
/// partition spec `spec_id`.
pub(crate) fn with_first_row_id(
    file: &DataFile,
    spec_id: i32,
    first_row_id: Option<i64>,
) -> Result<DataFile, String> {
    let mut b = DataFileBuilder::default();
    b.content(file.content_type())
        .file_path(file.file_path().to_owned())
        .file_format(file.file_format())
        .partition(file.partition().clone())
        .record_count(file.record_count())
        .file_size_in_bytes(file.file_size_in_bytes())
        .column_sizes(file.column_sizes().clone())
        .value_counts(file.value_counts().clone())
        .null_value_counts(file.null_value_counts().clone())
        .nan_value_counts(file.nan_value_counts().clone())
        .lower_bounds(file.lower_bounds().clone())
        .upper_bounds(file.upper_bounds().clone())
        .key_metadata(file.key_metadata().map(<[u8]>::to_vec))
        .split_offsets(file.split_offsets().map(<[i64]>::to_vec))
        .equality_ids(file.equality_ids())
        .first_row_id(first_row_id)
        .partition_spec_id(spec_id)
        .referenced_data_file(file.referenced_data_file())
        .content_offset(file.content_offset())
        .content_size_in_bytes(file.content_size_in_bytes());
    if let Some(s) = file.sort_order_id() {
        b.sort_order_id(s);
    }
    b.build().map_err(|e| e.to_string())
}

/// One data file of a lineage scan.
pub(crate) struct LineageFile {
    /// Reads the file's rows in file order: one partition, one file, no predicate.
    pub scan: Arc<dyn ExecutionPlan>,
    /// The file's location (for errors).
    pub location: String,
    /// What its rows inherit.
    pub inherited: Inherited,
    /// Positions the scan skips (position deletes, deletion vectors).
    pub deleted: Option<Arc<RoaringTreemap>>,
    /// The file's row count, from its manifest entry.
    pub rows: u64,
}

/// Each file's rows with their lineage (see the module): each partition reads its files
/// one after another. The per-file scans are executed here, not planned as children, so
/// no optimizer splits a file or reorders its rows (a row's position is its place in
/// the stream).
pub(crate) struct LineageExec {
    table: String,
    groups: Vec<Vec<Arc<LineageFile>>>,
    schema: SchemaRef,
    /// Output columns holding `_row_id` and `_last_updated_sequence_number`, if projected.
    row_id: Option<usize>,
    last_updated: Option<usize>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for LineageExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LineageExec")
            .field("table", &self.table)
            .field("files", &self.groups.iter().map(Vec::len).sum::<usize>())
            .finish_non_exhaustive()
    }
}

impl LineageExec {
    /// The lineage scan of `files`, whose scans produce `schema`, in at most
    /// `partitions` partitions.
    pub(crate) fn new(
        table: String,
        files: Vec<LineageFile>,
        schema: SchemaRef,
        partitions: usize,
    ) -> Self {
        let row_id = schema.index_of(ROW_ID).ok();
        let last_updated = schema.index_of(LAST_UPDATED).ok();
        let n = partitions.clamp(1, files.len().max(1));
        let mut groups: Vec<Vec<Arc<LineageFile>>> = (0..n).map(|_| Vec::new()).collect();
        for (i, f) in files.into_iter().enumerate() {
            groups[i % n].push(Arc::new(f));
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            table,
            groups,
            schema,
            row_id,
            last_updated,
            properties,
        }
    }
}

impl DisplayAs for LineageExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IcebergLineageExec: table={}, files={}",
            self.table,
            self.groups.iter().map(Vec::len).sum::<usize>()
        )
    }
}

impl ExecutionPlan for LineageExec {
    fn name(&self) -> &str {
        "IcebergLineageExec"
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
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "IcebergLineageExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let group = self.groups.get(partition).cloned().unwrap_or_default();
        let cols = Arc::new(Columns {
            row_id: self.row_id,
            last_updated: self.last_updated,
            table: self.table.clone(),
        });
        let stream = futures::stream::iter(group)
            .map(move |file| file_rows(file, Arc::clone(&context), Arc::clone(&cols)))
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// The rows of one file of a lineage scan, with their lineage (the file's scan starts
/// when the stream is first polled).
fn file_rows(
    file: Arc<LineageFile>,
    context: Arc<TaskContext>,
    cols: Arc<Columns>,
) -> futures::stream::BoxStream<'static, DfResult<RecordBatch>> {
    let inner = match file.scan.execute(0, context) {
        Ok(s) => s,
        Err(e) => return futures::stream::once(async move { Err(e) }).boxed(),
    };
    futures::stream::try_unfold(
        (inner, 0u64, file, cols),
        |(mut inner, mut next, file, cols)| async move {
            match inner.next().await {
                Some(batch) => {
                    let out = cols.attach(&file, &batch?, &mut next)?;
                    Ok(Some((out, (inner, next, file, cols))))
                }
                None => {
                    cols.finish(&file, next)?;
                    Ok(None)
                }
            }
        },
    )
    .boxed()
}

/// Where the lineage columns are in a lineage scan's batches.
struct Columns {
    row_id: Option<usize>,
    last_updated: Option<usize>,
    table: String,
}

impl Columns {
    /// `batch` (the next rows of `file`; `next`: the position after the last row seen)
    /// with each row's lineage.
    fn attach(
        &self,
        file: &LineageFile,
        batch: &RecordBatch,
        next: &mut u64,
    ) -> DfResult<RecordBatch> {
        let mut positions = Vec::with_capacity(batch.num_rows());
        for _ in 0..batch.num_rows() {
            if let Some(d) = &file.deleted {
                while d.contains(*next) {
                    *next += 1;
                }
            }
            positions.push(*next);
            *next += 1;
        }
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        if let Some(i) = self.row_id {
            let stored = columns[i].as_primitive::<Int64Type>();
            let ids: Int64Array = positions
                .iter()
                .enumerate()
                .map(|(row, pos)| {
                    if stored.is_valid(row) {
                        Some(stored.value(row))
                    } else {
                        file.inherited.first_row_id.map(|first| first + *pos as i64)
                    }
                })
                .collect();
            columns[i] = Arc::new(ids);
        }
        if let Some(i) = self.last_updated {
            let stored = columns[i].as_primitive::<Int64Type>();
            let seqs: Int64Array = (0..batch.num_rows())
                .map(|row| {
                    if stored.is_valid(row) {
                        Some(stored.value(row))
                    } else if file.inherited.first_row_id.is_some() {
                        file.inherited.sequence_number
                    } else {
                        // Rows without lineage (before an upgrade to format 3).
                        None
                    }
                })
                .collect();
            columns[i] = Arc::new(seqs);
        }
        Ok(RecordBatch::try_new(batch.schema(), columns)?)
    }

    /// Fails unless the scan of `file` gave every row not deleted (else positions, and
    /// so row ids, would be wrong).
    fn finish(&self, file: &LineageFile, mut next: u64) -> DfResult<()> {
        if let Some(d) = &file.deleted {
            while next < file.rows && d.contains(next) {
                next += 1;
            }
        }
        if next == file.rows {
            return Ok(());
        }
        Err(DataFusionError::External(Box::new(
            crate::error::Error::Write {
                table: self.table.clone(),
                reason: format!(
                    "data file '{}' gave {next} row positions for {} rows: its rows' lineage cannot be kept",
                    file.location, file.rows
                ),
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{DataContentType, DataFileFormat, Datum, Struct};

    #[test]
    fn a_copy_with_its_own_first_row_id_is_the_same_file() {
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::Data)
            .file_path("s3://b/t/data/f.parquet".into())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(iceberg::spec::Literal::int(7))]))
            .record_count(10)
            .file_size_in_bytes(1234)
            .column_sizes(HashMap::from([(1, 10)]))
            .value_counts(HashMap::from([(1, 10)]))
            .null_value_counts(HashMap::from([(1, 1)]))
            .nan_value_counts(HashMap::from([(2, 0)]))
            .lower_bounds(HashMap::from([(1, Datum::long(1))]))
            .upper_bounds(HashMap::from([(1, Datum::long(9))]))
            .key_metadata(Some(vec![1, 2, 3]))
            .split_offsets(Some(vec![4]))
            .equality_ids(Some(vec![]))
            .sort_order_id(0)
            .first_row_id(Some(100))
            .partition_spec_id(3)
            .referenced_data_file(None)
            .content_offset(None)
            .content_size_in_bytes(None);
        let f = b.build().unwrap();
        assert_eq!(with_first_row_id(&f, 3, Some(100)).unwrap(), f);
        let moved = with_first_row_id(&f, 3, Some(5)).unwrap();
        assert_eq!(moved.first_row_id(), Some(5));
    }

    #[test]
    fn lineage_fields_carry_the_reserved_ids() {
        let [r, s] = fields();
        assert_eq!(crate::field_id::field_id(&r), Some(2147483540));
        assert_eq!(crate::field_id::field_id(&s), Some(2147483539));
        assert!(r.is_nullable() && s.is_nullable());
    }
}
