//! Encrypted appends to Iceberg tables: Parquet files written with PME (per-column keys,
//! footer key, PKMT1 key material that PyArrow and parquet-java read), partitioned by the
//! table's default spec, committed with one Iceberg fast-append. Manifests carry value
//! counts, null counts and min/max bounds of the columns written in plaintext only (so
//! Iceberg prunes files on them), nothing at all for encrypted columns (no plaintext of an
//! encrypted column leaks into metadata); Bloom filters are never written (parquet-rs
//! writes them unencrypted).
//!
//! Nothing is lost on failure: files written before a failed commit are removed and the
//! table stays at its previous snapshot.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use clearice_crypto::{CallContext, KeyMaterialWriter, Kms, ProviderRef, SecretKey};
use datafusion::arrow::array::{
    Array, ArrayRef, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use iceberg::Catalog;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, Literal, PrimitiveLiteral,
    PrimitiveType, Struct, Type,
};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use parquet::arrow::ArrowWriter;
use parquet::encryption::encrypt::FileEncryptionProperties;
use parquet::file::properties::WriterPropertiesBuilder;

use crate::error::{Error, Result};
use clearice_pme::ProviderColumnKey;

/// How to encrypt the files of one write (the policy's protection rules).
#[derive(Debug, Clone, Default)]
pub struct EncryptionSpec {
    /// Master key id of the footer key.
    pub footer_key_id: String,
    /// Column path -> master key id. Columns not listed are not encrypted.
    pub column_keys: BTreeMap<String, String>,
    /// Write the footer in plaintext (signed with the footer key).
    pub plaintext_footer: bool,
    /// AAD prefix bound into every module and not stored in the files (readers supply
    /// it: the table's policy `aad_prefix`), so a file moved to another table fails.
    pub aad_prefix: Option<Vec<u8>>,
}

/// Crypto providers that keep the master keys of some columns (policy `provider`):
/// their columns are encrypted by the provider ([`clearice_pme::rekey`]), not locally.
#[derive(Debug, Clone, Default)]
pub struct WriteProviders {
    /// Master key id → the provider holding it.
    pub by_master_key: BTreeMap<String, ProviderRef>,
    /// Who writes (sent with every provider call).
    pub context: CallContext,
}

/// Appends `batches` to `table` as encrypted Parquet and commits one snapshot.
pub async fn append_encrypted(
    catalog: &dyn Catalog,
    table: &Table,
    batches: &[RecordBatch],
    spec: &EncryptionSpec,
    kms: Arc<dyn Kms>,
) -> Result<Table> {
    append_encrypted_with(
        catalog,
        table,
        batches,
        spec,
        kms,
        &WriteProviders::default(),
    )
    .await
}

/// [`append_encrypted`], with the columns under `providers`' master keys encrypted by
/// those providers: each file gets a new data key from the provider (key material only),
/// is written with a stand-in key, and the provider re-encrypts every module of those
/// columns. The footer key must be local.
pub async fn append_encrypted_with(
    catalog: &dyn Catalog,
    table: &Table,
    batches: &[RecordBatch],
    spec: &EncryptionSpec,
    kms: Arc<dyn Kms>,
    providers: &WriteProviders,
) -> Result<Table> {
    let writer = FileWriter::try_new(table, spec.clone(), Some(kms), providers.clone())?;
    let result = async {
        let files = writer.write(batches.to_vec()).await?;
        commit_append(catalog, table, files, BTreeMap::new()).await
    }
    .await;
    if result.is_err() {
        writer.abort().await;
    }
    result
}

/// Writes the data files of one statement: rows split by the table's partition spec,
/// encoded and encrypted on blocking threads, each file put whole with one create-only
/// request. [`FileWriter::abort`] removes every file it wrote (a failed statement
/// leaves nothing behind).
#[derive(Debug)]
pub struct FileWriter {
    table: Table,
    name: String,
    schema: SchemaRef,
    spec: Arc<EncryptionSpec>,
    kms: Option<Arc<dyn Kms>>,
    providers: WriteProviders,
    /// Iceberg encrypts the table itself: each file under its own key
    /// ([`crate::native_write`]), `spec` and `providers` unused.
    native: bool,
    /// Row groups, pages and codec from the table's `write.parquet.*` properties.
    layout: WriterPropertiesBuilder,
    /// Files are named `data/<commit id>-<n>.parquet`.
    commit_id: String,
    next_file: std::sync::atomic::AtomicUsize,
    written: std::sync::Mutex<Vec<String>>,
}

