//! The tampering matrix of the decrypting reader, generated from each file's own layout:
//! every module type of every encrypted column (and the footer) bit-flipped; column
//! chunks and page indexes swapped between row groups, columns and files; truncations;
//! a wrong master key; a modified plaintext footer. Each read fails with one line naming
//! the file (and the column and module where there is one); none returns rows.

use std::ops::Range;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use clearice_crypto::modules::GCM_OVERHEAD;
use clearice_crypto::{KeyScope, ModuleType};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use parquet::arrow::arrow_reader::RowSelector;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};

use crate::reader::{
    Keys, Read, counter, open_reader, pme_fixtures, read_native, read_new, read_new_counted,
};

/// A module of a file: its type, column and bytes (length prefix included).
#[derive(Debug, Clone)]
struct At {
    kind: ModuleType,
    column: Option<String>,
    row_group: usize,
    range: Range<u64>,
}

/// The file's metadata as ClearIce's reader presents it (chunk offsets are the file's;
/// index lengths are plaintext lengths). parquet-rs cannot read CTR files to tell.
async fn metadata(path: &Path, keys: &Keys) -> Arc<ParquetMetaData> {
    use parquet::arrow::arrow_reader::ArrowReaderOptions;
    use parquet::arrow::async_reader::AsyncFileReader;
    let mut reader = open_reader(
        path,
        keys.scan(KeyScope::All),
        &ExecutionPlanMetricsSet::new(),
    );
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
    reader.get_metadata(Some(&options)).await.unwrap()
}

fn prefix(bytes: &[u8], at: u64) -> u64 {
    u64::from(u32::from_le_bytes(
        bytes[at as usize..at as usize + 4].try_into().unwrap(),
    ))
}

/// Every module of the chunks of `encrypted` columns (all when empty), their indexes,
/// and the footer.
async fn modules(path: &Path, keys: &Keys, encrypted: &[&str]) -> Vec<At> {
    let bytes = std::fs::read(path).unwrap();
    let md = metadata(path, keys).await;
    let size = bytes.len() as u64;
    let mut out = vec![At {
        kind: ModuleType::Footer,
        column: None,
        row_group: 0,
        // The footer module's tag sits right before the footer length and magic.
        range: size - 8 - 40..size - 8,
    }];
    for (rg, group) in md.row_groups().iter().enumerate() {
        for (col, c) in group.columns().iter().enumerate() {
            let column = Some(c.column_path().string());
            let top = c.column_path().parts()[0].clone();
            if !encrypted.is_empty() && !encrypted.contains(&top.as_str()) {
                continue;
            }
            let (start, len) = c.byte_range();
            let mut at = start;
            let mut dict = c.dictionary_page_offset().is_some();
            while at < start + len {
                let (hk, pk) = if dict {
                    (ModuleType::DictionaryPageHeader, ModuleType::DictionaryPage)
                } else {
                    (ModuleType::DataPageHeader, ModuleType::DataPage)
                };
                let h = 4 + prefix(&bytes, at);
                let p = 4 + prefix(&bytes, at + h);
                out.push(At {
                    kind: hk,
                    column: column.clone(),
                    row_group: rg,
                    range: at..at + h,
                });
                out.push(At {
                    kind: pk,
                    column: column.clone(),
                    row_group: rg,
                    range: at + h..at + h + p,
                });
                at += h + p;
                dict = false;
            }
            let index = md.offset_index().map(|o| &o[rg][col]);
            assert!(index.is_some(), "fixture without a page index");
            for (kind, off, len) in [
                (
                    ModuleType::ColumnIndex,
                    c.column_index_offset(),
                    c.column_index_length(),
                ),
                (
                    ModuleType::OffsetIndex,
                    c.offset_index_offset(),
                    c.offset_index_length(),
                ),
            ] {
                if let (Some(o), Some(l)) = (off, len) {
                    out.push(At {
                        kind,
                        column: column.clone(),
                        row_group: rg,
                        // The view's length is the plaintext's: add the module overhead.
                        range: o as u64..(o + i64::from(l) + GCM_OVERHEAD as i64) as u64,
                    });
                }
            }
        }
    }
    out
}

fn copy(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(src, &to).unwrap();
    to
}

/// A copy of `src` named `name` in `dir` with one bit of module `at` flipped: its first
/// ciphertext byte (after length and nonce); the footer's, its tag.
fn flipped(src: &Path, dir: &Path, name: &str, at: &At) -> PathBuf {
    let f = copy(src, dir, name);
    let mut b = std::fs::read(&f).unwrap();
    let pos = if at.kind == ModuleType::Footer {
        at.range.start + 20
    } else {
        at.range.start + 4 + 12
    };
    b[pos as usize] ^= 0x01;
    std::fs::write(&f, b).unwrap();
    f
}

