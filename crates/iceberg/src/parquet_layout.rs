//! How ClearIce lays out the Parquet files it writes: Iceberg's `write.parquet.*` table
//! properties, where a table sets them, and ClearIce's defaults where it does not.
//!
//! | table property | Parquet setting | ClearIce default (Iceberg Java's) | ClearIce takes |
//! |---|---|---|---|
//! | `write.parquet.row-group-size-bytes` | row group size, encoded bytes | 128 MiB (128 MiB) | 1 MiB to 1 GiB |
//! | `write.parquet.page-size-bytes` | data page size | 1 MiB (1 MiB) | 4 KiB to 16 MiB |
//! | `write.parquet.page-row-limit` | rows per data page | 20,000 (20,000) | 1 to 262,144 |
//! | `write.parquet.dict-size-bytes` | dictionary page size | 1 MiB (2 MiB) | 4 KiB to 16 MiB |
//! | `write.parquet.compression-codec` | codec | `snappy` (`zstd`) | `zstd`, `snappy`, `gzip`, `brotli`, `lz4_raw`, `uncompressed` |
//! | `write.parquet.compression-level` | the codec's level | the codec's default | up to 9 (zstd from 1) |
//!
//! The bounds keep a table's layout, which its creator picks (here or in another engine),
//! from costing the server unbounded memory or CPU on the blocking threads that encode.
//!
//! Row groups also hold at most [`ROW_GROUP_ROWS`] rows: DataFusion reads a file in parallel
//! by row groups, so a 5M-row table in 1M-row groups keeps one of two cores idle for a
//! fifth of a scan (measured: benches/RESULTS.md, "Tables Iceberg encrypts itself").
//! Every column gets a page index (encrypted with its key), so selective reads skip pages.
//! Pages hold 20,000 rows (Iceberg Java's and parquet-rs's default; 8,192 before), so a
//! full scan of a table Iceberg encrypts opens up to 2.4 times fewer page modules (pages
//! are also cut at their size in bytes).

use std::collections::HashMap;

use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};

/// `write.parquet.row-group-size-bytes`.
pub const ROW_GROUP_BYTES: &str = "write.parquet.row-group-size-bytes";
/// `write.parquet.page-size-bytes`.
pub const PAGE_BYTES: &str = "write.parquet.page-size-bytes";
/// `write.parquet.page-row-limit`.
pub const PAGE_ROWS: &str = "write.parquet.page-row-limit";
/// `write.parquet.dict-size-bytes`.
pub const DICTIONARY_BYTES: &str = "write.parquet.dict-size-bytes";
/// `write.parquet.compression-codec`.
pub const CODEC: &str = "write.parquet.compression-codec";
/// `write.parquet.compression-level`.
pub const CODEC_LEVEL: &str = "write.parquet.compression-level";

/// The most rows a row group holds, whatever its size in bytes.
pub const ROW_GROUP_ROWS: usize = 256 * 1024;

/// A table property that does not give a valid layout: `property`, its value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table property {property} = '{value}': {reason}")]
pub struct LayoutError {
    /// The table property.
    pub property: String,
    /// Its value.
    pub value: String,
    /// What a valid value is.
    pub reason: String,
}

/// The Parquet writer settings of a table with `properties` (statistics per page, no
/// Bloom filters: parquet-rs writes them unencrypted). Values are bounded: a table's
/// creator (here or in another engine) picks the layout, not the server's memory or CPU.
pub fn writer_properties(
    properties: &HashMap<String, String>,
) -> Result<WriterPropertiesBuilder, LayoutError> {
    const KIB: i64 = 1024;
    const MIB: i64 = 1024 * KIB;
    let size = |key: &str, default: i64, lo: i64, hi: i64| -> Result<usize, LayoutError> {
        Ok(bounded(properties, key, lo, hi)?.unwrap_or(default) as usize)
    };
    Ok(WriterProperties::builder()
        .set_compression(compression(properties)?)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_bloom_filter_enabled(false)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(size(ROW_GROUP_BYTES, 128 * MIB, MIB, 1024 * MIB)?))
        .set_data_page_row_count_limit(size(PAGE_ROWS, 20_000, 1, ROW_GROUP_ROWS as i64)?)
        .set_data_page_size_limit(size(PAGE_BYTES, MIB, 4 * KIB, 16 * MIB)?)
        .set_dictionary_page_size_limit(size(DICTIONARY_BYTES, MIB, 4 * KIB, 16 * MIB)?))
}

/// Checks the `write.parquet.*` properties a CREATE TABLE sets.
pub fn check(properties: &HashMap<String, String>) -> Result<(), LayoutError> {
    writer_properties(properties).map(drop)
}

