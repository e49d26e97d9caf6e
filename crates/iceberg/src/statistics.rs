//! Scan statistics as DataFusion's own Parquet listing computes them (row counts, null
//! counts, min/max and byte sizes per column) from each data file's footer as the scan's
//! keys decrypt it, so the optimizer orders joins and picks their build sides as it does
//! for the same files in plaintext.
//!
//! Footers are read at planning time; the statistics are cached per file, table schema,
//! principal and key scope (bounded in bytes, for [`TTL`]: a key the KMS stops granting
//! stops yielding statistics within it). The keys themselves are not cached: the footer's
//! reader, and the keys it was given, end with the scan being planned. Column statistics
//! reach the plan (and `EXPLAIN`) only for the columns the scan's principal reads in
//! plaintext ([`Shown`]), and only where the file's column has the table's type (a
//! promoted column, `int` written and `long` read, has none: its bounds would be of
//! another type).
//!
//! Only the row count is exact (a file without deletes whose footer agrees with its
//! manifest entry): bounds, null counts and sums are estimates, so DataFusion orders
//! joins with them but never answers `min`/`max`/`count(col)` from them nor replaces a
//! column by a constant (a footer's bounds leave NaN out, a row group may lack
//! statistics, a writer may omit null counts). Float columns get no bounds at all: a
//! NaN compares above every bound, so pruning by them would drop its row.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Statistics;
use datafusion::common::stats::{ColumnStatistics, Precision};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::metadata::ParquetMetaData;

use clearice_crypto::{KeyScope, ScanGrant};
use clearice_pme::DecryptingReaderFactory;

use crate::field_id::field_id;

/// Files in a scan above which no footer is read for statistics (row counts still come
/// from the manifests).
pub(crate) const MAX_FILES: usize = 1024;

/// Statistics kept before the cache starts over: entries, and their bytes.
const CACHE_ENTRIES: usize = 8192;
const CACHE_BYTES: usize = 64 << 20;

/// How long a file's statistics are reused without reading its footer (and so asking
/// for its keys) again.
pub const TTL: Duration = Duration::from_secs(600);

/// Which column statistics a scan's plan may carry.
#[derive(Debug, Clone, Default)]
pub enum Shown {
    /// Decided by the scan's key scope: every column under [`KeyScope::All`] (no policy),
    /// else none.
    #[default]
    ByScope,
    /// These columns (indices in the table's schema): those the principal reads in
    /// plaintext.
    Columns(Arc<BTreeSet<usize>>),
    /// The manifests' record counts only, no footer read: a coordinator whose workers
    /// scan (and hold the keys) plans without decrypting a footer.
    RowCounts,
    /// No statistics at all, not even row counts (a scan under a row filter: the table's
    /// size is not the principal's to see).
    Nothing,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The table (catalog-qualified) and the file: two catalogs may name the same path
    /// in different stores.
    table: String,
    location: String,
    size: u64,
    /// [`fingerprint`] of the table schema the statistics are matched to: after a
    /// schema change, or read as of an older schema, a file's columns are other columns.
    schema: u64,
    principal: String,
    keys: String,
}

struct Entry {
    stats: Arc<Statistics>,
    at: Instant,
    bytes: usize,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Entry>,
    bytes: usize,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// The columns of `schema` as statistics are matched to them: name, field id and type.
fn fingerprint(schema: &Schema) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in schema.fields() {
        (f.name(), field_id(f), f.data_type()).hash(&mut h);
    }
    h.finish()
}

/// Bytes an entry holds, roughly.
fn size_of(stats: &Statistics) -> usize {
    let value =
        |p: &Precision<datafusion::common::ScalarValue>| p.get_value().map_or(0, |v| v.size());
    std::mem::size_of::<Statistics>()
        + stats
            .column_statistics
            .iter()
            .map(|c| {
                std::mem::size_of::<ColumnStatistics>()
                    + value(&c.min_value)
                    + value(&c.max_value)
                    + value(&c.sum_value)
            })
            .sum::<usize>()
}

