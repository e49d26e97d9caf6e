//! Iceberg metadata tables (`"t$snapshots"`, `"t$history"`, `"t$manifests"`,
//! `"t$files"`, `"t$partitions"`, `"t$refs"`), as Trino and Spark name them.
//!
//! All are built here from the table metadata and the scanned snapshot's manifest list
//! and manifests (iceberg's `inspect` tables, which iceberg-datafusion serves, read the
//! current snapshot only and print partition bounds unconditionally). Column statistics and partition values are shown only for
//! columns the principal may read in plaintext: a masked, hidden or denied column has no
//! bounds, counts or partition values in any metadata table (`***` in partition names),
//! and partitions on such columns are merged in `$partitions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Int32Builder, Int64Builder, MapBuilder, RecordBatch, StringBuilder,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use iceberg::spec::{DataContentType, DataFile, PartitionSpec, Schema as IcebergSchema};

use crate::error::{Error, Result};
use crate::provider::{IcebergTableProvider, refs_of};
use crate::travel::MetadataTable;

/// Which columns' statistics and partition values a principal may see.
pub type Plaintext<'a> = &'a (dyn Fn(&str) -> bool + Sync);

/// A metadata table of `table` (at its scanned snapshot) as a principal may see it.
pub async fn metadata_table(
    table: &IcebergTableProvider,
    kind: MetadataTable,
    plaintext: Plaintext<'_>,
) -> Result<Arc<dyn TableProvider>> {
    // Snapshot summaries may name partitions (`partitions.region=EU`, when a writer sets
    // `write.summary.partition-limit`) and manifest summaries hold bounds of partition
    // values: shown only when every partition source column is readable in plaintext.
    let partitions_readable = || partition_sources(table).iter().all(|c| plaintext(c));
    let batch = match kind {
        MetadataTable::Snapshots => snapshots(table, partitions_readable()),
        MetadataTable::Manifests => manifests(table, partitions_readable()).await?,
        MetadataTable::History => history(table),
        MetadataTable::Refs => refs(table),
        MetadataTable::Files => files(table, plaintext).await?,
        MetadataTable::Partitions => partitions(table, plaintext).await?,
    };
    mem(table, batch.map_err(|e| internal(table, e))?)
}

/// An error of building a metadata table of `table`.
fn iceberg_err(table: &IcebergTableProvider) -> impl Fn(iceberg::Error) -> Error + '_ {
    |source| Error::Iceberg {
        table: table.name().to_owned(),
        source: Box::new(source),
    }
}

/// An Arrow or DataFusion failure while building a metadata table of `table`.
fn internal(table: &IcebergTableProvider, e: impl ToString) -> Error {
    iceberg_err(table)(iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        e.to_string(),
    ))
}

fn mem(table: &IcebergTableProvider, batch: RecordBatch) -> Result<Arc<dyn TableProvider>> {
    let t = MemTable::try_new(batch.schema(), vec![vec![batch]]).map_err(|e| internal(table, e))?;
    Ok(Arc::new(t))
}

/// The schema of the scanned snapshot (the current one if the table has none).
fn scanned_schema(table: &IcebergTableProvider) -> iceberg::spec::SchemaRef {
    let m = table.table().metadata();
    table
        .snapshot()
        .and_then(|s| s.schema(m).ok())
        .unwrap_or_else(|| Arc::clone(m.current_schema()))
}

/// The manifests of the scanned snapshot.
async fn manifest_list(table: &IcebergTableProvider) -> Result<Vec<iceberg::spec::ManifestFile>> {
    let Some(snapshot) = table.snapshot() else {
        return Ok(vec![]);
    };
    let list = table
        .table()
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(iceberg_err(table))?;
    Ok(list.consume_entries().into_iter().collect())
}

fn ms_utc() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

type BatchResult = std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError>;