impl FileWriter {
    /// A writer of `table`'s files under `spec`; checks the spec against the table.
    pub fn try_new(
        table: &Table,
        spec: EncryptionSpec,
        kms: Option<Arc<dyn Kms>>,
        providers: WriteProviders,
    ) -> Result<Self> {
        let name = table.identifier().to_string();
        let werr = |reason: String| Error::Write {
            table: name.clone(),
            reason,
        };
        let schema = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
            .map_err(|source| Error::Iceberg {
                table: name.clone(),
                source: Box::new(source),
            })?;
        let layout = crate::parquet_layout::writer_properties(table.metadata().properties())
            .map_err(|e| werr(e.to_string()))?;
        let native = crate::native::table_key_id(table.metadata()).is_some();
        if native {
            return Ok(Self {
                table: table.clone(),
                name,
                schema: Arc::new(schema),
                spec: Arc::default(),
                kms,
                providers: WriteProviders::default(),
                native,
                layout,
                commit_id: format!("{:016x}", rand::random::<u64>()),
                next_file: Default::default(),
                written: Default::default(),
            });
        }
        if spec.footer_key_id.is_empty() && !spec.column_keys.is_empty() {
            return Err(werr(
                "column keys are set but no footer key: PME needs a footer key".into(),
            ));
        }
        if !spec.footer_key_id.is_empty() && kms.is_none() {
            return Err(werr(format!(
                "the policy encrypts it under footer key '{}' but no KMS is configured ([kms])",
                spec.footer_key_id
            )));
        }
        for c in spec.column_keys.keys() {
            if schema.field_with_name(c).is_err() {
                return Err(werr(format!(
                    "encryption spec names column '{c}', which the table does not have"
                )));
            }
        }
        if providers.by_master_key.contains_key(&spec.footer_key_id) {
            return Err(werr(format!(
                "footer key '{}' is held by a crypto provider: writes need a local footer key",
                spec.footer_key_id
            )));
        }
        let remote_columns = spec
            .column_keys
            .values()
            .any(|m| providers.by_master_key.contains_key(m));
        if remote_columns && spec.plaintext_footer {
            return Err(werr(
                "columns encrypted by a crypto provider need an encrypted footer".into(),
            ));
        }
        Ok(Self {
            table: table.clone(),
            name,
            schema: Arc::new(schema),
            spec: Arc::new(spec),
            kms,
            providers,
            native,
            layout,
            commit_id: format!("{:016x}", rand::random::<u64>()),
            next_file: Default::default(),
            written: Default::default(),
        })
    }

