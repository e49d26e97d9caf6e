//! ClearIce's decrypting reader against parquet-rs's native PME decryption (the oracle):
//! every encrypted fixture read both ways gives identical Arrow data; files parquet-rs
//! cannot read (AES_GCM_CTR_V1) are compared with their GCM twins. Reads with the page
//! index and a row selection exercise page-range decryption.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use clearice_crypto::{
    CallContext, KeyResolver, KeyScope, KeyringKms, Kms, LocalProvider, ScanGrant, SecretKey,
};
use clearice_pme::{DecryptingReaderFactory, ScanKeys};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetFileReaderFactory;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::local::LocalFileSystem;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::arrow_reader::{
    ArrowReaderBuilder, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::encryption::decrypt::FileDecryptionProperties;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};

use clearice_testkit::{KEYS_128, KEYS_256, local_side_file_reader, parquet_testing_dir, python};

/// Keys of one fixture set: explicit keys and/or a KMS.
pub struct Keys {
    pub resolver: Arc<KeyResolver>,
    pub aad_prefix: Option<Vec<u8>>,
}

impl Keys {
    pub fn explicit(keys: &[(&str, &str)]) -> Self {
        Self::new(keys, None)
    }

    pub fn new(keys: &[(&str, &str)], kms: Option<Arc<dyn Kms>>) -> Self {
        let explicit: HashMap<String, SecretKey> = keys
            .iter()
            .map(|(id, k)| (id.to_string(), SecretKey::from_bytes(k.as_bytes().to_vec())))
            .collect();
        Self {
            resolver: Arc::new(KeyResolver::new(
                kms,
                explicit,
                clearice_crypto::DEFAULT_KEY_CACHE_TTL,
            )),
            aad_prefix: None,
        }
    }

    pub fn keyring(path: &Path) -> Self {
        let kms: Arc<dyn Kms> = Arc::new(KeyringKms::from_file(path).unwrap());
        Self::new(&[], Some(kms))
    }

    pub fn with_aad_prefix(mut self, p: &[u8]) -> Self {
        self.aad_prefix = Some(p.to_vec());
        self
    }

    /// Like [`Self::scan`], through a provider that keeps its keys: every module goes
    /// through `decrypt`/`encrypt` batches, as with a remote protection service.
    pub fn scan_keeping_keys(&self, scope: KeyScope) -> ScanKeys {
        let mut keys = self.scan(scope);
        keys.provider = Arc::new(KeepsKeys(keys.provider));
        keys
    }

    pub fn scan(&self, scope: KeyScope) -> ScanKeys {
        let provider: clearice_crypto::ProviderRef = Arc::new(LocalProvider::new(
            Arc::clone(&self.resolver),
            Some(local_side_file_reader()),
        ));
        let grant = ScanGrant {
            principal: "tester".into(),
            scope,
            aad_prefix: self.aad_prefix.clone(),
            ..ScanGrant::unrestricted()
        };
        ScanKeys::new(grant, &provider)
    }
}

/// The local provider without `release_key`: the reader must batch modules to it.
#[derive(Debug)]
struct KeepsKeys(clearice_crypto::ProviderRef);

#[async_trait::async_trait]
impl clearice_crypto::CryptoProvider for KeepsKeys {
    fn name(&self) -> &str {
        "keeps-keys"
    }

    async fn describe_key(
        &self,
        ctx: &CallContext,
        key_metadata: Bytes,
    ) -> Result<clearice_crypto::KeyRef, clearice_crypto::ProviderError> {
        self.0.describe_key(ctx, key_metadata).await
    }

    async fn decrypt(
        &self,
        ctx: &CallContext,
        batch: clearice_crypto::ModuleBatch,
    ) -> Result<Vec<Bytes>, clearice_crypto::ProviderError> {
        self.0.decrypt(ctx, batch).await
    }

    async fn encrypt(
        &self,
        ctx: &CallContext,
        batch: clearice_crypto::ModuleBatch,
    ) -> Result<Vec<Vec<u8>>, clearice_crypto::ProviderError> {
        self.0.encrypt(ctx, batch).await
    }
}

/// How to read.
#[derive(Clone, Default)]
pub struct Read {
    pub page_index: bool,
    pub selection: Option<Vec<RowSelector>>,
    pub columns: Option<Vec<usize>>,
    /// Row groups to read, in this order (all, in order, when `None`).
    pub row_groups: Option<Vec<usize>>,
}