/// `$snapshots`: every snapshot, its operation and summary (as iceberg's `inspect`
/// table, with partition entries of the summary only when `partitions` are readable).
fn snapshots(table: &IcebergTableProvider, partitions: bool) -> BatchResult {
    let m = table.table().metadata();
    let mut committed = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let mut id = Int64Builder::new();
    let mut parent = Int64Builder::new();
    let mut operation = StringBuilder::new();
    let mut list = StringBuilder::new();
    let mut summary = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let mut all: Vec<_> = m.snapshots().collect();
    all.sort_by_key(|s| (s.timestamp_ms(), s.sequence_number()));
    for s in all {
        committed.append_value(s.timestamp_ms());
        id.append_value(s.snapshot_id());
        parent.append_option(s.parent_snapshot_id());
        operation.append_value(s.summary().operation.as_str());
        list.append_value(s.manifest_list());
        let entries: BTreeMap<&String, &String> = s
            .summary()
            .additional_properties
            .iter()
            .filter(|(k, _)| partitions || !k.starts_with("partitions."))
            .collect();
        for (k, v) in entries {
            summary.keys().append_value(k);
            summary.values().append_value(v);
        }
        summary.append(true)?;
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(committed.finish()),
        Arc::new(id.finish()),
        Arc::new(parent.finish()),
        Arc::new(operation.finish()),
        Arc::new(list.finish()),
        Arc::new(summary.finish()),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("committed_at", ms_utc(), false),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("operation", DataType::Utf8, true),
        Field::new("manifest_list", DataType::Utf8, true),
        Field::new("summary", columns[5].data_type().clone(), true),
    ]));
    RecordBatch::try_new(schema, columns)
}

/// `$manifests`: the manifests of the scanned snapshot, with partition summaries
/// (`region: [APAC, US]`, null/NaN flags) only when `partitions` are readable.
async fn manifests(table: &IcebergTableProvider, partitions: bool) -> Result<BatchResult> {
    use iceberg::spec::ManifestContentType;
    let m = table.table().metadata();
    let list = manifest_list(table).await?;
    let schema = scanned_schema(table);
    let mut content = Int32Builder::new();
    let mut path = StringBuilder::new();
    let mut length = Int64Builder::new();
    let mut spec_id = Int32Builder::new();
    let mut added_snapshot = Int64Builder::new();
    let mut counts: Vec<Int32Builder> = (0..6).map(|_| Int32Builder::new()).collect();
    let mut summaries = StringBuilder::new();
    for mf in &list {
        let deletes = mf.content == ManifestContentType::Deletes;
        content.append_value(if deletes { 1 } else { 0 });
        path.append_value(&mf.manifest_path);
        length.append_value(mf.manifest_length);
        spec_id.append_value(mf.partition_spec_id);
        added_snapshot.append_value(mf.added_snapshot_id);
        let c = [
            mf.added_files_count,
            mf.existing_files_count,
            mf.deleted_files_count,
        ];
        for (k, b) in counts.iter_mut().enumerate() {
            // Data counts for data manifests, delete counts for delete manifests.
            let of_kind = (k >= 3) == deletes;
            b.append_value(if of_kind {
                c[k % 3].unwrap_or(0) as i32
            } else {
                0
            });
        }
        let spec = m.partition_spec_by_id(mf.partition_spec_id);
        match (&mf.partitions, spec) {
            (Some(fs), Some(spec)) if partitions => {
                let ptype = spec.partition_type(&schema).ok();
                let parts: Vec<String> = spec
                    .fields()
                    .iter()
                    .zip(fs)
                    .enumerate()
                    .map(|(i, (f, sum))| {
                        let ty = ptype
                            .as_ref()
                            .and_then(|p| p.fields().get(i))
                            .and_then(|pf| pf.field_type.as_primitive_type().cloned());
                        let render = |b: Option<&[u8]>| match (b, &ty) {
                            (Some(b), Some(ty)) => {
                                iceberg::spec::Datum::try_from_bytes(b, ty.clone())
                                    .map(|d| d.to_human_string())
                                    .unwrap_or_else(|_| "?".into())
                            }
                            _ => "null".into(),
                        };
                        format!(
                            "{}: [{}, {}]{}",
                            f.name,
                            render(sum.lower_bound.as_ref().map(|b| b.as_slice())),
                            render(sum.upper_bound.as_ref().map(|b| b.as_slice())),
                            if sum.contains_null { " with nulls" } else { "" }
                        )
                    })
                    .collect();
                summaries.append_value(parts.join(", "))
            }
            _ => summaries.append_null(),
        }
    }
    let names = [
        "added_data_files_count",
        "existing_data_files_count",
        "deleted_data_files_count",
        "added_delete_files_count",
        "existing_delete_files_count",
        "deleted_delete_files_count",
    ];
    let mut fields = vec![
        Field::new("content", DataType::Int32, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("length", DataType::Int64, false),
        Field::new("partition_spec_id", DataType::Int32, false),
        Field::new("added_snapshot_id", DataType::Int64, false),
    ];
    fields.extend(names.iter().map(|n| Field::new(*n, DataType::Int32, false)));
    fields.push(Field::new("partition_summaries", DataType::Utf8, true));
    let mut arrays: Vec<ArrayRef> = vec![
        Arc::new(content.finish()),
        Arc::new(path.finish()),
        Arc::new(length.finish()),
        Arc::new(spec_id.finish()),
        Arc::new(added_snapshot.finish()),
    ];
    arrays.extend(counts.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    arrays.push(Arc::new(summaries.finish()));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays))
}

