//! A flipped byte in each module of a ClearIce-written file: one line naming the file, the
//! column (for column modules) and what failed authentication, never `ring::error`.

use crate::common::local_side_file_reader;
use clearice_crypto::KeyScope;
use datafusion::parquet::encryption::decrypt::FileDecryptionProperties;
use datafusion::parquet::file::metadata::ParquetMetaDataReader;

fn flip(path: &std::path::Path, at: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_each_module_is_named_with_file_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let engine = crate::common::demo_engine(&dir).await;
    let mut files: Vec<_> = std::fs::read_dir(dir.join("warehouse/sales/customers/data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let file = files[0].clone();
    let shown = file.display().to_string();
    // Offsets of the ssn chunk of row group 0, from the decrypted footer.
    let retriever = engine.key_resolver().scoped_retriever(
        shown.clone(),
        Some(local_side_file_reader()),
        KeyScope::All,
    );
    let props = FileDecryptionProperties::with_key_retriever(retriever)
        .build()
        .unwrap();
    let bytes = bytes::Bytes::from(std::fs::read(&file).unwrap());
    let md = ParquetMetaDataReader::new()
        .with_decryption_properties(Some(props))
        .parse_and_finish(&bytes)
        .unwrap();
    let rg = md.row_group(0);
    let ssn = (0..rg.num_columns())
        .map(|i| rg.column(i))
        .find(|c| c.column_path().string() == "ssn")
        .unwrap();
    let start = ssn
        .dictionary_page_offset()
        .unwrap_or(ssn.data_page_offset()) as u64;
    let len = bytes.len() as u64;
    let session = engine.session("admin");
    let query = async || {
        session
            .sql("SELECT ssn FROM lake.sales.customers")
            .await
            .unwrap_err()
            .to_string()
    };
    for (at, module, column) in [
        // length (4) + nonce (12), then the encrypted page header
        (start + 4 + 12 + 2, "page header", true),
        // the last bytes of the chunk: inside a page's data
        (start + ssn.compressed_size() as u64 - 20, "page", true),
        // inside the encrypted footer (before its length and magic)
        (len - 8 - 40, "footer", false),
    ] {
        flip(&file, at);
        let e = query().await;
        flip(&file, at);
        assert!(
            e.contains(&shown) && e.contains(module) && e.contains("authentication failed"),
            "byte {at}: {e}"
        );
        assert_eq!(e.contains("column 'ssn'"), column, "byte {at}: {e}");
        assert!(!e.contains("ring::error") && e.lines().count() == 1, "{e}");
    }
    // Restored: the query reads again.
    assert_eq!(
        session
            .sql("SELECT count(ssn) FROM lake.sales.customers")
            .await
            .unwrap()
            .rows(),
        1
    );
}