impl Read {
    /// Batch size, row selection and projection, for either reader.
    fn shape<T>(&self, mut b: ArrowReaderBuilder<T>) -> ArrowReaderBuilder<T> {
        b = b.with_batch_size(1000);
        if let Some(s) = &self.selection {
            b = b.with_row_selection(RowSelection::from(s.clone()));
        }
        if let Some(g) = &self.row_groups {
            b = b.with_row_groups(g.clone());
        }
        if let Some(c) = &self.columns {
            let mask = parquet::arrow::ProjectionMask::roots(
                b.metadata().file_metadata().schema_descr(),
                c.iter().copied(),
            );
            b = b.with_projection(mask);
        }
        b
    }

    fn policy(&self) -> PageIndexPolicy {
        if self.page_index {
            PageIndexPolicy::Optional
        } else {
            PageIndexPolicy::Skip
        }
    }
}

/// A boxed reader as a reader (parquet-rs implements the trait for `Box<dyn ..>` without
/// `Send` only).
pub struct Boxed(Box<dyn AsyncFileReader + Send>);

impl AsyncFileReader for Boxed {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.0.get_bytes(range)
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        self.0.get_byte_ranges(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.0.get_metadata(options)
    }
}

/// ClearIce's decrypting reader over a local file, as a scan creates it.
pub fn open_reader(path: &Path, keys: ScanKeys, metrics: &ExecutionPlanMetricsSet) -> Boxed {
    let store = Arc::new(LocalFileSystem::new());
    let size = std::fs::metadata(path).unwrap().len();
    let location = object_store::path::Path::from_filesystem_path(path).unwrap();
    let file = PartitionedFile::new(location.to_string(), size);
    let factory = DecryptingReaderFactory::new(store, keys);
    Boxed(factory.create_reader(0, file, None, metrics).unwrap())
}

/// Reads with ClearIce's decrypting reader.
pub async fn read_new(
    path: &Path,
    keys: ScanKeys,
    how: &Read,
) -> parquet::errors::Result<RecordBatch> {
    read_new_counted(path, keys, how, &ExecutionPlanMetricsSet::new()).await
}

/// [`read_new`], with the reader's counters in `metrics`.
pub async fn read_new_counted(
    path: &Path,
    keys: ScanKeys,
    how: &Read,
    metrics: &ExecutionPlanMetricsSet,
) -> parquet::errors::Result<RecordBatch> {
    let reader = open_reader(path, keys, metrics);
    let options = ArrowReaderOptions::new().with_page_index_policy(how.policy());
    let b = ParquetRecordBatchStreamBuilder::new_with_options(reader, options).await?;
    let batches: Vec<RecordBatch> = how.shape(b).build()?.try_collect().await?;
    Ok(concat(batches))
}

fn concat(batches: Vec<RecordBatch>) -> RecordBatch {
    let schema = batches.first().expect("rows").schema();
    concat_batches(&schema, &batches).unwrap()
}