    /// Files that also store each row's `_row_id` and `_last_updated_sequence_number`
    /// (rows a row-level write copies in a format 3 table).
    pub fn with_lineage(mut self) -> Self {
        let mut fields: Vec<_> = self.schema.fields().iter().cloned().collect();
        fields.extend(crate::lineage::fields().map(Arc::new));
        self.schema = Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
            fields,
            self.schema.metadata().clone(),
        ));
        self
    }

    /// The table's Arrow schema (field ids in the metadata): what [`FileWriter::write`]
    /// takes.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn err(&self, reason: String) -> Error {
        Error::Write {
            table: self.name.clone(),
            reason,
        }
    }

    /// Writes `batches` (the table's schema) as one file per partition value and
    /// returns the files' manifest entries (not committed).
    pub async fn write(&self, batches: Vec<RecordBatch>) -> Result<Vec<DataFile>> {
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(vec![]);
        }
        let (table, schema) = (self.table.clone(), Arc::clone(&self.schema));
        let parts = datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            partition_batches(&table, &schema, &batches)?
                .into_iter()
                .map(|(p, b)| Ok((p, sort_batches(&table, b)?)))
                .collect::<std::result::Result<Vec<_>, String>>()
        })
        .join()
        .await
        .map_err(|e| self.err(e.to_string()))?
        .map_err(|e| self.err(e))?;
        let mut files = Vec::with_capacity(parts.len());
        for (partition, batches) in parts {
            files.push(self.write_file(partition, batches).await?);
        }
        Ok(files)
    }

    async fn write_file(&self, partition: Struct, batches: Vec<RecordBatch>) -> Result<DataFile> {
        let n = self
            .next_file
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let location = self.table.metadata().location().trim_end_matches('/');
        let uri = format!("{location}/data/{}-{n:05}.parquet", self.commit_id);
        let werr = |e: String| self.err(format!("'{uri}': {e}"));
        let mut context = self.providers.context.clone();
        context.file = uri.clone();
        context
            .application
            .insert("table".into(), self.name.clone());
        // Provider-held column keys: key material from the provider, a stand-in key for
        // parquet-rs.
        let mut stand_ins = HashMap::new();
        for master in self.spec.column_keys.values() {
            let Some(provider) = self.providers.by_master_key.get(master) else {
                continue;
            };
            if stand_ins.contains_key(master) {
                continue;
            }
            let made = provider
                .new_data_key(&context, master, false)
                .await
                .map_err(|e| werr(e.to_string()))?;
            stand_ins.insert(
                master.clone(),
                ProviderColumnKey {
                    stand_in: SecretKey::from_bytes(rand::random::<[u8; 16]>().to_vec()),
                    key_metadata: made.key_metadata,
                    provider: Arc::clone(provider),
                },
            );
        }
        // The file's data keys (the KMS wraps them, asynchronously), then encoding,
        // encryption and metrics on a blocking thread. A table Iceberg encrypts: one key
        // for the whole file, kept in its manifest entry.
        let (keys, native) = if self.native {
            let e = crate::native_write::file_encryption(&self.table, &self.name, &uri)?;
            (None, Some(e))
        } else {
            let keys = file_keys(&self.spec, self.kms.as_deref(), &stand_ins)
                .await
                .map_err(&werr)?;
            (keys, None)
        };
        let (native_properties, key_metadata) = match native {
            Some(e) => (Some(e.properties), Some(e.key_metadata)),
            None => (None, None),
        };
        let (schema, spec) = (Arc::clone(&self.schema), Arc::clone(&self.spec));
        let layout = self.layout.clone();
        let ischema = Arc::clone(self.table.metadata().current_schema());
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        let (encoded, stand_ins) =
            datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
                let encoded = write_file(&schema, &batches, layout, &spec, keys, native_properties)
                    .and_then(|(bytes, footer)| {
                        let metrics = plaintext_metrics(&ischema, &batches, &spec)?;
                        Ok((bytes, footer, metrics))
                    });
                (encoded, stand_ins)
            })
            .join()
            .await
            .map_err(|e| werr(e.to_string()))?;
        let (mut bytes, footer_key, metrics) = encoded.map_err(&werr)?;
        if let Some(footer_key) = footer_key
            && !stand_ins.is_empty()
        {
            let keys: Vec<ProviderColumnKey> = stand_ins.into_values().collect();
            clearice_pme::rekey(
                &mut bytes,
                &footer_key,
                self.spec.aad_prefix.as_deref(),
                &keys,
                &context,
            )
            .await
            .map_err(|e| werr(e.to_string()))?;
        }
        let size = bytes.len() as u64;
        // One create-only put: the object is there whole or not at all, and a name
        // someone else holds is never overwritten (nor removed by `abort`).
        let io = self.table.file_io();
        io.new_output(&uri)
            .map_err(|e| werr(e.to_string()))?
            .write(bytes.into())
            .await
            .map_err(|e| werr(e.to_string()))?;
        self.written.lock().expect("written").push(uri.clone());
        data_file(
            &self.table,
            uri.clone(),
            partition,
            (rows, size),
            metrics,
            key_metadata,
        )
        .map_err(werr)
    }

    /// Removes every file this writer wrote (the statement failed before its commit).
    pub async fn abort(&self) {
        let written = std::mem::take(&mut *self.written.lock().expect("written"));
        let io = self.table.file_io();
        for uri in &written {
            if let Err(e) = io.delete(uri).await {
                tracing::warn!(file = %uri, error = %e, "file of a failed write not removed");
            }
        }
    }
}

/// Commit attempts of one write before a conflict is reported.
const COMMIT_ATTEMPTS: usize = 6;

