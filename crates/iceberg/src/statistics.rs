//! Scan statistics as DataFusion's own Parquet listing computes them (row counts, null
//! counts, min/max and byte sizes per column) from each data file's footer as the scan's
//! keys decrypt it, so the optimizer orders joins and picks their build sides as it does
//! for the same files in plaintext.
//!
//! Footers are read at planning time; the statistics are cached per file, principal and
//! key scope (bounded, process-wide). The keys themselves are not cached: the footer's
//! reader, and the keys it was given, end with the scan being planned. Column statistics
//! reach the plan (and `EXPLAIN`) only for the columns the scan's principal reads in
//! plaintext ([`Shown`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
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

/// Statistics kept before the cache starts over.
const CACHE_ENTRIES: usize = 8192;

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
    /// No statistics at all, not even row counts (a scan under a row filter: the table's
    /// size is not the principal's to see).
    Nothing,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    location: String,
    size: u64,
    principal: String,
    keys: String,
}

static CACHE: LazyLock<Mutex<HashMap<Key, Arc<Statistics>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The statistics of one data file for columns `schema` (the table's file columns),
/// matched by field id as the scan matches them; `None` if its footer cannot be read
/// under this grant (the scan itself names the problem when it reads the file).
pub(crate) async fn of_file(
    factory: &DecryptingReaderFactory,
    grant: &ScanGrant,
    location: &str,
    file: &PartitionedFile,
    schema: &SchemaRef,
) -> Option<Arc<Statistics>> {
    // A principal's own provider token may be refused tomorrow: not cached.
    let key = grant.credential.is_none().then(|| Key {
        location: location.to_owned(),
        size: file.object_meta.size,
        principal: grant.principal.clone(),
        keys: format!("{:?} {:?} {:?}", grant.scope, grant.route, grant.aad_prefix),
    });
    if let Some(k) = &key
        && let Some(s) = lock().get(k)
    {
        return Some(Arc::clone(s));
    }
    let metadata = factory.metadata(file.clone()).await.ok()?;
    let stats = Arc::new(compute(&metadata, schema)?);
    if let Some(k) = key {
        let mut cache = lock();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(k, Arc::clone(&stats));
    }
    Some(stats)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<Key, Arc<Statistics>>> {
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// DataFusion's statistics of a file, its columns named as the file names the field
/// ids of `schema` (a column the file lacks gets a name the file does not have: all
/// NULL, as the scan reads it).
fn compute(metadata: &ParquetMetaData, schema: &SchemaRef) -> Option<Statistics> {
    let file_metadata = metadata.file_metadata();
    let physical = parquet_to_arrow_schema(
        file_metadata.schema_descr(),
        file_metadata.key_value_metadata(),
    )
    .ok()?;
    let by_id: HashMap<i32, &str> = physical
        .fields()
        .iter()
        .filter_map(|f| Some((field_id(f)?, f.name().as_str())))
        .collect();
    let logical = if by_id.is_empty() {
        // A file without field ids is read by name.
        Arc::clone(schema)
    } else {
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let name = match field_id(f).and_then(|id| by_id.get(&id)) {
                    Some(name) => (*name).to_owned(),
                    None => format!("__clearice_absent_{i}"),
                };
                f.as_ref().clone().with_name(name)
            })
            .collect();
        Arc::new(Schema::new(fields))
    };
    DFParquetMetadata::statistics_from_parquet_metadata(metadata, &logical).ok()
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
        Shown::Nothing => false,
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
}