/// Reads with parquet-rs's own PME decryption (the oracle).
pub fn read_native(path: &Path, keys: &Keys, how: &Read) -> RecordBatch {
    let retriever = keys
        .resolver
        .retriever_for_file(path.display().to_string(), Some(local_side_file_reader()));
    let mut props = FileDecryptionProperties::with_key_retriever(retriever);
    if let Some(p) = &keys.aad_prefix {
        props = props.with_aad_prefix(p.clone());
    }
    let options = ArrowReaderOptions::new()
        .with_page_index_policy(how.policy())
        .with_file_decryption_properties(props.build().unwrap());
    let file = std::fs::File::open(path).unwrap();
    let b = ParquetRecordBatchReaderBuilder::try_new_with_options(file, options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let batches: Vec<RecordBatch> = how.shape(b).build().unwrap().map(|b| b.unwrap()).collect();
    concat(batches)
}

/// Reads `path` both ways, several ways, and asserts identical data.
pub async fn assert_same(path: &Path, keys: &Keys) {
    let rows = read_native(path, keys, &Read::default()).num_rows();
    let mut hows = vec![
        Read::default(),
        Read {
            page_index: true,
            ..Default::default()
        },
    ];
    if rows > 4 {
        // Skip, select, skip, select: page-range reads when the page index exists.
        let q = rows / 4;
        hows.push(Read {
            page_index: true,
            selection: Some(vec![
                RowSelector::skip(q),
                RowSelector::select(q / 2 + 1),
                RowSelector::skip(q),
                RowSelector::select(rows - 2 * q - (q / 2 + 1)),
            ]),
            ..Default::default()
        });
    }
    for (i, how) in hows.into_iter().enumerate() {
        let native = read_native(path, keys, &how);
        let new = read_new(path, keys.scan(KeyScope::All), &how)
            .await
            .unwrap_or_else(|e| panic!("{} (read {i}): {e}", path.display()));
        assert_eq!(new.schema(), native.schema(), "{}", path.display());
        assert_eq!(new, native, "{}", path.display());
        assert!(new.num_rows() > 0, "{}", path.display());
    }
}

fn testing(dir: &Path, f: &str) -> PathBuf {
    dir.join(f)
}

#[tokio::test]
async fn parquet_testing_files_read_as_parquet_rs_reads_them() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    for f in [
        "uniform_encryption.parquet.encrypted",
        "encrypt_columns_and_footer.parquet.encrypted",
        "encrypt_columns_plaintext_footer.parquet.encrypted",
        "encrypt_columns_and_footer_aad.parquet.encrypted",
        "encrypt_columns_and_footer_bloom_filter.parquet.encrypted",
    ] {
        assert_same(&testing(&dir, f), &Keys::explicit(KEYS_128)).await;
    }
    for f in [
        "aes256/uniform_encryption.parquet.encrypted",
        "aes256/encrypt_columns_and_footer.parquet.encrypted",
        "aes256/encrypt_columns_plaintext_footer.parquet.encrypted",
    ] {
        assert_same(&testing(&dir, f), &Keys::explicit(KEYS_256)).await;
    }
    assert_same(
        &testing(
            &dir,
            "encrypt_columns_and_footer_disable_aad_storage.parquet.encrypted",
        ),
        &Keys::explicit(KEYS_128).with_aad_prefix(b"tester"),
    )
    .await;
}

#[tokio::test]
async fn external_key_material_reads_as_parquet_rs_reads_it() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let keyring = tmp.path().join("keyring.json");
    std::fs::write(
        &keyring,
        r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ==", "kc1": "MTIzNDU2Nzg5MDEyMzQ1MA==", "kc2": "MTIzNDU2Nzg5MDEyMzQ1MQ=="}"#,
    )
    .unwrap();
    assert_same(
        &testing(&dir, "external_key_material_java.parquet.encrypted"),
        &Keys::keyring(&keyring),
    )
    .await;
}

#[tokio::test]
async fn ctr_files_read_like_their_gcm_twins() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    for (ctr, gcm, keys) in [
        (
            "encrypt_columns_and_footer_ctr.parquet.encrypted",
            "encrypt_columns_and_footer.parquet.encrypted",
            KEYS_128,
        ),
        (
            "aes256/encrypt_columns_and_footer_ctr.parquet.encrypted",
            "aes256/encrypt_columns_and_footer.parquet.encrypted",
            KEYS_256,
        ),
    ] {
        let keys = Keys::explicit(keys);
        let twin = read_native(&testing(&dir, gcm), &keys, &Read::default());
        for how in [
            Read::default(),
            Read {
                page_index: true,
                ..Default::default()
            },
        ] {
            let new = read_new(&testing(&dir, ctr), keys.scan(KeyScope::All), &how)
                .await
                .unwrap_or_else(|e| panic!("{ctr}: {e}"));
            assert_eq!(new, twin, "{ctr}");
        }
    }
}

#[tokio::test]
async fn aad_prefix_must_be_supplied_and_right() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let f = testing(
        &dir,
        "encrypt_columns_and_footer_disable_aad_storage.parquet.encrypted",
    );
    let keys = Keys::explicit(KEYS_128);
    let e = read_new(&f, keys.scan(KeyScope::All), &Read::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("AAD prefix") && e.contains("aad_prefix_as_hex"),
        "{e}"
    );
    let wrong = Keys::explicit(KEYS_128).with_aad_prefix(b"other");
    let e = read_new(&f, wrong.scan(KeyScope::All), &Read::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("footer") && e.contains("authentication failed"),
        "{e}"
    );
    // A stored prefix is checked against a supplied one.
    let stored = testing(&dir, "encrypt_columns_and_footer_aad.parquet.encrypted");
    let e = read_new(&stored, wrong.scan(KeyScope::All), &Read::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("authentication failed"), "{e}");
}