/// `properties[key]` as a whole number in `lo..=hi`, if set.
fn bounded(
    properties: &HashMap<String, String>,
    key: &str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, LayoutError> {
    let Some(v) = properties.get(key) else {
        return Ok(None);
    };
    match v.trim().parse::<i64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        _ => Err(LayoutError {
            property: key.to_owned(),
            // One line whatever the value holds.
            value: v.escape_debug().to_string(),
            reason: format!("ClearIce takes a whole number from {lo} to {hi}"),
        }),
    }
}

fn in_range<T>(level: parquet::errors::Result<T>) -> T {
    level.expect("the level was checked to be in 0..=9 (zstd: 1..=9), which every codec takes")
}

fn compression(properties: &HashMap<String, String>) -> Result<Compression, LayoutError> {
    let codec = properties.get(CODEC).map(|c| c.trim().to_ascii_lowercase());
    // Levels above 9 cost tens of times the CPU of the default on a blocking thread that
    // no statement timeout stops, and zstd's window grows with them. Checked whatever the
    // codec (snappy, lz4_raw and uncompressed take none).
    let lowest = i64::from(codec.as_deref() == Some("zstd")); // zstd has no level 0
    let level = bounded(properties, CODEC_LEVEL, lowest, 9)?;
    Ok(match codec.as_deref() {
        None | Some("snappy") => Compression::SNAPPY,
        Some("zstd") => Compression::ZSTD(match level {
            Some(l) => in_range(ZstdLevel::try_new(l as i32)),
            None => ZstdLevel::default(),
        }),
        Some("gzip") => Compression::GZIP(match level {
            Some(l) => in_range(GzipLevel::try_new(l as u32)),
            None => GzipLevel::default(),
        }),
        Some("brotli") => Compression::BROTLI(match level {
            Some(l) => in_range(BrotliLevel::try_new(l as u32)),
            None => BrotliLevel::default(),
        }),
        Some("lz4_raw") => Compression::LZ4_RAW,
        Some("uncompressed") => Compression::UNCOMPRESSED,
        Some(other) => {
            return Err(LayoutError {
                property: CODEC.to_owned(),
                value: other.escape_debug().to_string(),
                reason: "ClearIce writes zstd, snappy, gzip, brotli, lz4_raw or uncompressed \
                         (Parquet deprecates the Hadoop-framed lz4; lzo is not written)"
                    .into(),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_cap_row_groups_by_rows_and_bytes() {
        let p = writer_properties(&HashMap::new()).unwrap().build();
        assert_eq!(p.max_row_group_row_count(), Some(ROW_GROUP_ROWS));
        assert_eq!(p.max_row_group_bytes(), Some(128 * 1024 * 1024));
        assert_eq!(p.data_page_row_count_limit(), 20_000);
        assert_eq!(p.dictionary_page_size_limit(), 1024 * 1024);
        assert_eq!(
            p.compression(&parquet::schema::types::ColumnPath::from("c")),
            Compression::SNAPPY
        );
        assert!(p.bloom_filter_properties(&"c".into()).is_none());
    }

    #[test]
    fn table_properties_set_the_layout() {
        let p = writer_properties(&props(&[
            (ROW_GROUP_BYTES, "1048576"),
            (PAGE_ROWS, "1000"),
            (PAGE_BYTES, "65536"),
            (DICTIONARY_BYTES, "4096"),
            (CODEC, "ZSTD"),
            (CODEC_LEVEL, "5"),
        ]))
        .unwrap()
        .build();
        assert_eq!(p.max_row_group_bytes(), Some(1_048_576));
        assert_eq!(p.data_page_row_count_limit(), 1000);
        assert_eq!(p.data_page_size_limit(), 65536);
        assert_eq!(p.dictionary_page_size_limit(), 4096);
        assert_eq!(
            p.compression(&"c".into()),
            Compression::ZSTD(ZstdLevel::try_new(5).unwrap())
        );
    }

    #[test]
    fn bad_values_name_the_property() {
        for (k, v) in [
            (ROW_GROUP_BYTES, "0"),
            (ROW_GROUP_BYTES, "1"),
            (PAGE_ROWS, "-1"),
            (PAGE_BYTES, "1MB"),
            (PAGE_BYTES, "1073741824"),
            (DICTIONARY_BYTES, "1073741824"),
            (CODEC, "lzo"),
            (CODEC, "lz4"),
            (CODEC_LEVEL, "x"),
            (CODEC_LEVEL, "22"),
            (CODEC_LEVEL, "-5"),
        ] {
            let e = check(&props(&[(CODEC, "zstd"), (k, v)])).unwrap_err();
            assert_eq!(
                (e.property.as_str(), e.value.to_lowercase()),
                (k, v.to_lowercase())
            );
        }
        // A value with a line break is shown on one line.
        let e = check(&props(&[(PAGE_ROWS, "1\nforged")])).unwrap_err();
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }
}