/// The statistics of one data file for columns `schema` (the table's file columns),
/// matched by field id as the scan matches them; `None` if its footer cannot be read
/// under this grant (the scan itself names the problem when it reads the file).
pub(crate) async fn of_file(
    factory: &DecryptingReaderFactory,
    grant: &ScanGrant,
    table: &str,
    location: &str,
    file: &PartitionedFile,
    schema: &SchemaRef,
) -> Option<Arc<Statistics>> {
    // A principal's own provider token may be refused tomorrow: not cached.
    let key = grant.credential.is_none().then(|| Key {
        table: table.to_owned(),
        location: location.to_owned(),
        size: file.object_meta.size,
        schema: fingerprint(schema),
        principal: grant.principal.clone(),
        keys: format!("{:?} {:?} {:?}", grant.scope, grant.route, grant.aad_prefix),
    });
    if let Some(k) = &key
        && let Some(e) = lock().entries.get(k)
        && e.at.elapsed() < TTL
    {
        clearice_metrics::cache_lookup(clearice_metrics::Cache::FileStatistics, true);
        return Some(Arc::clone(&e.stats));
    }
    clearice_metrics::cache_lookup(clearice_metrics::Cache::FileStatistics, false);
    let metadata = factory.metadata(file.clone()).await.ok()?;
    let stats = Arc::new(compute(&metadata, schema)?);
    if let Some(k) = key {
        let bytes = size_of(&stats);
        let mut cache = lock();
        if cache.entries.len() >= CACHE_ENTRIES || cache.bytes + bytes > CACHE_BYTES {
            *cache = Cache::default();
        }
        let entry = Entry {
            stats: Arc::clone(&stats),
            at: Instant::now(),
            bytes,
        };
        if let Some(old) = cache.entries.insert(k, entry) {
            cache.bytes -= old.bytes;
        }
        cache.bytes += bytes;
    }
    Some(stats)
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// DataFusion's statistics of a file, its columns named as the file names the field
/// ids of `schema` (a column the file lacks gets a name the file does not have: all
/// NULL, as the scan reads it). A column whose type in the file is not its type in
/// `schema` (a promoted `int` → `long`, `float` → `double`, a wider decimal) keeps no
/// statistics, and no bound is ever NULL: either would be a wrong answer once
/// DataFusion trusts it.
fn compute(metadata: &ParquetMetaData, schema: &SchemaRef) -> Option<Statistics> {
    let file_metadata = metadata.file_metadata();
    let physical = parquet_to_arrow_schema(
        file_metadata.schema_descr(),
        file_metadata.key_value_metadata(),
    )
    .ok()?;
    let by_id: HashMap<i32, &Field> = physical
        .fields()
        .iter()
        .filter_map(|f| Some((field_id(f)?, f.as_ref())))
        .collect();
    // The file's column for each of `schema`'s, if it has one.
    let in_file: Vec<Option<&Field>> = if by_id.is_empty() {
        // A file without field ids is read by name.
        schema
            .fields()
            .iter()
            .map(|f| physical.field_with_name(f.name()).ok())
            .collect()
    } else {
        schema
            .fields()
            .iter()
            .map(|f| field_id(f).and_then(|id| by_id.get(&id).copied()))
            .collect()
    };
    // `schema`'s columns under their names in the file.
    let logical = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .zip(&in_file)
            .enumerate()
            .map(|(i, (f, p))| {
                let name = match p {
                    Some(p) => p.name().clone(),
                    None => format!("__clearice_absent_{i}"),
                };
                f.as_ref().clone().with_name(name)
            })
            .collect::<Vec<Field>>(),
    ));
    let mut stats = DFParquetMetadata::statistics_from_parquet_metadata(metadata, &logical).ok()?;
    for ((column, f), p) in stats
        .column_statistics
        .iter_mut()
        .zip(schema.fields())
        .zip(&in_file)
    {
        if p.is_some_and(|p| !same_type(p.data_type(), f.data_type())) {
            *column = ColumnStatistics::new_unknown();
        }
        if f.data_type().is_floating() {
            column.min_value = Precision::Absent;
            column.max_value = Precision::Absent;
            column.sum_value = Precision::Absent;
        }
        for bound in [
            &mut column.min_value,
            &mut column.max_value,
            &mut column.sum_value,
        ] {
            *bound = if bound.get_value().is_some_and(|v| v.is_null()) {
                Precision::Absent
            } else {
                bound.clone().to_inexact()
            };
        }
        column.null_count = column.null_count.to_inexact();
    }
    Some(stats)
}