/// Appends `files` to `table` in one snapshot (Iceberg fast append). A concurrent commit
/// (the catalog refuses ours) is retried on the table as it is then, as long as its
/// partition spec is still the one the files were written for.
pub async fn commit_append(
    catalog: &dyn Catalog,
    table: &Table,
    files: Vec<DataFile>,
    properties: BTreeMap<String, String>,
) -> Result<Table> {
    let name = table.identifier().to_string();
    crate::native::refuse_write(table, &name)?;
    let ierr = |source: iceberg::Error| Error::Iceberg {
        table: name.clone(),
        source: Box::new(source),
    };
    let spec_id = table.metadata().default_partition_spec_id();
    let mut current = table.clone();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let tx = Transaction::new(&current);
        let tx = tx
            .fast_append()
            .add_data_files(files.clone())
            .set_snapshot_properties(properties.clone().into_iter().collect())
            .apply(tx)
            .map_err(ierr)?;
        match tx.commit(catalog).await {
            Ok(t) => return Ok(t),
            Err(e)
                if attempt < COMMIT_ATTEMPTS
                    && (e.retryable()
                        || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts) =>
            {
                tracing::debug!(table = %name, attempt, error = %e, "commit conflict, retrying");
                let backoff = 20u64 << attempt.min(5);
                tokio::time::sleep(std::time::Duration::from_millis(
                    backoff + rand::random::<u64>() % backoff,
                ))
                .await;
                current = catalog.load_table(table.identifier()).await.map_err(ierr)?;
                if current.metadata().default_partition_spec_id() != spec_id {
                    return Err(Error::Write {
                        table: name.clone(),
                        reason: "the table's partition spec changed while writing; run the statement again".into(),
                    });
                }
            }
            Err(e) => return Err(ierr(e)),
        }
    }
}

/// The keys of one data file: its footer key and each encrypted column's key, with their
/// key material.
struct FileKeys {
    footer: SecretKey,
    footer_metadata: Vec<u8>,
    columns: Vec<(String, SecretKey, Vec<u8>)>,
}

/// Fresh data keys for one file under `spec` (the KMS wraps them: asynchronous), or none
/// for a plaintext file; provider-held columns get their stand-in keys.
async fn file_keys(
    spec: &EncryptionSpec,
    kms: Option<&dyn Kms>,
    stand_ins: &HashMap<String, ProviderColumnKey>,
) -> std::result::Result<Option<FileKeys>, String> {
    if spec.footer_key_id.is_empty() {
        return Ok(None);
    }
    let kms = kms.ok_or("no KMS for the footer key")?;
    let mut keys = KeyMaterialWriter::new(kms);
    let (footer, footer_metadata) = keys
        .data_key(&spec.footer_key_id, true)
        .await
        .map_err(|e| e.to_string())?;
    let mut columns = Vec::with_capacity(spec.column_keys.len());
    for (column, master) in &spec.column_keys {
        if let Some(s) = stand_ins.get(master) {
            columns.push((column.clone(), s.stand_in.clone(), s.key_metadata.to_vec()));
            continue;
        }
        let (k, md) = keys
            .data_key(master, false)
            .await
            .map_err(|e| e.to_string())?;
        columns.push((column.clone(), k, md));
    }
    Ok(Some(FileKeys {
        footer,
        footer_metadata,
        columns,
    }))
}

/// Encodes and encrypts one data file in memory with `keys` (CPU work: run on a
/// blocking thread).
fn write_file(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    layout: WriterPropertiesBuilder,
    spec: &EncryptionSpec,
    keys: Option<FileKeys>,
    native: Option<Arc<FileEncryptionProperties>>,
) -> std::result::Result<(Vec<u8>, Option<SecretKey>), String> {
    let mut footer_key = None;
    let mut props = layout;
    if let Some(keys) = keys {
        footer_key = Some(keys.footer.clone());
        let mut b = FileEncryptionProperties::builder(keys.footer.expose().to_vec())
            .with_footer_key_metadata(keys.footer_metadata)
            .with_plaintext_footer(spec.plaintext_footer);
        if let Some(prefix) = &spec.aad_prefix {
            b = b
                .with_aad_prefix(prefix.clone())
                .with_aad_prefix_storage(false);
        }
        for (column, key, metadata) in keys.columns {
            b = b.with_column_key_and_metadata(&column, key.expose().to_vec(), metadata);
        }
        props = props.with_file_encryption_properties(b.build().map_err(|e| e.to_string())?);
    } else if let Some(native) = native {
        props = props.with_file_encryption_properties(native);
    }
    let mut file = Vec::new();
    let mut w = ArrowWriter::try_new(&mut file, Arc::clone(schema), Some(props.build()))
        .map_err(|e| e.to_string())?;
    for batch in batches {
        let batch = RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())
            .map_err(|e| e.to_string())?;
        w.write(&batch).map_err(|e| e.to_string())?;
    }
    w.close().map_err(|e| e.to_string())?;
    Ok((file, footer_key))
}