/// `$history`: when each snapshot became current, and whether it is an ancestor of
/// the current snapshot.
fn history(table: &IcebergTableProvider) -> BatchResult {
    let m = table.table().metadata();
    let mut ancestors = std::collections::HashSet::new();
    let mut at = m.current_snapshot().map(|s| s.snapshot_id());
    while let Some(id) = at {
        if !ancestors.insert(id) {
            break;
        }
        at = m.snapshot_by_id(id).and_then(|s| s.parent_snapshot_id());
    }
    let mut made = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let mut id = Int64Builder::new();
    let mut parent = Int64Builder::new();
    let mut current = BooleanBuilder::new();
    for l in m.history() {
        made.append_value(l.timestamp_ms);
        id.append_value(l.snapshot_id);
        parent.append_option(
            m.snapshot_by_id(l.snapshot_id)
                .and_then(|s| s.parent_snapshot_id()),
        );
        current.append_value(ancestors.contains(&l.snapshot_id));
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("made_current_at", ms_utc(), false),
            Field::new("snapshot_id", DataType::Int64, false),
            Field::new("parent_id", DataType::Int64, true),
            Field::new("is_current_ancestor", DataType::Boolean, false),
        ])),
        vec![
            Arc::new(made.finish()),
            Arc::new(id.finish()),
            Arc::new(parent.finish()),
            Arc::new(current.finish()),
        ],
    )
}

/// `$refs`: branches and tags.
fn refs(table: &IcebergTableProvider) -> BatchResult {
    use iceberg::spec::SnapshotRetention;
    let m = table.table().metadata();
    let mut name = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut id = Int64Builder::new();
    let mut max_ref_age = Int64Builder::new();
    let mut min_keep = Int32Builder::new();
    let mut max_age = Int64Builder::new();
    for (n, r) in refs_of(m) {
        name.append_value(&n);
        id.append_value(r.snapshot_id);
        match r.retention {
            SnapshotRetention::Branch {
                min_snapshots_to_keep,
                max_snapshot_age_ms,
                max_ref_age_ms,
            } => {
                kind.append_value("BRANCH");
                max_ref_age.append_option(max_ref_age_ms);
                min_keep.append_option(min_snapshots_to_keep);
                max_age.append_option(max_snapshot_age_ms);
            }
            SnapshotRetention::Tag { max_ref_age_ms } => {
                kind.append_value("TAG");
                max_ref_age.append_option(max_ref_age_ms);
                min_keep.append_null();
                max_age.append_null();
            }
        }
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("type", DataType::Utf8, false),
            Field::new("snapshot_id", DataType::Int64, false),
            Field::new("max_reference_age_in_ms", DataType::Int64, true),
            Field::new("min_snapshots_to_keep", DataType::Int32, true),
            Field::new("max_snapshot_age_in_ms", DataType::Int64, true),
        ])),
        vec![
            Arc::new(name.finish()),
            Arc::new(kind.finish()),
            Arc::new(id.finish()),
            Arc::new(max_ref_age.finish()),
            Arc::new(min_keep.finish()),
            Arc::new(max_age.finish()),
        ],
    )
}

/// Names of the columns any partition spec of the table is derived from.
fn partition_sources(table: &IcebergTableProvider) -> Vec<String> {
    let m = table.table().metadata();
    let schema = m.current_schema();
    m.partition_specs_iter()
        .flat_map(|s| s.fields().iter())
        .filter_map(|f| schema.name_by_field_id(f.source_id).map(top_level))
        .collect()
}

/// The top-level column of a (possibly nested) column name.
fn top_level(name: &str) -> String {
    name.split('.').next().unwrap_or(name).to_owned()
}

