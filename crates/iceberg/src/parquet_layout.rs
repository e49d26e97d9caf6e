//! How ClearIce lays out the Parquet files it writes: Iceberg's `write.parquet.*` table
//! properties, where a table sets them, and ClearIce's defaults where it does not.
//!
//! | table property | Parquet setting | ClearIce default (Iceberg Java's) |
//! |---|---|---|
//! | `write.parquet.row-group-size-bytes` | row group size, encoded bytes | 128 MiB (128 MiB) |
//! | `write.parquet.page-size-bytes` | data page size | 1 MiB (1 MiB) |
//! | `write.parquet.page-row-limit` | rows per data page | 20,000 (20,000) |
//! | `write.parquet.dict-size-bytes` | dictionary page size | 2 MiB (2 MiB) |
//! | `write.parquet.compression-codec` | codec: `zstd`, `snappy`, `gzip`, `lz4`, `brotli`, `uncompressed` | `snappy` (`zstd`) |
//! | `write.parquet.compression-level` | the codec's level | the codec's default |
//!
//! Row groups also hold at most [`ROW_GROUP_ROWS`] rows: DataFusion reads a file in parallel
//! by row groups, so a 5M-row table in 1M-row groups keeps one of two cores idle for a
//! fifth of a scan (measured: benches/RESULTS.md, "Tables Iceberg encrypts itself").
//! Every column gets a page index (encrypted with its key), so selective reads skip pages.
//! Pages hold 20,000 rows (Iceberg Java's and parquet-rs's default; 8,192 before), so a
//! full scan of a table Iceberg encrypts opens 2.4 times fewer page modules.

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
const DEFAULT_ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;
const DEFAULT_PAGE_ROWS: usize = 20_000;

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
/// Bloom filters: parquet-rs writes them unencrypted).
pub fn writer_properties(
    properties: &HashMap<String, String>,
) -> Result<WriterPropertiesBuilder, LayoutError> {
    let size = |key: &str| -> Result<Option<usize>, LayoutError> {
        let Some(v) = properties.get(key) else {
            return Ok(None);
        };
        match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(LayoutError {
                property: key.to_owned(),
                value: v.clone(),
                reason: "must be a positive whole number".into(),
            }),
        }
    };
    let mut b = WriterProperties::builder()
        .set_compression(compression(properties)?)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_bloom_filter_enabled(false)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(
            size(ROW_GROUP_BYTES)?.unwrap_or(DEFAULT_ROW_GROUP_BYTES),
        ))
        .set_data_page_row_count_limit(size(PAGE_ROWS)?.unwrap_or(DEFAULT_PAGE_ROWS));
    if let Some(n) = size(PAGE_BYTES)? {
        b = b.set_data_page_size_limit(n);
    }
    if let Some(n) = size(DICTIONARY_BYTES)? {
        b = b.set_dictionary_page_size_limit(n);
    }
    Ok(b)
}

/// Checks the `write.parquet.*` properties a CREATE TABLE sets.
pub fn check(properties: &HashMap<String, String>) -> Result<(), LayoutError> {
    writer_properties(properties).map(drop)
}

fn compression(properties: &HashMap<String, String>) -> Result<Compression, LayoutError> {
    let err = |key: &str, value: &str, reason: String| LayoutError {
        property: key.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let codec = properties.get(CODEC).map(|c| c.trim().to_ascii_lowercase());
    let level = match properties.get(CODEC_LEVEL) {
        None => None,
        Some(v) => Some(
            v.trim()
                .parse::<i32>()
                .map_err(|_| err(CODEC_LEVEL, v, "must be a whole number".into()))?,
        ),
    };
    let bad_level = |e: parquet::errors::ParquetError| {
        err(
            CODEC_LEVEL,
            properties.get(CODEC_LEVEL).map_or("", String::as_str),
            e.to_string(),
        )
    };
    Ok(match codec.as_deref() {
        None | Some("snappy") => Compression::SNAPPY,
        Some("zstd") => Compression::ZSTD(match level {
            Some(l) => ZstdLevel::try_new(l).map_err(bad_level)?,
            None => ZstdLevel::default(),
        }),
        Some("gzip") => Compression::GZIP(match level {
            Some(l) => {
                GzipLevel::try_new(u32::try_from(l).unwrap_or(u32::MAX)).map_err(bad_level)?
            }
            None => GzipLevel::default(),
        }),
        Some("brotli") => Compression::BROTLI(match level {
            Some(l) => {
                BrotliLevel::try_new(u32::try_from(l).unwrap_or(u32::MAX)).map_err(bad_level)?
            }
            None => BrotliLevel::default(),
        }),
        Some("lz4") => Compression::LZ4_RAW,
        Some("uncompressed") => Compression::UNCOMPRESSED,
        Some(other) => {
            return Err(err(
                CODEC,
                other,
                "ClearIce writes zstd, snappy, gzip, brotli, lz4 or uncompressed".into(),
            ));
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
        assert_eq!(p.max_row_group_bytes(), Some(DEFAULT_ROW_GROUP_BYTES));
        assert_eq!(p.data_page_row_count_limit(), DEFAULT_PAGE_ROWS);
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
            (PAGE_ROWS, "-1"),
            (PAGE_BYTES, "1MB"),
            (CODEC, "lzo"),
            (CODEC_LEVEL, "x"),
        ] {
            let e = check(&props(&[(CODEC, "zstd"), (k, v)])).unwrap_err();
            assert_eq!(
                (e.property.as_str(), e.value.to_lowercase()),
                (k, v.to_lowercase())
            );
        }
        let e = check(&props(&[(CODEC, "zstd"), (CODEC_LEVEL, "99")])).unwrap_err();
        assert_eq!(e.property, CODEC_LEVEL);
    }
}