/// Whether a file's column type is the table's: equal, or the same strings or bytes in
/// another Arrow layout (their statistics are the same bytes).
fn same_type(file: &DataType, table: &DataType) -> bool {
    use DataType::{Binary, BinaryView, LargeBinary, LargeUtf8, Utf8, Utf8View};
    file == table
        || matches!(
            (file, table),
            (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View)
                | (
                    Binary | LargeBinary | BinaryView,
                    Binary | LargeBinary | BinaryView
                )
        )
}

/// `stats` (of the table's file columns) for the full scan schema of `width` columns,
/// with column statistics only where `shown` allows; `None` when nothing may be shown.
pub(crate) fn shown(
    stats: &Statistics,
    shown: &Shown,
    scope: &KeyScope,
    width: usize,
) -> Option<Statistics> {
    let visible = |i: usize| match shown {
        Shown::ByScope => matches!(scope, KeyScope::All),
        Shown::Columns(c) => c.contains(&i),
        Shown::RowCounts | Shown::Nothing => false,
    };
    if matches!(shown, Shown::Nothing) {
        return None;
    }
    let column_statistics = (0..width)
        .map(|i| match stats.column_statistics.get(i) {
            Some(c) if visible(i) => c.clone(),
            _ => ColumnStatistics::new_unknown(),
        })
        .collect();
    Some(Statistics {
        num_rows: stats.num_rows,
        total_byte_size: Precision::Absent,
        column_statistics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::ScalarValue;

    fn stats() -> Statistics {
        Statistics {
            num_rows: Precision::Exact(10),
            total_byte_size: Precision::Absent,
            column_statistics: vec![
                ColumnStatistics::new_unknown()
                    .with_min_value(Precision::Exact(ScalarValue::Int32(Some(1))))
                    .with_max_value(Precision::Exact(ScalarValue::Int32(Some(9)))),
                ColumnStatistics::new_unknown()
                    .with_min_value(Precision::Exact(ScalarValue::Int32(Some(100))))
                    .with_null_count(Precision::Exact(2)),
            ],
        }
    }

    /// A principal sees the statistics of the columns it reads in plaintext, and none
    /// of the others: not under an enforcing policy by default, not under a row filter.
    #[test]
    fn only_plaintext_columns_keep_their_statistics() {
        let s = stats();
        let scoped = KeyScope::MasterKeys(BTreeSet::new());
        let one = shown(&s, &Shown::Columns(Arc::new([0].into())), &scoped, 3).unwrap();
        assert_eq!(one.num_rows, Precision::Exact(10));
        assert_eq!(one.column_statistics.len(), 3);
        assert!(one.column_statistics[0].min_value.get_value().is_some());
        assert_eq!(one.column_statistics[1], ColumnStatistics::new_unknown());
        assert_eq!(one.column_statistics[2], ColumnStatistics::new_unknown());

        let by_scope = shown(&s, &Shown::ByScope, &scoped, 2).unwrap();
        assert!(
            by_scope
                .column_statistics
                .iter()
                .all(|c| *c == ColumnStatistics::new_unknown())
        );
        let all = shown(&s, &Shown::ByScope, &KeyScope::All, 2).unwrap();
        assert_eq!(all.column_statistics[1].null_count, Precision::Exact(2));
        assert!(shown(&s, &Shown::Nothing, &KeyScope::All, 2).is_none());
    }

    fn field(name: &str, id: i32, t: DataType) -> Field {
        Field::new(name, t, true).with_metadata(
            [(
                parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_owned(),
                id.to_string(),
            )]
            .into(),
        )
    }

    /// The footer of a file of `a` (field id 1, int 1..=3), `b` (field id 2, int
    /// 10..=30) and `f` (field id 4, double 2.5, NaN, 2.5), as written.
    fn footer() -> ParquetMetaData {
        use datafusion::arrow::array::{Float64Array, Int32Array, RecordBatch};
        let schema = Arc::new(Schema::new(vec![
            field("a", 1, DataType::Int32),
            field("b", 2, DataType::Int32),
            field("f", 4, DataType::Float64),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 3])),
                Arc::new(Int32Array::from(vec![10, 20, 30])),
                Arc::new(Float64Array::from(vec![2.5, f64::NAN, 2.5])),
            ],
        )
        .unwrap();
        let mut bytes = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes::Bytes::from(bytes))
            .unwrap()
    }

    fn bounds(s: &Statistics, i: usize) -> (Option<ScalarValue>, Option<ScalarValue>) {
        let c = &s.column_statistics[i];
        (
            c.min_value.get_value().cloned(),
            c.max_value.get_value().cloned(),
        )
    }

    /// Statistics follow field ids, not names or positions; a column whose file type is
    /// not the table's (promoted `int` → `long`) and one the file lacks get no bounds.
    #[test]
    fn statistics_follow_field_ids_and_types() {
        let footer = footer();
        let int = |v| Some(ScalarValue::Int32(Some(v)));
        // Reordered and renamed: `y` is field 1 (`a`), `x` field 2 (`b`).
        let renamed = Arc::new(Schema::new(vec![
            field("x", 2, DataType::Int32),
            field("y", 1, DataType::Int32),
        ]));
        let s = compute(&footer, &renamed).unwrap();
        assert_eq!(s.num_rows, Precision::Exact(3));
        assert_eq!(bounds(&s, 0), (int(10), int(30)));
        assert_eq!(bounds(&s, 1), (int(1), int(3)));
        // Estimates only: DataFusion answers no aggregate from them.
        let a = &s.column_statistics[1];
        assert!(matches!(a.min_value, Precision::Inexact(_)), "{a:?}");
        assert!(matches!(a.max_value, Precision::Inexact(_)), "{a:?}");
        assert_eq!(a.null_count, Precision::Inexact(0));
        // The footer's double bounds leave the NaN out: none are kept.
        let float = Arc::new(Schema::new(vec![field("f", 4, DataType::Float64)]));
        let s = compute(&footer, &float).unwrap();
        assert_eq!(bounds(&s, 0), (None, None));
        assert_eq!(s.column_statistics[0].sum_value, Precision::Absent);
        // `a` promoted to long; field 3 added after the file was written.
        let evolved = Arc::new(Schema::new(vec![
            field("a", 1, DataType::Int64),
            field("b", 2, DataType::Int32),
            field("c", 3, DataType::Int32),
        ]));
        let s = compute(&footer, &evolved).unwrap();
        assert_eq!(s.column_statistics[0], ColumnStatistics::new_unknown());
        assert_eq!(bounds(&s, 1), (int(10), int(30)));
        assert_eq!(bounds(&s, 2), (None, None));
        // The cache tells the schemas apart.
        assert_ne!(fingerprint(&renamed), fingerprint(&evolved));
        let swapped = Schema::new(vec![
            field("x", 1, DataType::Int32),
            field("y", 2, DataType::Int32),
        ]);
        assert_ne!(fingerprint(&renamed), fingerprint(&swapped));
    }
}