/// Every live file (data and delete) of the scanned snapshot.
async fn live_files(table: &IcebergTableProvider) -> Result<Vec<(DataFile, i32)>> {
    let mut out = Vec::new();
    for mf in manifest_list(table).await? {
        let manifest = mf
            .load_manifest(table.table().file_io())
            .await
            .map_err(iceberg_err(table))?;
        for e in manifest.entries() {
            if e.is_alive() {
                out.push((e.data_file().clone(), mf.partition_spec_id));
            }
        }
    }
    Ok(out)
}

/// `{region=EU, day=2024-01-01}`, with `***` for fields on columns not readable in
/// plaintext.
fn partition_name(
    spec: Option<&PartitionSpec>,
    schema: &IcebergSchema,
    file: &DataFile,
    plaintext: Plaintext<'_>,
) -> String {
    let Some(spec) = spec else {
        return "{}".into();
    };
    let Ok(ptype) = spec.partition_type(schema) else {
        return "{}".into();
    };
    let data = file.partition();
    let parts: Vec<String> = spec
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let readable = schema
                .name_by_field_id(f.source_id)
                .is_some_and(|n| plaintext(&top_level(n)));
            let value = if readable {
                let v = data.fields().get(i).and_then(|v| v.as_ref());
                ptype
                    .fields()
                    .get(i)
                    .map(|pf| f.transform.to_human_string(&pf.field_type, v))
                    .unwrap_or_else(|| "null".into())
            } else {
                "***".into()
            };
            format!("{}={value}", f.name)
        })
        .collect();
    format!("{{{}}}", parts.join(", "))
}

fn content_name(c: DataContentType) -> i32 {
    match c {
        DataContentType::Data => 0,
        DataContentType::PositionDeletes => 1,
        DataContentType::EqualityDeletes => 2,
    }
}

/// `$files`: the scanned snapshot's data and delete files with their statistics
/// (plaintext columns only).
async fn files(table: &IcebergTableProvider, plaintext: Plaintext<'_>) -> Result<BatchResult> {
    let all = live_files(table).await?;
    Ok(files_batch(table, &all, plaintext))
}

fn files_batch(
    table: &IcebergTableProvider,
    all: &[(DataFile, i32)],
    plaintext: Plaintext<'_>,
) -> BatchResult {
    let m = table.table().metadata();
    let schema = scanned_schema(table);
    let mut content = Int32Builder::new();
    let mut path = StringBuilder::new();
    let mut format = StringBuilder::new();
    let mut spec_id = Int32Builder::new();
    let mut partition = StringBuilder::new();
    let mut records = Int64Builder::new();
    let mut size = Int64Builder::new();
    let mut value_counts = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    let mut null_counts = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    let mut lower = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let mut upper = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    let mut equality = StringBuilder::new();
    // Statistics keyed by column name, for readable columns only (sorted for output).
    let readable = |id: &i32| -> Option<String> {
        let name = schema.name_by_field_id(*id)?;
        plaintext(&top_level(name)).then(|| name.to_owned())
    };
    for (f, spec) in all {
        content.append_value(content_name(f.content_type()));
        path.append_value(f.file_path());
        format.append_value(format!("{:?}", f.file_format()).to_uppercase());
        spec_id.append_value(*spec);
        partition.append_value(partition_name(
            m.partition_spec_by_id(*spec).map(|s| s.as_ref()),
            &schema,
            f,
            plaintext,
        ));
        records.append_value(f.record_count() as i64);
        size.append_value(f.file_size_in_bytes() as i64);
        for (counts, builder) in [
            (f.value_counts(), &mut value_counts),
            (f.null_value_counts(), &mut null_counts),
        ] {
            let sorted: BTreeMap<String, u64> = counts
                .iter()
                .filter_map(|(id, n)| Some((readable(id)?, *n)))
                .collect();
            for (k, v) in sorted {
                builder.keys().append_value(k);
                builder.values().append_value(v as i64);
            }
            builder.append(true)?;
        }
        for (bounds, builder) in [
            (f.lower_bounds(), &mut lower),
            (f.upper_bounds(), &mut upper),
        ] {
            let sorted: BTreeMap<String, String> = bounds
                .iter()
                .filter_map(|(id, d)| Some((readable(id)?, d.to_human_string())))
                .collect();
            for (k, v) in sorted {
                builder.keys().append_value(k);
                builder.values().append_value(v);
            }
            builder.append(true)?;
        }
        match f.equality_ids() {
            Some(ids) if !ids.is_empty() => {
                let names: Vec<String> = ids
                    .iter()
                    .map(|id| {
                        schema
                            .name_by_field_id(*id)
                            .map_or_else(|| id.to_string(), str::to_owned)
                    })
                    .collect();
                equality.append_value(names.join(", "))
            }
            _ => equality.append_null(),
        }
    }
    let map = |value: DataType| {
        DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(
                    vec![
                        Field::new("keys", DataType::Utf8, false),
                        Field::new("values", value, true),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        )
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(content.finish()),
        Arc::new(path.finish()),
        Arc::new(format.finish()),
        Arc::new(spec_id.finish()),
        Arc::new(partition.finish()),
        Arc::new(records.finish()),
        Arc::new(size.finish()),
        Arc::new(value_counts.finish()),
        Arc::new(null_counts.finish()),
        Arc::new(lower.finish()),
        Arc::new(upper.finish()),
        Arc::new(equality.finish()),
    ];
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("content", DataType::Int32, false),
        Field::new("file_path", DataType::Utf8, false),
        Field::new("file_format", DataType::Utf8, false),
        Field::new("spec_id", DataType::Int32, false),
        Field::new("partition", DataType::Utf8, false),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_size_in_bytes", DataType::Int64, false),
        Field::new("value_counts", map(DataType::Int64), true),
        Field::new("null_value_counts", map(DataType::Int64), true),
        Field::new("lower_bounds", map(DataType::Utf8), true),
        Field::new("upper_bounds", map(DataType::Utf8), true),
        Field::new("equality_columns", DataType::Utf8, true),
    ]));
    // The builders' own field names may differ from ours: cast to the declared schema.
    let columns = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| datafusion::arrow::compute::cast(&c, f.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, columns)
}

