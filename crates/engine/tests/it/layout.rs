//! The Parquet layout of the files ClearIce writes: Iceberg's `write.parquet.*` table
//! properties, and row groups small enough for every core to scan its share.

use crate::common::{query, query_err};
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::metadata::ParquetMetaDataReader;

fn data_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_groups_are_capped_and_table_properties_set_the_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let engine = crate::common::demo_engine(&dir).await;
    let admin = engine.session("admin");
    query(
        &admin,
        "CREATE TABLE lake.sales.wide WITH ('write.parquet.compression-codec' = 'zstd', \
         'write.parquet.page-row-limit' = '2048') \
         AS SELECT value AS id, value % 7 AS k FROM generate_series(1, 600000)",
    )
    .await
    .unwrap();
    let files = data_files(&dir.join("warehouse/sales/wide/data"));
    let (mut rows, mut groups) = (0i64, 0);
    for f in &files {
        let bytes = bytes::Bytes::from(std::fs::read(f).unwrap());
        let md = ParquetMetaDataReader::new()
            .with_page_index_policy(datafusion::parquet::file::metadata::PageIndexPolicy::Required)
            .parse_and_finish(&bytes)
            .unwrap();
        for rg in md.row_groups() {
            assert!(
                rg.num_rows() <= 262_144,
                "{}: {} rows",
                f.display(),
                rg.num_rows()
            );
            assert!(matches!(rg.column(0).compression(), Compression::ZSTD(_)));
            rows += rg.num_rows();
            groups += 1;
        }
        // Pages of at most 2,048 rows (parquet-rs checks the limit every 1,024 rows): the
        // offset index of the first column.
        let pages = &md.offset_index().unwrap()[0][0];
        let locations = pages.page_locations();
        let first_rows = locations[1].first_row_index - locations[0].first_row_index;
        assert!(first_rows <= 2048, "{first_rows} rows in a page");
    }
    assert_eq!(rows, 600_000);
    assert!(groups >= 3, "{groups} row groups");
    let n = query(&admin, "SELECT count(*), sum(k) FROM lake.sales.wide")
        .await
        .unwrap();
    let v = crate::common::json_rows(&n);
    assert_eq!(v[0][0], 600_000);

    // A value Iceberg's property cannot take: one line naming the table and property,
    // and no table.
    for (prop, value) in [
        ("write.parquet.compression-codec", "lzo"),
        ("write.parquet.row-group-size-bytes", "0"),
        ("write.parquet.compression-level", "high"),
    ] {
        let e = query_err(
            &admin,
            &format!("CREATE TABLE lake.sales.bad WITH ('{prop}' = '{value}') AS SELECT 1 AS x"),
        )
        .await;
        assert!(
            e.contains("lake.sales.bad") && e.contains(prop) && e.lines().count() == 1,
            "{e}"
        );
    }
    let e = query_err(&admin, "SELECT * FROM lake.sales.bad").await;
    assert!(e.contains("bad"), "{e}");
}