/// Reads everything the module could be needed for; the error text.
async fn read_err(path: &Path, keys: &Keys, kind: ModuleType) -> String {
    let how = Read {
        page_index: matches!(kind, ModuleType::ColumnIndex | ModuleType::OffsetIndex),
        ..Default::default()
    };
    match read_new(path, keys.scan(KeyScope::All), &how).await {
        Ok(b) => panic!(
            "{}: {kind} tampering not detected ({} rows read)",
            path.display(),
            b.num_rows()
        ),
        Err(e) => e.to_string(),
    }
}

fn assert_names(e: &str, path: &Path, at: &At) {
    assert!(e.contains(&path.display().to_string()), "{at:?}: {e}");
    assert!(e.contains(at.kind.name()), "{at:?}: {e}");
    if let Some(c) = &at.column {
        assert!(e.contains(&format!("column '{c}'")), "{at:?}: {e}");
    }
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(!e.contains("ring::") && !e.contains("panicked"), "{e}");
}

#[tokio::test]
async fn every_module_type_flipped_is_detected_and_named() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    const PII: &[&str] = &["ssn", "email", "balance"];
    for (name, encrypted) in [
        ("gcm_256_v2.parquet", PII),
        ("ctr_columns.parquet", PII),
        ("gcm_nested_uniform.parquet", &[][..]),
    ] {
        let original = dir.join(name);
        let all = modules(&original, &keys, encrypted).await;
        let ctr = name.starts_with("ctr");
        // One module of each type per column (the first and the last page too).
        let mut seen = std::collections::HashSet::new();
        let picked: Vec<&At> = all
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                let last_page = *i + 1 == all.len()
                    || all[*i + 1].column != m.column
                    || all[*i + 1].row_group != m.row_group;
                seen.insert((m.kind, m.column.clone()))
                    || (last_page && m.kind == ModuleType::DataPage)
            })
            .map(|(_, m)| m)
            // AES-CTR page bodies carry no tag: the algorithm does not authenticate them.
            .filter(|m| {
                !(ctr && matches!(m.kind, ModuleType::DataPage | ModuleType::DictionaryPage))
            })
            .collect();
        let kinds: std::collections::HashSet<_> = picked.iter().map(|m| m.kind).collect();
        for k in [
            ModuleType::Footer,
            ModuleType::DataPageHeader,
            ModuleType::ColumnIndex,
            ModuleType::OffsetIndex,
        ] {
            assert!(kinds.contains(&k), "{name}: no {k} module");
        }
        if !ctr {
            assert!(kinds.contains(&ModuleType::DataPage), "{name}");
        }
        for at in picked {
            let f = flipped(&original, tmp.path(), name, at);
            let e = read_err(&f, &keys, at.kind).await;
            assert_names(&e, &f, at);
            assert!(e.contains("authentication failed"), "{at:?}: {e}");
        }
    }
}

/// Swaps two equally long byte ranges (of one file, or from another file).
fn swap(path: &Path, a: &Range<u64>, other: &[u8], b: &Range<u64>) {
    assert_eq!(
        a.end - a.start,
        b.end - b.start,
        "swapped ranges differ in length"
    );
    let mut bytes = std::fs::read(path).unwrap();
    let (a, b) = (
        a.start as usize..a.end as usize,
        b.start as usize..b.end as usize,
    );
    let from_other = other[b.clone()].to_vec();
    bytes[a].copy_from_slice(&from_other);
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn modules_moved_between_row_groups_columns_and_files_are_detected() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let a_file = dir.join("swap_a.parquet");
    let b_file = dir.join("swap_b.parquet");
    let a = modules(&a_file, &keys, &[]).await;
    let b = modules(&b_file, &keys, &[]).await;
    let find = |list: &[At], kind, column: &str, rg| {
        list.iter()
            .find(|m| m.kind == kind && m.column.as_deref() == Some(column) && m.row_group == rg)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} of {column} in row group {rg}"))
    };
    let a_bytes = std::fs::read(&a_file).unwrap();
    let b_bytes = std::fs::read(&b_file).unwrap();
    let mut cases = 0;
    for kind in [
        ModuleType::DataPageHeader,
        ModuleType::DataPage,
        ModuleType::ColumnIndex,
        ModuleType::OffsetIndex,
    ] {
        let target = find(&a, kind, "a", 0);
        // From row group 1, from column b, from the same place in another file.
        for (source, bytes) in [
            (find(&a, kind, "a", 1), &a_bytes),
            (find(&a, kind, "b", 0), &a_bytes),
            (find(&b, kind, "a", 0), &b_bytes),
        ] {
            if source.range.end - source.range.start != target.range.end - target.range.start {
                continue;
            }
            let f = copy(&a_file, tmp.path(), "swapped.parquet");
            swap(&f, &target.range, bytes, &source.range);
            let e = read_err(&f, &keys, kind).await;
            assert_names(&e, &f, &target);
            cases += 1;
        }
    }
    assert!(cases >= 10, "only {cases} swaps had equal lengths");
}