/// `$partitions`: files and rows per partition of the scanned snapshot. Partitions on
/// columns the principal may not read in plaintext are merged (shown as `***`).
async fn partitions(table: &IcebergTableProvider, plaintext: Plaintext<'_>) -> Result<BatchResult> {
    #[derive(Default)]
    struct Part {
        records: i64,
        files: i64,
        bytes: i64,
        pos_records: i64,
        pos_files: i64,
        eq_records: i64,
        eq_files: i64,
    }
    let all = live_files(table).await?;
    let m = table.table().metadata();
    let schema = scanned_schema(table);
    let mut parts: BTreeMap<(String, i32), Part> = BTreeMap::new();
    for (f, spec) in &all {
        let name = partition_name(
            m.partition_spec_by_id(*spec).map(|s| s.as_ref()),
            &schema,
            f,
            plaintext,
        );
        let p = parts.entry((name, *spec)).or_default();
        let n = f.record_count() as i64;
        match f.content_type() {
            DataContentType::Data => {
                p.records += n;
                p.files += 1;
                p.bytes += f.file_size_in_bytes() as i64;
            }
            DataContentType::PositionDeletes => {
                p.pos_records += n;
                p.pos_files += 1;
            }
            DataContentType::EqualityDeletes => {
                p.eq_records += n;
                p.eq_files += 1;
            }
        }
    }
    let mut partition = StringBuilder::new();
    let mut spec = Int32Builder::new();
    let mut cols: Vec<Int64Builder> = (0..7).map(|_| Int64Builder::new()).collect();
    for ((name, spec_id), p) in &parts {
        partition.append_value(name);
        spec.append_value(*spec_id);
        for (b, v) in cols.iter_mut().zip([
            p.records,
            p.files,
            p.bytes,
            p.pos_records,
            p.pos_files,
            p.eq_records,
            p.eq_files,
        ]) {
            b.append_value(v);
        }
    }
    let names = [
        "record_count",
        "file_count",
        "total_data_file_size_in_bytes",
        "position_delete_record_count",
        "position_delete_file_count",
        "equality_delete_record_count",
        "equality_delete_file_count",
    ];
    let mut fields = vec![
        Field::new("partition", DataType::Utf8, false),
        Field::new("spec_id", DataType::Int32, false),
    ];
    fields.extend(names.iter().map(|n| Field::new(*n, DataType::Int64, false)));
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(partition.finish()), Arc::new(spec.finish())];
    arrays.extend(cols.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays))
}