#[tokio::test]
async fn plaintext_footer_columns_read_without_keys_and_encrypted_ones_are_refused() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let f = testing(&dir, "encrypt_columns_plaintext_footer.parquet.encrypted");
    let keys = Keys::explicit(&[]);
    // No key at all: the plaintext columns (0: boolean_field, 1: int32_field) read.
    let how = Read {
        columns: Some(vec![0, 1]),
        page_index: true,
        ..Default::default()
    };
    let new = read_new(&f, keys.scan(KeyScope::All), &how).await.unwrap();
    let native = read_native(&f, &Keys::explicit(KEYS_128), &how);
    assert_eq!(new, native);
    // An encrypted column is refused with its name.
    let how = Read {
        columns: Some(vec![5]),
        ..Default::default()
    };
    let e = read_new(&f, keys.scan(KeyScope::All), &how)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("double_field") && e.contains("not decrypted"),
        "{e}"
    );
}

/// PyArrow-written fixtures (`scripts/pme_fixtures.py`, generated once per test run):
/// their directory and their keyring's keys.
pub fn pme_fixtures() -> Option<(PathBuf, Keys)> {
    let dir = pyarrow_fixtures()?.join("pme");
    let keys = Keys::keyring(&dir.join("keyring.json"));
    Some((dir, keys))
}

fn pyarrow_fixtures() -> Option<&'static Path> {
    static DIR: std::sync::OnceLock<Option<tempfile::TempDir>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let python = python()?;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pme");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pme_fixtures.py");
        let o = std::process::Command::new(python)
            .arg(script)
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Some(dir)
    })
    .as_ref()
    .map(|d| d.path())
}

pub fn counter(metrics: &ExecutionPlanMetricsSet, name: &str) -> usize {
    metrics
        .clone_inner()
        .sum_by_name(name)
        .map_or(0, |v| v.as_usize())
}

#[tokio::test]
async fn pyarrow_files_read_like_their_plaintext_twins() {
    let Some((dir, keys)) = pme_fixtures() else {
        return;
    };
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dir.join("fixtures.json")).unwrap()).unwrap();
    assert!(list.len() >= 7);
    let mut page_ranges = 0;
    for f in &list {
        let (file, twin) = (
            dir.join(f["file"].as_str().unwrap()),
            dir.join(f["twin"].as_str().unwrap()),
        );
        let rows = read_native(&twin, &keys, &Read::default()).num_rows();
        let hows = [
            Read::default(),
            Read {
                page_index: true,
                ..Default::default()
            },
            // A few rows out of each row group: page-range reads.
            Read {
                page_index: true,
                selection: Some(
                    (0..rows / 5000)
                        .flat_map(|_| {
                            [
                                RowSelector::skip(2000),
                                RowSelector::select(300),
                                RowSelector::skip(2700),
                            ]
                        })
                        .collect(),
                ),
                ..Default::default()
            },
            Read {
                columns: Some(vec![0, 2]),
                page_index: true,
                ..Default::default()
            },
        ];
        for how in hows {
            let want = read_native(&twin, &keys, &how);
            let metrics = ExecutionPlanMetricsSet::new();
            let got = read_new_counted(&file, keys.scan(KeyScope::All), &how, &metrics)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(got, want, "{} ({})", file.display(), f["note"]);
            page_ranges += counter(&metrics, "crypto_page_ranges_decrypted");
            // Keys are asked for once per key per file, not per page.
            assert!(
                counter(&metrics, "crypto_provider_calls") <= 8,
                "{}",
                file.display()
            );
        }
        // parquet-rs reads neither CTR nor 192-bit keys (ring has no AES-192): those
        // are checked against their plaintext twin only.
        let name = f["file"].as_str().unwrap();
        if name.starts_with("gcm") && !name.contains("192") {
            assert_same(&file, &keys).await;
        }
    }
    assert!(page_ranges > 0, "no page-range read happened");
}