#[tokio::test]
async fn truncated_files_and_wrong_keys_fail_with_the_file_named() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let original = dir.join("swap_a.parquet");
    let full = std::fs::read(&original).unwrap();
    let chunk = modules(&original, &keys, &[]).await[1].range.clone();
    for cut in [
        full.len() - 1,
        full.len() - 6,
        full.len() - 100,
        full.len() / 2,
        chunk.start as usize + 10,
        11,
    ] {
        let f = tmp.path().join("cut.parquet");
        std::fs::write(&f, &full[..cut]).unwrap();
        let e = match read_new(&f, keys.scan(KeyScope::All), &Read::default()).await {
            Ok(b) => panic!("cut at {cut}: {} rows read", b.num_rows()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&f.display().to_string()), "cut at {cut}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    // Another master key under the same id: the KMS refuses to unwrap, naming the id.
    let wrong = tmp.path().join("wrong.json");
    std::fs::write(
        &wrong,
        r#"{"footer_key": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "pii_key": "AAAAAAAAAAAAAAAAAAAAAA==", "finance_key": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#,
    )
    .unwrap();
    let e = read_new(
        &original,
        Keys::keyring(&wrong).scan(KeyScope::All),
        &Read::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("footer_key") && e.contains(&original.display().to_string()),
        "{e}"
    );
    assert!(!e.contains("AAAAAAAA"), "{e}");
}

#[tokio::test]
async fn a_modified_plaintext_footer_fails_its_signature() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let f = copy(
        &dir.join("ctr_plaintext_footer.parquet"),
        tmp.path(),
        "pf.parquet",
    );
    let mut b = std::fs::read(&f).unwrap();
    // The writer's name, in the plaintext footer.
    let at = b
        .windows(9)
        .rposition(|w| w == b"parquet-c")
        .expect("created_by in the footer");
    b[at + 8] = b'C';
    std::fs::write(&f, b).unwrap();
    let how = Read {
        columns: Some(vec![0]),
        ..Default::default()
    };
    let e = read_new(&f, keys.scan(KeyScope::All), &how)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("footer signature mismatch") && e.contains(&f.display().to_string()),
        "{e}"
    );
}

/// A flipped page in a chunk the provider decrypts ahead of the reader (the next row
/// group's) fails the read that reaches it, named as any other, and not a read that stops
/// before it.
#[tokio::test]
async fn a_flipped_page_decrypted_ahead_fails_only_the_read_that_reaches_it() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // (GCM: AES-CTR page bodies carry no tag.)
    let src = dir.join("gcm_256_v2.parquet");
    let all = modules(&src, &keys, &["ssn"]).await;
    let at = all
        .iter()
        .find(|a| a.kind == ModuleType::DataPage && a.row_group == 1)
        .unwrap();
    let path = flipped(&src, tmp.path(), "flipped.parquet", at);
    let first = Read {
        row_groups: Some(vec![0]),
        ..Default::default()
    };
    let metrics = ExecutionPlanMetricsSet::new();
    let got = read_new_counted(
        &path,
        keys.scan_keeping_keys(KeyScope::All),
        &first,
        &metrics,
    )
    .await
    .unwrap();
    assert_eq!(
        got,
        read_native(&dir.join("flat_plain_v2.parquet"), &keys, &first)
    );
    assert_eq!(counter(&metrics, "crypto_chunks_decrypted_ahead"), 3);
    let e = read_new(
        &path,
        keys.scan_keeping_keys(KeyScope::All),
        &Read::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert_names(&e, &path, at);
    // So does a page-range read of a few of its rows (page index; the row group's columns
    // decrypted concurrently).
    let few = Read {
        page_index: true,
        selection: Some(vec![
            RowSelector::skip(5000),
            RowSelector::select(10),
            RowSelector::skip(15_000 - 10),
        ]),
        ..Default::default()
    };
    let metrics = ExecutionPlanMetricsSet::new();
    let e = read_new_counted(&path, keys.scan_keeping_keys(KeyScope::All), &few, &metrics)
        .await
        .unwrap_err()
        .to_string();
    assert_names(&e, &path, at);
    assert_eq!(counter(&metrics, "crypto_chunks_decrypted"), 0);
}