/// Column metrics of one data file, by field id.
#[derive(Debug, Default)]
struct Metrics {
    value_counts: HashMap<i32, u64>,
    null_counts: HashMap<i32, u64>,
    lower: HashMap<i32, Datum>,
    upper: HashMap<i32, Datum>,
}

/// Longest string (bytes) kept as a manifest bound.
const MAX_STRING_BOUND: usize = 64;

/// Metrics of the top-level primitive columns that are written in plaintext; encrypted
/// columns get none (bounds would put their plaintext into the manifest).
fn plaintext_metrics(
    ischema: &iceberg::spec::Schema,
    batches: &[RecordBatch],
    spec: &EncryptionSpec,
) -> std::result::Result<Metrics, String> {
    let mut m = Metrics::default();
    for field in ischema.as_struct().fields() {
        if spec.column_keys.contains_key(&field.name) {
            continue;
        }
        let Type::Primitive(ty) = field.field_type.as_ref() else {
            continue;
        };
        let mut bounds: Option<(Datum, Datum)> = None;
        let mut seen = false;
        for batch in batches {
            let Ok(col) = batch.schema().index_of(&field.name) else {
                continue;
            };
            seen = true;
            let array = batch.column(col);
            *m.value_counts.entry(field.id).or_default() += array.len() as u64;
            *m.null_counts.entry(field.id).or_default() += array.null_count() as u64;
            if let Some((lo, hi)) = bounds_of(ty, array) {
                bounds = Some(match bounds {
                    None => (lo, hi),
                    Some((l, h)) => (if lo < l { lo } else { l }, if hi > h { hi } else { h }),
                });
            }
        }
        if !seen {
            continue;
        }
        // Long strings would bloat every manifest: such a column gets no bounds in this
        // file (no pruning on it, never a wrong one).
        let too_long = |d: &Datum| matches!(d.literal(), PrimitiveLiteral::String(s) if s.len() > MAX_STRING_BOUND);
        if let Some((lo, hi)) = bounds
            && !too_long(&lo)
            && !too_long(&hi)
        {
            m.lower.insert(field.id, lo);
            m.upper.insert(field.id, hi);
        }
    }
    Ok(m)
}

/// Min and max of a column as Iceberg bounds, computed with Arrow's kernels; `None` for
/// types without bounds here (decimal, binary, uuid, time...) and all-NULL columns. NaN is
/// never a bound.
fn bounds_of(ty: &PrimitiveType, array: &ArrayRef) -> Option<(Datum, Datum)> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::compute::{max, max_boolean, max_string, min, min_boolean, min_string};
    use datafusion::arrow::datatypes::{
        Date32Type, Float32Type, Float64Type, Int32Type, Int64Type, TimeUnit,
        TimestampMicrosecondType,
    };
    fn floats<T: Copy + PartialOrd>(
        values: impl Iterator<Item = Option<T>>,
        nan: impl Fn(T) -> bool,
    ) -> Option<(T, T)> {
        let mut out: Option<(T, T)> = None;
        for v in values.flatten().filter(|v| !nan(*v)) {
            out = Some(match out {
                None => (v, v),
                Some((lo, hi)) => (if v < lo { v } else { lo }, if v > hi { v } else { hi }),
            });
        }
        out
    }
    Some(match (ty, array.data_type()) {
        (PrimitiveType::Boolean, DataType::Boolean) => {
            let a = array.as_boolean();
            (Datum::bool(min_boolean(a)?), Datum::bool(max_boolean(a)?))
        }
        (PrimitiveType::Int, DataType::Int32) => {
            let a = array.as_primitive::<Int32Type>();
            (Datum::int(min(a)?), Datum::int(max(a)?))
        }
        (PrimitiveType::Long, DataType::Int64) => {
            let a = array.as_primitive::<Int64Type>();
            (Datum::long(min(a)?), Datum::long(max(a)?))
        }
        (PrimitiveType::Float, DataType::Float32) => {
            let (lo, hi) = floats(array.as_primitive::<Float32Type>().iter(), f32::is_nan)?;
            (Datum::float(lo), Datum::float(hi))
        }
        (PrimitiveType::Double, DataType::Float64) => {
            let (lo, hi) = floats(array.as_primitive::<Float64Type>().iter(), f64::is_nan)?;
            (Datum::double(lo), Datum::double(hi))
        }
        (PrimitiveType::String, DataType::Utf8) => {
            let a = array.as_string::<i32>();
            (Datum::string(min_string(a)?), Datum::string(max_string(a)?))
        }
        (PrimitiveType::Date, DataType::Date32) => {
            let a = array.as_primitive::<Date32Type>();
            (Datum::date(min(a)?), Datum::date(max(a)?))
        }
        (PrimitiveType::Timestamp, DataType::Timestamp(TimeUnit::Microsecond, None)) => {
            let a = array.as_primitive::<TimestampMicrosecondType>();
            (
                Datum::timestamp_micros(min(a)?),
                Datum::timestamp_micros(max(a)?),
            )
        }
        (PrimitiveType::Timestamptz, DataType::Timestamp(TimeUnit::Microsecond, Some(_))) => {
            let a = array.as_primitive::<TimestampMicrosecondType>();
            (
                Datum::timestamptz_micros(min(a)?),
                Datum::timestamptz_micros(max(a)?),
            )
        }
        _ => return None,
    })
}