/// The Bloom filter of double_field in parquet-testing's Bloom filter file, read through
/// ClearIce's reader (as DataFusion reads it: offset and length from the metadata).
async fn bloom_of(
    path: &Path,
    keys: &Keys,
) -> parquet::errors::Result<parquet::bloom_filter::Sbbf> {
    let reader = open_reader(
        path,
        keys.scan(KeyScope::All),
        &ExecutionPlanMetricsSet::new(),
    );
    let mut b = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let col = b
        .metadata()
        .row_group(0)
        .columns()
        .iter()
        .position(|c| c.column_path().string() == "double_field")
        .unwrap();
    Ok(b.get_row_group_column_bloom_filter(0, col)
        .await?
        .expect("bloom filter"))
}

#[tokio::test]
async fn bloom_filters_of_encrypted_columns_hold_every_value_and_detect_tampering() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let f = testing(
        &dir,
        "encrypt_columns_and_footer_bloom_filter.parquet.encrypted",
    );
    let keys = Keys::explicit(KEYS_128);
    let sbbf = bloom_of(&f, &keys).await.unwrap();
    // double_field = i + 0.5 for i in 0..2000: every value is there, most others are not.
    assert!((0..2000).all(|i| sbbf.check(&(i as f64 + 0.5))));
    let false_positives = (0..2000)
        .filter(|i| sbbf.check(&(*i as f64 + 0.25)))
        .count();
    assert!(false_positives < 100, "{false_positives}");
    // A flipped bit in the header and in the bitset modules.
    let bytes = std::fs::read(&f).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let native = {
        let retriever = keys
            .resolver
            .retriever_for_file(f.display().to_string(), None);
        let props = FileDecryptionProperties::with_key_retriever(retriever)
            .build()
            .unwrap();
        parquet::file::metadata::ParquetMetaDataReader::new()
            .with_decryption_properties(Some(props))
            .parse_and_finish(&Bytes::from(bytes.clone()))
            .unwrap()
    };
    let c = native
        .row_group(0)
        .columns()
        .iter()
        .find(|c| c.column_path().string() == "double_field")
        .unwrap();
    let off = c.bloom_filter_offset().unwrap() as usize;
    let header_len = 4 + u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
    for (at, module) in [
        (off + 4 + 12, "bloom filter header"),
        (off + header_len + 4 + 12, "bloom filter bitset"),
    ] {
        let mut b = bytes.clone();
        b[at] ^= 1;
        let t = tmp.path().join("bloom.parquet");
        std::fs::write(&t, b).unwrap();
        let e = bloom_of(&t, &keys).await.unwrap_err().to_string();
        assert!(
            e.contains(module) && e.contains("double_field") && e.contains("authentication failed"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn a_provider_that_keeps_its_keys_gets_batches_and_reads_the_same() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let Some((pme, keyring)) = pme_fixtures() else {
        return;
    };
    let explicit = Keys::explicit(KEYS_128);
    let cases: Vec<(PathBuf, PathBuf, &Keys)> = vec![
        (
            testing(&dir, "encrypt_columns_plaintext_footer.parquet.encrypted"),
            testing(&dir, "encrypt_columns_plaintext_footer.parquet.encrypted"),
            &explicit,
        ),
        (
            testing(
                &dir,
                "encrypt_columns_and_footer_bloom_filter.parquet.encrypted",
            ),
            testing(
                &dir,
                "encrypt_columns_and_footer_bloom_filter.parquet.encrypted",
            ),
            &explicit,
        ),
        (
            pme.join("ctr_columns.parquet"),
            pme.join("flat_plain.parquet"),
            &keyring,
        ),
        (
            pme.join("gcm_256_v2.parquet"),
            pme.join("flat_plain_v2.parquet"),
            &keyring,
        ),
        (
            pme.join("ctr_plaintext_footer.parquet"),
            pme.join("flat_plain.parquet"),
            &keyring,
        ),
    ];
    for (file, twin, keys) in cases {
        for how in [
            Read::default(),
            Read {
                page_index: true,
                selection: Some(vec![
                    RowSelector::skip(20),
                    RowSelector::select(15),
                    RowSelector::skip(15),
                ]),
                ..Default::default()
            },
        ] {
            let want = read_native(&twin, keys, &how);
            let metrics = ExecutionPlanMetricsSet::new();
            let got =
                read_new_counted(&file, keys.scan_keeping_keys(KeyScope::All), &how, &metrics)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(got, want, "{}", file.display());
            // Batches: far fewer provider calls than modules.
            let (calls, modules) = (
                counter(&metrics, "crypto_provider_calls"),
                counter(&metrics, "crypto_modules_decrypted"),
            );
            // (files of many pages per chunk: parquet-testing's have one)
            assert!(calls > 0, "{}", file.display());
            if modules > 100 {
                assert!(
                    calls * 4 <= modules,
                    "{}: {calls} calls, {modules} modules",
                    file.display()
                );
            }
        }
    }
}

/// Through a provider that keeps its keys, the next row group's chunks of the columns read
/// are decrypted while the reader decodes the current ones: each chunk once when row
/// groups are read in order, none ahead when they are read backwards or with released
/// keys, and the rows are the same whichever row groups are read.
#[tokio::test]
async fn a_provider_that_keeps_its_keys_decrypts_the_next_row_group_ahead() {
    let Some((pme, keys)) = pme_fixtures() else {
        return;
    };
    let (file, twin) = (
        pme.join("ctr_columns.parquet"),
        pme.join("flat_plain.parquet"),
    );
    // 4 row groups; ssn, email and balance under column keys.
    let groups = |g: &[usize]| Read {
        row_groups: Some(g.to_vec()),
        ..Default::default()
    };
    // (Chunks decrypted ahead and not read may or may not finish before the read ends.)
    for (how, keeping, chunks, ahead) in [
        (Read::default(), true, Some(12), 9),
        (groups(&[3, 2, 1, 0]), true, Some(12), 0),
        (groups(&[0, 2]), true, None, 6),
        (groups(&[0]), true, None, 3),
        (Read::default(), false, Some(12), 0),
    ] {
        let scan = if keeping {
            keys.scan_keeping_keys(KeyScope::All)
        } else {
            keys.scan(KeyScope::All)
        };
        let metrics = ExecutionPlanMetricsSet::new();
        let got = read_new_counted(&file, scan, &how, &metrics).await.unwrap();
        let want = read_native(&twin, &keys, &how);
        let label = format!("{:?} keeping keys: {keeping}", how.row_groups);
        assert_eq!(got, want, "{label}");
        assert_eq!(
            counter(&metrics, "crypto_chunks_decrypted_ahead"),
            ahead,
            "{label}"
        );
        if let Some(chunks) = chunks {
            assert_eq!(
                counter(&metrics, "crypto_chunks_decrypted"),
                chunks,
                "{label}"
            );
        }
    }
}

/// Readers of one scan share a file's decrypted view (the second asks the provider
/// nothing); another scan does not get it: a scan without the keys still cannot read the
/// encrypted column another scan just decrypted.
#[tokio::test]
async fn a_scan_shares_views_between_its_readers_and_never_with_other_scans() {
    let Some(dir) = parquet_testing_dir() else {
        return;
    };
    let f = testing(&dir, "encrypt_columns_plaintext_footer.parquet.encrypted");
    let store = Arc::new(LocalFileSystem::new());
    let size = std::fs::metadata(&f).unwrap().len();
    let location = object_store::path::Path::from_filesystem_path(&f).unwrap();
    let file = PartitionedFile::new(location.to_string(), size);
    let factory = DecryptingReaderFactory::new(store, Keys::explicit(KEYS_128).scan(KeyScope::All));
    let how = Read {
        columns: Some(vec![5]),
        page_index: true,
        ..Default::default()
    };
    let mut batches = Vec::new();
    let mut calls = Vec::new();
    for partition in 0..2 {
        let metrics = ExecutionPlanMetricsSet::new();
        let reader = Boxed(
            factory
                .create_reader(partition, file.clone(), None, &metrics)
                .unwrap(),
        );
        let options = ArrowReaderOptions::new().with_page_index_policy(how.policy());
        let b = ParquetRecordBatchStreamBuilder::new_with_options(reader, options)
            .await
            .unwrap();
        let read: Vec<RecordBatch> = how.shape(b).build().unwrap().try_collect().await.unwrap();
        batches.push(concat(read));
        calls.push(counter(&metrics, "crypto_provider_calls"));
    }
    assert_eq!(batches[0], batches[1]);
    assert_eq!(batches[0], read_native(&f, &Keys::explicit(KEYS_128), &how));
    assert!(calls[0] > 0, "{calls:?}");
    assert_eq!(
        calls[1], 0,
        "the second reader built its own view: {calls:?}"
    );
    // A new scan without keys: refused, whatever the last scan decrypted.
    let e = read_new(&f, Keys::explicit(&[]).scan(KeyScope::All), &how)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("double_field") && e.contains("not decrypted"),
        "{e}"
    );
}