fn data_file(
    table: &Table,
    uri: String,
    partition: Struct,
    (rows, size): (u64, u64),
    metrics: Metrics,
    key_metadata: Option<Vec<u8>>,
) -> std::result::Result<DataFile, String> {
    DataFileBuilder::default()
        .key_metadata(key_metadata)
        .content(DataContentType::Data)
        .file_path(uri)
        .file_format(DataFileFormat::Parquet)
        .partition(partition)
        .partition_spec_id(table.metadata().default_partition_spec_id())
        .record_count(rows)
        .file_size_in_bytes(size)
        .value_counts(metrics.value_counts)
        .null_value_counts(metrics.null_counts)
        .lower_bounds(metrics.lower)
        .upper_bounds(metrics.upper)
        .build()
        .map_err(|e| e.to_string())
}

/// Groups rows by the table's default partition spec (identity, year/month/day/hour,
/// bucket, truncate: whatever iceberg's transforms compute as int, long, string or date).
fn partition_batches(
    table: &Table,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> std::result::Result<Vec<(Struct, Vec<RecordBatch>)>, String> {
    let spec = table.metadata().default_partition_spec();
    let ischema = table.metadata().current_schema();
    let batches = batches
        .iter()
        .map(|b| RecordBatch::try_new(Arc::clone(schema), b.columns().to_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("batch does not match the table schema: {e}"))?;
    if spec.fields().is_empty() {
        // One file of the batches as they are (no copy).
        return Ok(vec![(Struct::empty(), batches)]);
    }
    let batch = concat_batches(schema, &batches).map_err(|e| e.to_string())?;
    let mut keys: Vec<ArrayRef> = Vec::new();
    for f in spec.fields() {
        let source = ischema
            .field_by_id(f.source_id)
            .ok_or("partition source column missing")?;
        let col = batch
            .column_by_name(&source.name)
            .ok_or("partition source column missing")?;
        let func = iceberg::transform::create_transform_function(&f.transform)
            .map_err(|e| e.to_string())?;
        keys.push(func.transform(Arc::clone(col)).map_err(|e| e.to_string())?);
    }
    type Group = (Vec<Option<Literal>>, Vec<u32>);
    let mut groups: HashMap<Vec<Option<String>>, Group> = HashMap::new();
    let mut order = Vec::new();
    for row in 0..batch.num_rows() {
        let lits: Vec<Option<Literal>> = keys
            .iter()
            .map(|k| literal(k, row))
            .collect::<std::result::Result<_, _>>()?;
        let key: Vec<Option<String>> = lits
            .iter()
            .map(|l| l.as_ref().map(|l| format!("{l:?}")))
            .collect();
        let entry = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            (lits, Vec::new())
        });
        entry.1.push(row as u32);
    }
    order
        .into_iter()
        .map(|k| {
            let (lits, rows) = groups.remove(&k).expect("present");
            let b =
                take_record_batch(&batch, &UInt32Array::from(rows)).map_err(|e| e.to_string())?;
            Ok((Struct::from_iter(lits), vec![b]))
        })
        .collect()
}

/// Rows in the table's sort order (its default `SortOrder`, transforms applied), if it
/// has one: readers then skip more with the files' statistics.
fn sort_batches(
    table: &Table,
    batches: Vec<RecordBatch>,
) -> std::result::Result<Vec<RecordBatch>, String> {
    use datafusion::arrow::compute::{SortColumn, SortOptions, lexsort_to_indices};
    use iceberg::spec::{NullOrder, SortDirection};
    let order = table.metadata().default_sort_order();
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if order.fields.is_empty() || rows < 2 {
        return Ok(batches);
    }
    let batch = match batches.as_slice() {
        [one] => one.clone(),
        _ => concat_batches(&batches[0].schema(), &batches).map_err(|e| e.to_string())?,
    };
    let ischema = table.metadata().current_schema();
    let mut columns = Vec::with_capacity(order.fields.len());
    for f in &order.fields {
        let Some(source) = ischema.field_by_id(f.source_id) else {
            return Err(format!(
                "sort order names field id {}, which the table does not have",
                f.source_id
            ));
        };
        let col = batch
            .column_by_name(&source.name)
            .ok_or_else(|| format!("sort column '{}' missing", source.name))?;
        let values = iceberg::transform::create_transform_function(&f.transform)
            .and_then(|t| t.transform(Arc::clone(col)))
            .map_err(|e| e.to_string())?;
        columns.push(SortColumn {
            values,
            options: Some(SortOptions {
                descending: f.direction == SortDirection::Descending,
                nulls_first: f.null_order == NullOrder::First,
            }),
        });
    }
    let indices = lexsort_to_indices(&columns, None).map_err(|e| e.to_string())?;
    Ok(vec![
        take_record_batch(&batch, &indices).map_err(|e| e.to_string())?,
    ])
}

fn literal(a: &ArrayRef, row: usize) -> std::result::Result<Option<Literal>, String> {
    if a.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match a.data_type() {
        DataType::Int32 => Literal::int(
            a.as_any()
                .downcast_ref::<Int32Array>()
                .expect("int32")
                .value(row),
        ),
        DataType::Int64 => Literal::long(
            a.as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .value(row),
        ),
        DataType::Date32 => Literal::date(
            a.as_any()
                .downcast_ref::<Date32Array>()
                .expect("date32")
                .value(row),
        ),
        DataType::Utf8 => Literal::string(
            a.as_any()
                .downcast_ref::<StringArray>()
                .expect("utf8")
                .value(row),
        ),
        other => {
            return Err(format!(
                "partition values of type {other} are not supported yet"
            ));
        }
    }))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use iceberg::spec::{NestedField, Schema};

    #[test]
    fn metrics_cover_plaintext_columns_only_and_skip_long_strings() {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "note", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(3, "ssn", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(4, "day", Type::Primitive(PrimitiveType::Date)).into(),
            ])
            .build()
            .unwrap();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap());
        let long = "x".repeat(MAX_STRING_BOUND + 1);
        let batch = RecordBatch::try_new(
            arrow,
            vec![
                Arc::new(Int64Array::from(vec![7, 3, 9])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some(long.as_str()),
                ])),
                Arc::new(StringArray::from(vec!["111", "222", "333"])),
                Arc::new(Date32Array::from(vec![Some(20_000), Some(19_000), None])),
            ],
        )
        .unwrap();
        let spec = EncryptionSpec {
            footer_key_id: "f".into(),
            column_keys: [("ssn".to_string(), "k".to_string())].into(),
            plaintext_footer: false,
            aad_prefix: None,
        };
        let m = plaintext_metrics(&schema, &[batch], &spec).unwrap();
        assert_eq!(
            (&m.lower[&1], &m.upper[&1]),
            (&Datum::long(3), &Datum::long(9))
        );
        assert_eq!(
            (&m.lower[&4], &m.upper[&4]),
            (&Datum::date(19_000), &Datum::date(20_000))
        );
        assert_eq!((m.value_counts[&4], m.null_counts[&4]), (3, 1));
        // a string bound longer than the limit: counts, but no bounds
        assert_eq!(m.null_counts[&2], 1);
        assert!(!m.lower.contains_key(&2) && !m.upper.contains_key(&2));
        // the encrypted column: nothing at all
        for map in [&m.value_counts, &m.null_counts] {
            assert!(!map.contains_key(&3));
        }
        assert!(!m.lower.contains_key(&3) && !m.upper.contains_key(&3));
    }
}
