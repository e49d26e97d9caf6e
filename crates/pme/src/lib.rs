//! ClearIce's decrypting Parquet reader: presents a PME file to DataFusion's Parquet scan
//! as a plaintext Parquet file, decrypting through a [`CryptoProvider`](clearice_crypto::CryptoProvider) only the modules
//! of the columns a query reads.
//!
//! # The plaintext view
//! Every byte range of the file stays where it is; each encrypted region is replaced by a
//! plaintext *of the same length*:
//! - the footer is decrypted (or its signature verified) and rewritten without crypto
//!   metadata: columns carry their decrypted `ColumnMetaData`, index lengths become
//!   plaintext lengths; it is handed to parquet-rs as [`ParquetMetaData`], never as bytes;
//! - a column chunk becomes its pages in plaintext, packed from the chunk's start (each
//!   page header keeps its length: its `compressed_page_size` is rewritten in place),
//!   followed by one `INDEX_PAGE` (which readers skip) filling the bytes the encryption
//!   added. Page sizes follow from module lengths, so the plaintext offset of every page
//!   is known from the encrypted offset index without decrypting any page;
//! - column and offset indexes become their plaintext (offset index locations rewritten
//!   in place to plaintext offsets), followed by zeros; Bloom filters likewise.
//!
//! So DataFusion's row group and page pruning, projection and late materialization work
//! unchanged, and only modules of read columns are ever decrypted: one provider call per
//! column chunk read (or per page range with the page index), never one per page.
//! Columns whose key this scan may not request keep a placeholder: reading their bytes
//! fails with [`DecryptError::Refused`]; their offset index is a one-page stand-in so the
//! page index of the other columns stays usable.
#![allow(
    deprecated,
    reason = "parquet::format holds parquet 58's only public Thrift types (removed in 59)"
)]

mod compact;
mod error;
mod format;
mod rekey;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use clearice_crypto::modules::{GCM_OVERHEAD, LENGTH_LEN, NONCE_LEN, TAG_LEN, split_module};
use clearice_crypto::{
    Algorithm, CallContext, KeyRef, KeyScope, Module, ModuleBatch, ModuleCipher, ModuleError,
    ModulePosition, ModuleType, ProviderError, ProviderRef, SecretKey,
};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::format::{
    ColumnChunk, ColumnCryptoMetaData, ColumnMetaData, CompressionCodec, EncryptionAlgorithm,
    FileCryptoMetaData, FileMetaData, SchemaElement,
};

pub use error::DecryptError;
pub use format::{DecryptingParquetFormat, DecryptingParquetFormatFactory};
pub use rekey::{ProviderColumnKey, rekey};

type Result<T, E = DecryptError> = std::result::Result<T, E>;

/// Bytes read from the end of a file at first (footer and, often, page indexes).
const TAIL_PREFETCH: u64 = 64 * 1024;

/// What a scan may decrypt, and as whom.
#[derive(Debug, Clone)]
pub struct ScanKeys {
    /// Does the cryptography.
    pub provider: ProviderRef,
    /// Which keys may be requested.
    pub scope: KeyScope,
    /// Principal and application context sent with every provider call.
    pub context: CallContext,
    /// AAD prefix to use for files that do not store theirs (or to check against).
    pub aad_prefix: Option<Vec<u8>>,
    /// Keys given with the table (DataFusion's `format.crypto.file_decryption.*`
    /// options): used as given, before the provider.
    pub given: Option<Arc<GivenKeys>>,
}

/// Keys a user gave for a table, as DataFusion's options name them: the footer key and
/// column keys by column path (the files' key metadata is not consulted).
#[derive(Debug, Default)]
pub struct GivenKeys {
    /// `footer_key_as_hex`.
    pub footer: Option<SecretKey>,
    /// `column_decryption_properties.COLUMN.column_key_as_hex`.
    pub columns: HashMap<String, SecretKey>,
    /// `footer_signature_verification`.
    pub verify_signature: bool,
}

impl GivenKeys {
    fn cipher(&self, key: &SecretKey, metadata: &[u8]) -> Result<Arc<ColumnKey>, ProviderError> {
        let cipher = ModuleCipher::new(key.expose()).map_err(|error| ProviderError::Invalid {
            index: 0,
            position: ModulePosition::footer(),
            error,
        })?;
        Ok(Arc::new(ColumnKey {
            key: KeyRef {
                key_metadata: Bytes::copy_from_slice(metadata),
                key_id: "<key given in the table options>".into(),
                is_footer_key: false,
                master_key: false,
            },
            cipher: Some(cipher),
        }))
    }
}

/// Creates [`DecryptingReader`]s for a scan.
#[derive(Debug)]
pub struct DecryptingReaderFactory {
    inner: DefaultParquetFileReaderFactory,
    keys: Arc<ScanKeys>,
    file_prefix: String,
}

impl DecryptingReaderFactory {
    /// Readers of files in `store`, decrypting with `keys`.
    pub fn new(store: Arc<dyn ObjectStore>, keys: ScanKeys) -> Self {
        Self {
            inner: DefaultParquetFileReaderFactory::new(store),
            keys: Arc::new(keys),
            file_prefix: "/".into(),
        }
    }

    /// Files are named `PREFIX + path in the store` in messages, provider calls and
    /// side file lookups (default `/`, local paths; `s3://BUCKET/` on S3).
    pub fn with_file_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.file_prefix = prefix.into();
        self
    }
}

impl DecryptingReaderFactory {
    /// Each column of `file` (its first row group) with the master key id of its column
    /// key ([`EXPLICIT_KEY`] for explicit keys), `None` for plaintext columns and columns
    /// under the footer key. Column keys are described, not requested, unless the scope
    /// allows them.
    pub async fn column_keys(
        &self,
        file: PartitionedFile,
    ) -> datafusion::error::Result<Vec<(String, Option<String>)>> {
        let mut reader = self.reader(0, file, None, &ExecutionPlanMetricsSet::new())?;
        Ok(reader.view().await?.column_keys.clone())
    }

    fn reader(
        &self,
        partition: usize,
        file: PartitionedFile,
        hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<DecryptingReader> {
        let path = format!("{}{}", self.file_prefix, file.object_meta.location);
        let size = file.object_meta.size;
        let inner = self.inner.create_reader(partition, file, hint, metrics)?;
        let counters = Counters::new(metrics, partition);
        Ok(DecryptingReader::new(
            inner,
            path,
            size,
            hint,
            Arc::clone(&self.keys),
            counters,
        ))
    }
}

impl ParquetFileReaderFactory for DecryptingReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<Box<dyn AsyncFileReader + Send>> {
        Ok(Box::new(self.reader(
            partition_index,
            file,
            metadata_size_hint,
            metrics,
        )?))
    }
}

/// An [`AsyncFileReader`] serving the plaintext view of one file.
pub struct DecryptingReader {
    /// In a mutex only to make the reader `Sync` (it is never locked: `get_mut`).
    inner: std::sync::Mutex<Box<dyn AsyncFileReader + Send>>,
    file: String,
    size: u64,
    hint: Option<usize>,
    keys: Arc<ScanKeys>,
    view: Option<Arc<View>>,
    /// Where the footer starts (known once read).
    footer_start: u64,
    /// Plaintext of small regions (indexes, Bloom filters) by region index.
    small: HashMap<usize, Bytes>,
    /// Encrypted ranges fetched together for one `get_byte_ranges` call.
    prefetched: HashMap<Range<u64>, Bytes>,
    counters: Counters,
}

/// What the reader did, in the scan's metrics (`EXPLAIN ANALYZE`).
#[derive(Clone)]
struct Counters {
    /// Calls to the crypto provider (describe, release, decrypt, encrypt).
    provider_calls: Count,
    /// Modules decrypted (in process with a released key, or by the provider).
    modules: Count,
    /// Column chunks decrypted whole.
    chunks: Count,
    /// Page ranges decrypted alone (page index reads).
    page_ranges: Count,
}

impl Counters {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let c = |name: &'static str| MetricBuilder::new(metrics).counter(name, partition);
        Self {
            provider_calls: c("crypto_provider_calls"),
            modules: c("crypto_modules_decrypted"),
            chunks: c("crypto_chunks_decrypted"),
            page_ranges: c("crypto_page_ranges_decrypted"),
        }
    }
}

impl std::fmt::Debug for DecryptingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecryptingReader")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

struct View {
    metadata: Arc<ParquetMetaData>,
    /// Each column (of the first row group) and the master key id of its column key.
    column_keys: Vec<(String, Option<String>)>,
    crypto: Option<FileCrypto>,
}

/// Reported instead of a master key id for columns under explicit keys.
pub const EXPLICIT_KEY: &str = "<explicit key>";

struct FileCrypto {
    algorithm: Algorithm,
    file_aad: Vec<u8>,
    /// Sorted by start, not overlapping.
    regions: Vec<Region>,
}

struct Region {
    range: Range<u64>,
    column: String,
    row_group: usize,
    ordinal: usize,
    kind: RegionKind,
}

enum RegionKind {
    Chunk {
        key: Arc<ColumnKey>,
        has_dict: bool,
        /// Pages with plaintext offsets, from the offset index once decrypted.
        units: OnceLock<Arc<Vec<Unit>>>,
        offset_index: Option<usize>,
    },
    ColumnIndex {
        key: Arc<ColumnKey>,
    },
    OffsetIndex {
        key: Arc<ColumnKey>,
        chunk: usize,
    },
    Bloom {
        key: Arc<ColumnKey>,
    },
    /// A stand-in offset index of a refused column.
    Synthetic(Bytes),
    Refused(String),
}

/// One page (header and body modules) of a column chunk.
#[derive(Debug, Clone)]
struct Unit {
    enc: Range<u64>,
    plain: Range<u64>,
    dict: bool,
    ordinal: usize,
}

/// A key of the file, resolved for this scan.
struct ColumnKey {
    key: KeyRef,
    /// The data key, when the provider releases it.
    cipher: Option<ModuleCipher>,
}

impl DecryptingReader {
    fn new(
        inner: Box<dyn AsyncFileReader + Send>,
        file: String,
        size: u64,
        hint: Option<usize>,
        keys: Arc<ScanKeys>,
        counters: Counters,
    ) -> Self {
        Self {
            inner: std::sync::Mutex::new(inner),
            file,
            size,
            hint,
            keys,
            view: None,
            footer_start: 0,
            small: HashMap::new(),
            prefetched: HashMap::new(),
            counters,
        }
    }

    fn malformed(&self, reason: impl Into<String>) -> DecryptError {
        DecryptError::Malformed {
            file: self.file.clone(),
            reason: reason.into(),
        }
    }

    fn ctx(&self) -> CallContext {
        let mut c = self.keys.context.clone();
        c.file = self.file.clone();
        c
    }

    /// [`Self::fetch`], taking a prefetched buffer of exactly this range (so that it can be
    /// decrypted in place).
    async fn fetch_owned(&mut self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        if let Some(b) = self.prefetched.remove(&range) {
            return Ok(b);
        }
        self.fetch(range).await
    }

    fn inner(&mut self) -> &mut Box<dyn AsyncFileReader + Send> {
        self.inner
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn fetch(&mut self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        // Fetched for the current request (kept until it is served).
        if let Some((r, b)) = self
            .prefetched
            .iter()
            .find(|(r, _)| r.start <= range.start && range.end <= r.end)
        {
            let at = (range.start - r.start) as usize;
            return Ok(b.slice(at..at + (range.end - range.start) as usize));
        }
        self.inner().get_bytes(range).await
    }

    async fn view(&mut self) -> parquet::errors::Result<Arc<View>> {
        if let Some(v) = &self.view {
            return Ok(Arc::clone(v));
        }
        let v = Arc::new(self.build_view().await?);
        self.view = Some(Arc::clone(&v));
        Ok(v)
    }

    /// Resolves a key named by the file for this scan: scope check, then the provider.
    async fn key(
        &self,
        metadata: &[u8],
        footer: bool,
    ) -> std::result::Result<Arc<ColumnKey>, ProviderError> {
        let key = self.describe(metadata).await?;
        self.grant(key, footer).await
    }

    async fn describe(&self, metadata: &[u8]) -> std::result::Result<KeyRef, ProviderError> {
        self.counters.provider_calls.add(1);
        self.keys
            .provider
            .describe_key(&self.ctx(), Bytes::copy_from_slice(metadata))
            .await
    }

    async fn grant(
        &self,
        key: KeyRef,
        footer: bool,
    ) -> std::result::Result<Arc<ColumnKey>, ProviderError> {
        self.keys
            .scope
            .check_key(&key.key_id, footer, key.master_key)?;
        self.counters.provider_calls.add(1);
        let cipher = match self.keys.provider.release_key(&self.ctx(), &key).await? {
            Some(k) => {
                Some(
                    ModuleCipher::new(k.expose()).map_err(|error| ProviderError::Invalid {
                        index: 0,
                        position: ModulePosition::footer(),
                        error,
                    })?,
                )
            }
            None => None,
        };
        Ok(Arc::new(ColumnKey { key, cipher }))
    }

    /// Decrypts modules under one key: in process with a released key, else in one
    /// provider call.
    async fn decrypt(
        &self,
        key: &ColumnKey,
        algorithm: Algorithm,
        column: Option<&str>,
        modules: Vec<Module>,
    ) -> Result<Vec<Vec<u8>>> {
        self.counters.modules.add(modules.len());
        if let Some(cipher) = &key.cipher {
            return modules
                .iter()
                .map(|m| {
                    cipher
                        .decrypt(algorithm, m.position.kind, &m.aad, &m.data)
                        .map_err(|error| DecryptError::Tampered {
                            file: self.file.clone(),
                            column: column.map(Into::into),
                            position: m.position,
                            error,
                        })
                })
                .collect();
        }
        let batch = ModuleBatch {
            key: key.key.clone(),
            algorithm,
            column: column.map(Into::into),
            modules,
        };
        let expected = batch.modules.len();
        self.counters.provider_calls.add(1);
        let plains = self
            .keys
            .provider
            .decrypt(&self.ctx(), batch)
            .await
            .map_err(|e| DecryptError::from_provider(&self.file, column, e))?;
        if plains.len() != expected {
            return Err(self.malformed(format!(
                "crypto provider '{}' returned {} plaintexts for {expected} modules",
                self.keys.provider.name(),
                plains.len()
            )));
        }
        Ok(plains)
    }

    fn module(&self, file_aad: &[u8], position: ModulePosition, data: Bytes) -> Result<Module> {
        let aad = position
            .aad(file_aad)
            .ok_or_else(|| self.malformed("more than 32767 row groups, columns or pages"))?;
        Ok(Module {
            position,
            aad,
            data,
            nonce: None,
        })
    }

    async fn build_view(&mut self) -> Result<View, parquet::errors::ParquetError> {
        let size = self.size;
        if size < 12 {
            return Err(self.malformed("file is too short to be Parquet").into());
        }
        let prefetch = TAIL_PREFETCH.max(self.hint.unwrap_or(0) as u64).min(size);
        let tail = self.fetch(size - prefetch..size).await?;
        let n = tail.len();
        if n < 12 {
            return Err(self
                .malformed("file is shorter than its listed size")
                .into());
        }
        let footer_len = u64::from(u32::from_le_bytes(
            tail[n - 8..n - 4].try_into().expect("4 bytes"),
        ));
        let magic: [u8; 4] = tail[n - 4..].try_into().expect("4 bytes");
        if footer_len + 8 > size {
            return Err(self
                .malformed(format!(
                    "footer length {footer_len} exceeds the file size {size} (truncated file?)"
                ))
                .into());
        }
        self.footer_start = size - 8 - footer_len;
        let footer = if footer_len + 8 <= prefetch {
            tail.slice(n - 8 - footer_len as usize..n - 8)
        } else {
            self.fetch(size - 8 - footer_len..size - 8).await?
        };
        match &magic {
            b"PAR1" => self.plaintext_footer(footer).await,
            b"PARE" => self.encrypted_footer(footer).await.map_err(Into::into),
            _ => Err(self
                .malformed("not a Parquet file (no PAR1/PARE magic at the end)")
                .into()),
        }
    }

    async fn plaintext_footer(&mut self, footer: Bytes) -> parquet::errors::Result<View> {
        let mut rest = &footer[..];
        let meta: FileMetaData = compact::read(&mut rest)
            .map_err(|e| self.malformed(format!("footer does not parse: {e}")))?;
        let Some(algorithm) = meta.encryption_algorithm.clone() else {
            return Ok(View {
                metadata: Arc::new(ParquetMetaDataReader::decode_metadata(&footer)?),
                column_keys: Vec::new(),
                crypto: None,
            });
        };
        if rest.len() != NONCE_LEN + TAG_LEN {
            return Err(self
                .malformed("plaintext footer is not followed by a 28-byte signature")
                .into());
        }
        let (algorithm, file_aad) = self.algorithm(&algorithm)?;
        let signed = footer.slice(..footer.len() - NONCE_LEN - TAG_LEN);
        let signature = &footer[signed.len()..];
        // The footer key signs the footer; without it (not granted to this scan) the
        // plaintext columns stay readable, unverified, as in every PME reader.
        let given = self
            .keys
            .given
            .as_ref()
            .and_then(|g| g.footer.as_ref().map(|k| (g, k)));
        let footer_key = match (given, &meta.footer_signing_key_metadata) {
            (Some((g, k)), m) => g.cipher(k, m.as_deref().unwrap_or_default()).ok(),
            (None, Some(m)) => self.key(m, true).await.ok(),
            (None, None) => None,
        };
        let verify = self.keys.given.as_ref().is_none_or(|g| g.verify_signature);
        if let Some(key) = footer_key.as_ref().filter(|_| verify) {
            self.verify_signature(key, algorithm, &file_aad, signed, signature)
                .await?;
        }
        self.rewrite(meta, algorithm, file_aad, footer_key)
            .await
            .map_err(Into::into)
    }

    async fn verify_signature(
        &self,
        key: &ColumnKey,
        algorithm: Algorithm,
        file_aad: &[u8],
        signed: Bytes,
        signature: &[u8],
    ) -> Result<()> {
        let position = ModulePosition::footer();
        let aad = position.aad(file_aad).expect("footer AAD");
        let nonce: [u8; NONCE_LEN] = signature[..NONCE_LEN].try_into().expect("12 bytes");
        let body = match &key.cipher {
            Some(c) => c
                .encrypt(
                    Algorithm::AesGcmV1,
                    ModuleType::Footer,
                    &aad,
                    &nonce,
                    &signed,
                )
                .map_err(|error| DecryptError::Tampered {
                    file: self.file.clone(),
                    column: None,
                    position,
                    error,
                })?,
            None => {
                let batch = ModuleBatch {
                    key: key.key.clone(),
                    algorithm,
                    column: None,
                    modules: vec![Module {
                        position,
                        aad,
                        data: signed,
                        nonce: Some(nonce),
                    }],
                };
                self.counters.provider_calls.add(1);
                let mut out = self
                    .keys
                    .provider
                    .encrypt(&self.ctx(), batch)
                    .await
                    .map_err(|e| DecryptError::from_provider(&self.file, None, e))?;
                out.pop().unwrap_or_default()
            }
        };
        let tag = body
            .get(body.len().saturating_sub(TAG_LEN)..)
            .unwrap_or(&[]);
        let expected = &signature[NONCE_LEN..];
        let same = tag.len() == TAG_LEN
            && tag
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(DecryptError::Signature {
                file: self.file.clone(),
            });
        }
        Ok(())
    }

    async fn encrypted_footer(&mut self, footer: Bytes) -> Result<View> {
        let mut rest = &footer[..];
        let crypto: FileCryptoMetaData = compact::read(&mut rest)
            .map_err(|e| self.malformed(format!("FileCryptoMetaData does not parse: {e}")))?;
        let consumed = footer.len() - rest.len();
        let (algorithm, file_aad) = self.algorithm(&crypto.encryption_algorithm)?;
        let given = self
            .keys
            .given
            .as_ref()
            .and_then(|g| g.footer.as_ref().map(|k| (g, k)));
        let key = match given {
            Some((g, k)) => g.cipher(k, crypto.key_metadata.as_deref().unwrap_or_default()),
            None => {
                let metadata = crypto.key_metadata.as_deref().ok_or_else(|| {
                    self.malformed("encrypted footer without footer key metadata (no key given)")
                })?;
                self.key(metadata, true).await
            }
        }
        .map_err(|e| DecryptError::from_provider(&self.file, None, e))?;
        let (body, _) = split_module(&footer[consumed..]).ok_or(DecryptError::Tampered {
            file: self.file.clone(),
            column: None,
            position: ModulePosition::footer(),
            error: ModuleError::Truncated,
        })?;
        let body = footer.slice_ref(body);
        let module = self.module(&file_aad, ModulePosition::footer(), body)?;
        let plain = self
            .decrypt(&key, algorithm, None, vec![module])
            .await?
            .pop()
            .unwrap_or_default();
        let meta: FileMetaData = compact::read(&mut &plain[..])
            .map_err(|e| self.malformed(format!("decrypted footer does not parse: {e}")))?;
        self.rewrite(meta, algorithm, file_aad, Some(key)).await
    }

    /// The algorithm and the file AAD (`prefix || unique`).
    fn algorithm(&self, a: &EncryptionAlgorithm) -> Result<(Algorithm, Vec<u8>)> {
        let (algorithm, prefix, unique, supply) = match a {
            EncryptionAlgorithm::AESGCMV1(v) => (
                Algorithm::AesGcmV1,
                &v.aad_prefix,
                &v.aad_file_unique,
                v.supply_aad_prefix,
            ),
            EncryptionAlgorithm::AESGCMCTRV1(v) => (
                Algorithm::AesGcmCtrV1,
                &v.aad_prefix,
                &v.aad_file_unique,
                v.supply_aad_prefix,
            ),
        };
        let prefix = match (&self.keys.aad_prefix, prefix) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) if supply == Some(true) => {
                return Err(DecryptError::AadPrefixRequired {
                    file: self.file.clone(),
                });
            }
            (None, None) => Vec::new(),
        };
        let mut file_aad = prefix;
        file_aad.extend_from_slice(unique.as_deref().unwrap_or_default());
        Ok((algorithm, file_aad))
    }

    /// Turns decrypted file metadata into the plaintext view.
    async fn rewrite(
        &mut self,
        mut meta: FileMetaData,
        algorithm: Algorithm,
        file_aad: Vec<u8>,
        footer_key: Option<Arc<ColumnKey>>,
    ) -> Result<View> {
        let leaves = leaf_types(&meta.schema);
        // Which column each leaf belongs to: a key is bound to the column the policy
        // declares it for (`KeyScope::Columns`), not to any column that names it.
        let tops = top_level_fields(&meta.schema);
        // Keys by key metadata, each described and granted (or refused) once.
        let mut keys: HashMap<Vec<u8>, std::result::Result<Arc<ColumnKey>, String>> =
            HashMap::new();
        let mut key_ids: HashMap<Vec<u8>, String> = HashMap::new();
        // Column metadata modules to decrypt, per key.
        // (one call per key: grouped by the granted key's identity)
        let mut pending: BTreeMap<usize, Vec<(usize, usize, Bytes)>> = BTreeMap::new();
        let mut refused: HashMap<(usize, usize), String> = HashMap::new();
        let mut key_of: HashMap<(usize, usize), Arc<ColumnKey>> = HashMap::new();
        for (rg, group) in meta.row_groups.iter().enumerate() {
            for (col, chunk) in group.columns.iter().enumerate() {
                let metadata = match &chunk.crypto_metadata {
                    None => continue,
                    Some(ColumnCryptoMetaData::ENCRYPTIONWITHFOOTERKEY(_)) => None,
                    Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(k)) => {
                        Some(k.key_metadata.clone().unwrap_or_default())
                    }
                };
                let given = self.keys.given.as_ref().and_then(|g| {
                    let path = column_path(chunk);
                    let top = path.split('.').next().unwrap_or_default().to_owned();
                    g.columns
                        .get(&path)
                        .or_else(|| g.columns.get(&top))
                        .map(|k| (g, k))
                });
                // Keys from the file's own key metadata are bound to their column below.
                let bound = if given.is_none() {
                    metadata.clone()
                } else {
                    None
                };
                let key = match (given, metadata) {
                    (Some((g, k)), m) => g
                        .cipher(k, m.as_deref().unwrap_or_default())
                        .map_err(|e| e.to_string()),
                    (None, None) => footer_key
                        .clone()
                        .ok_or_else(|| "the footer key was not granted to this scan".to_owned()),
                    (None, Some(m)) => match keys.get(&m) {
                        Some(k) => k.clone(),
                        None => {
                            let k = match self.describe(&m).await {
                                Ok(described) => {
                                    let id = described.master_key.then(|| described.key_id.clone());
                                    key_ids.insert(
                                        m.clone(),
                                        id.unwrap_or_else(|| EXPLICIT_KEY.into()),
                                    );
                                    self.grant(described, false)
                                        .await
                                        .map_err(|e| e.to_string())
                                }
                                Err(e) => Err(e.to_string()),
                            };
                            keys.insert(m.clone(), k.clone());
                            k
                        }
                    },
                };
                let key = match (key, bound) {
                    (Ok(k), Some(m)) => match key_ids.get(&m).filter(|id| *id != EXPLICIT_KEY) {
                        Some(id) => {
                            let (field_id, name) =
                                tops.get(col).map_or((None, "?"), |(f, n)| (*f, n.as_str()));
                            self.keys
                                .scope
                                .check_column(field_id, name, id)
                                .map(|()| k)
                                .map_err(|e| e.to_string())
                        }
                        None => Ok(k),
                    },
                    (key, _) => key,
                };
                match key {
                    Ok(k) => {
                        if let Some(enc) = &chunk.encrypted_column_metadata {
                            pending.entry(Arc::as_ptr(&k) as usize).or_default().push((
                                rg,
                                col,
                                Bytes::copy_from_slice(enc),
                            ));
                        }
                        key_of.insert((rg, col), k);
                    }
                    Err(reason) => {
                        refused.insert((rg, col), reason);
                    }
                }
            }
        }
        // Decrypt column metadata: one call per key.
        let mut decrypted: HashMap<(usize, usize), ColumnMetaData> = HashMap::new();
        for (_, items) in pending {
            let key = Arc::clone(&key_of[&(items[0].0, items[0].1)]);
            let column = column_path(&meta.row_groups[items[0].0].columns[items[0].1]);
            let modules = items
                .iter()
                .map(|(rg, col, enc)| {
                    let body = split_module(enc).map(|(b, _)| enc.slice_ref(b)).ok_or(
                        DecryptError::Tampered {
                            file: self.file.clone(),
                            column: Some(column.clone()),
                            position: ModulePosition::new(ModuleType::ColumnMetaData, *rg, *col, 0),
                            error: ModuleError::Truncated,
                        },
                    )?;
                    self.module(
                        &file_aad,
                        ModulePosition::new(ModuleType::ColumnMetaData, *rg, *col, 0),
                        body,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let plains = self
                .decrypt(&key, algorithm, Some(&column), modules)
                .await?;
            for ((rg, col, _), plain) in items.iter().zip(plains) {
                let cmd: ColumnMetaData = compact::read(&mut &plain[..]).map_err(|e| {
                    self.malformed(format!(
                        "column '{column}': decrypted column metadata does not parse: {e}"
                    ))
                })?;
                decrypted.insert((*rg, *col), cmd);
            }
        }

        let column_keys = meta
            .row_groups
            .first()
            .map(|g| {
                g.columns
                    .iter()
                    .map(|c| {
                        let id = match &c.crypto_metadata {
                            Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(k)) => key_ids
                                .get(k.key_metadata.as_deref().unwrap_or_default())
                                .cloned(),
                            _ => None,
                        };
                        (column_path(c), id)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let gaps = refused_extents(&meta, &decrypted, self.footer_start);
        let mut regions = Vec::new();
        for (rg, group) in meta.row_groups.iter_mut().enumerate() {
            for (col, chunk) in group.columns.iter_mut().enumerate() {
                if chunk.crypto_metadata.is_none() {
                    continue;
                }
                let path = column_path(chunk);
                if let Some(cmd) = decrypted.remove(&(rg, col)) {
                    chunk.meta_data = Some(cmd);
                }
                chunk.crypto_metadata = None;
                chunk.encrypted_column_metadata = None;
                match (key_of.get(&(rg, col)), refused.remove(&(rg, col))) {
                    (Some(key), _) => {
                        let Some(cmd) = chunk.meta_data.as_mut() else {
                            return Err(self.malformed(format!(
                                "column '{path}' (row group {rg}) has no column metadata"
                            )));
                        };
                        let start = cmd
                            .dictionary_page_offset
                            .unwrap_or(cmd.data_page_offset)
                            .max(0) as u64;
                        let chunk_region = regions.len();
                        let mut offset_index = None;
                        regions.push(Region {
                            range: start..start + cmd.total_compressed_size.max(0) as u64,
                            column: path.clone(),
                            row_group: rg,
                            ordinal: col,
                            kind: RegionKind::Chunk {
                                key: Arc::clone(key),
                                has_dict: cmd.dictionary_page_offset.is_some(),
                                units: OnceLock::new(),
                                offset_index: None,
                            },
                        });
                        if let (Some(off), Some(len)) =
                            (chunk.offset_index_offset, chunk.offset_index_length)
                        {
                            offset_index = Some(regions.len());
                            regions.push(Region {
                                range: off as u64..(off + i64::from(len)) as u64,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::OffsetIndex {
                                    key: Arc::clone(key),
                                    chunk: chunk_region,
                                },
                            });
                            chunk.offset_index_length = Some(len - GCM_OVERHEAD as i32);
                        }
                        if let RegionKind::Chunk {
                            offset_index: o, ..
                        } = &mut regions[chunk_region].kind
                        {
                            *o = offset_index;
                        }
                        if let (Some(off), Some(len)) =
                            (chunk.column_index_offset, chunk.column_index_length)
                        {
                            regions.push(Region {
                                range: off as u64..(off + i64::from(len)) as u64,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::ColumnIndex {
                                    key: Arc::clone(key),
                                },
                            });
                            chunk.column_index_length = Some(len - GCM_OVERHEAD as i32);
                        }
                        if let Some(off) = cmd.bloom_filter_offset {
                            match cmd.bloom_filter_length {
                                Some(len) if len > 2 * GCM_OVERHEAD as i32 => {
                                    regions.push(Region {
                                        range: off as u64..(off + i64::from(len)) as u64,
                                        column: path.clone(),
                                        row_group: rg,
                                        ordinal: col,
                                        kind: RegionKind::Bloom {
                                            key: Arc::clone(key),
                                        },
                                    });
                                    cmd.bloom_filter_length = Some(len - 2 * GCM_OVERHEAD as i32);
                                }
                                // Without its length the filter's extent is unknown: not used.
                                _ => {
                                    cmd.bloom_filter_offset = None;
                                    cmd.bloom_filter_length = None;
                                }
                            }
                        }
                    }
                    (None, reason) => {
                        let reason =
                            reason.unwrap_or_else(|| "its key was not resolved".to_owned());
                        let cmd = chunk.meta_data.get_or_insert_with(|| {
                            let (start, len) = gaps.get(&(rg, col)).copied().unwrap_or((4, 0));
                            placeholder(&leaves, col, &path, group.num_rows, start, len)
                        });
                        cmd.statistics = None;
                        cmd.bloom_filter_offset = None;
                        cmd.bloom_filter_length = None;
                        cmd.size_statistics = None;
                        let start = cmd
                            .dictionary_page_offset
                            .unwrap_or(cmd.data_page_offset)
                            .max(0) as u64;
                        let len = cmd.total_compressed_size.max(0) as u64;
                        if len > 0 {
                            regions.push(Region {
                                range: start..start + len,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::Refused(reason.clone()),
                            });
                        }
                        chunk.column_index_offset = None;
                        chunk.column_index_length = None;
                        match (chunk.offset_index_offset, chunk.offset_index_length) {
                            (Some(off), Some(enc_len)) => {
                                let stand_in =
                                    compact::single_page_offset_index(start as i64, len as i64);
                                if stand_in.len() <= enc_len.max(0) as usize {
                                    chunk.offset_index_length = Some(stand_in.len() as i32);
                                    regions.push(Region {
                                        range: off as u64..(off + i64::from(enc_len)) as u64,
                                        column: path.clone(),
                                        row_group: rg,
                                        ordinal: col,
                                        kind: RegionKind::Synthetic(stand_in.into()),
                                    });
                                } else {
                                    chunk.offset_index_offset = None;
                                    chunk.offset_index_length = None;
                                }
                            }
                            _ => {
                                chunk.offset_index_offset = None;
                                chunk.offset_index_length = None;
                            }
                        }
                    }
                }
            }
        }
        meta.encryption_algorithm = None;
        meta.footer_signing_key_metadata = None;
        regions.sort_by_key(|r| r.range.start);
        // Re-point chunk -> offset index links after sorting.
        relink(&mut regions);
        for w in regions.windows(2) {
            if w[0].range.end > w[1].range.start {
                return Err(self.malformed(format!(
                    "column '{}' (row group {}) overlaps column '{}' (row group {})",
                    w[0].column, w[0].row_group, w[1].column, w[1].row_group
                )));
            }
        }
        let bytes = compact::write(&meta);
        let metadata = ParquetMetaDataReader::decode_metadata(&bytes)
            .map_err(|e| self.malformed(format!("decrypted metadata is not valid Parquet: {e}")))?;
        Ok(View {
            metadata: Arc::new(metadata),
            column_keys,
            crypto: Some(FileCrypto {
                algorithm,
                file_aad,
                regions,
            }),
        })
    }

    async fn get_ranges(&mut self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        let view = self.view().await?;
        let Some(crypto) = &view.crypto else {
            return self.inner().get_byte_ranges(ranges).await;
        };
        self.prefetched.clear();
        let mut out: Vec<Option<Bytes>> = vec![None; ranges.len()];
        let mut plain_idx = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if overlapping(&crypto.regions, r).is_empty() {
                plain_idx.push(i);
            }
        }
        // Whole regions the requests need, fetched with the plaintext ranges in one call
        // (one coalesced GET per row group on object stores) before decrypting.
        let mut wanted: Vec<Range<u64>> = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if plain_idx.contains(&i) {
                continue;
            }
            let hits = overlapping(&crypto.regions, r);
            let covered = covered(&crypto.regions, &hits, r);
            if covered < r.end - r.start {
                // Plaintext bytes around encrypted regions (page indexes of several columns):
                // one read of the request serves them all.
                wanted.push(r.clone());
            }
            for j in hits {
                let region = &crypto.regions[j];
                if covered < r.end - r.start
                    && region.range.start >= r.start
                    && region.range.end <= r.end
                {
                    continue;
                }
                let fetch = match &region.kind {
                    RegionKind::Chunk { units, .. } => {
                        let sub = region.range.start.max(r.start)..region.range.end.min(r.end);
                        if sub == region.range {
                            Some(region.range.clone())
                        } else {
                            // A page range: the encrypted pages behind it.
                            units
                                .get()
                                .and_then(|u| page_span(u, &sub).map(|(a, b)| u_enc(u, a, b)))
                        }
                    }
                    RegionKind::Synthetic(_) | RegionKind::Refused(_) => None,
                    _ => (!self.small.contains_key(&j)).then(|| region.range.clone()),
                };
                if let Some(f) = fetch
                    && !wanted.contains(&f)
                {
                    wanted.push(f);
                }
            }
        }
        if !plain_idx.is_empty() || !wanted.is_empty() {
            let mut all: Vec<Range<u64>> = plain_idx.iter().map(|i| ranges[*i].clone()).collect();
            all.extend(wanted.iter().cloned());
            let mut fetched = self.inner().get_byte_ranges(all).await?;
            let encrypted = fetched.split_off(plain_idx.len());
            for (i, b) in plain_idx.into_iter().zip(fetched) {
                out[i] = Some(b);
            }
            self.prefetched.extend(wanted.into_iter().zip(encrypted));
        }
        // Whole column chunks of this request (a row group's projected columns) are
        // decrypted concurrently: a remote provider answers them in parallel.
        let chunks: Vec<(usize, usize)> = ranges
            .iter()
            .enumerate()
            .filter(|(idx, _)| out[*idx].is_none())
            .filter_map(|(idx, r)| {
                let at = crypto.regions.partition_point(|g| g.range.start < r.start);
                let region = crypto.regions.get(at)?;
                (region.range == *r && matches!(region.kind, RegionKind::Chunk { .. }))
                    .then_some((idx, at))
            })
            .collect();
        if chunks.len() > 1 {
            let mut whole = Vec::with_capacity(chunks.len());
            for (idx, at) in chunks {
                // Owned (not shared), so a released key decrypts it in place.
                let enc = self.fetch_owned(ranges[idx].clone()).await?;
                whole.push((idx, at, enc));
            }
            let places: Vec<(usize, usize, usize)> = whole
                .iter()
                .map(|(idx, at, enc)| (*idx, *at, enc.len()))
                .collect();
            let decrypting = whole.into_iter().map(|(_, at, enc)| {
                let region = &crypto.regions[at];
                let RegionKind::Chunk { key, has_dict, .. } = &region.kind else {
                    unreachable!("chunk region")
                };
                self.decrypt_pages(crypto, region, key, enc, *has_dict, 0)
            });
            let plains = futures::future::try_join_all(decrypting).await?;
            for ((idx, at, enc_len), plain) in places.into_iter().zip(plains) {
                self.counters.chunks.add(1);
                out[idx] = Some(self.pad_chunk(&crypto.regions[at], enc_len, plain)?);
            }
        }
        for (i, r) in ranges.iter().enumerate() {
            if out[i].is_none() {
                out[i] = Some(self.serve(&view, r.clone()).await?);
            }
        }
        self.prefetched.clear();
        Ok(out.into_iter().map(|b| b.expect("filled")).collect())
    }

    /// The plaintext view of `range`, which overlaps encrypted regions.
    async fn serve(&mut self, view: &View, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        let crypto = view.crypto.as_ref().expect("encrypted file");
        let hits = overlapping(&crypto.regions, &range);
        // Inside one region: its plaintext is the answer (no copy).
        if let [i] = hits[..]
            && crypto.regions[i].range.start <= range.start
            && range.end <= crypto.regions[i].range.end
        {
            return self.image(crypto, i, range).await;
        }
        let covered = covered(&crypto.regions, &hits, &range);
        let mut out = if covered < range.end - range.start {
            BytesMut::from(&self.fetch(range.clone()).await?[..])
        } else {
            BytesMut::zeroed((range.end - range.start) as usize)
        };
        for i in hits {
            let region = &crypto.regions[i];
            let sub = region.range.start.max(range.start)..region.range.end.min(range.end);
            let image = self.image(crypto, i, sub.clone()).await?;
            let at = (sub.start - range.start) as usize;
            out[at..at + image.len()].copy_from_slice(&image);
        }
        Ok(out.freeze())
    }

    /// The plaintext of `sub` (inside region `i`).
    async fn image(
        &mut self,
        crypto: &FileCrypto,
        i: usize,
        sub: Range<u64>,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[i];
        let rel =
            (sub.start - region.range.start) as usize..(sub.end - region.range.start) as usize;
        let whole = match &region.kind {
            RegionKind::Refused(reason) => {
                return Err(DecryptError::Refused {
                    file: self.file.clone(),
                    column: region.column.clone(),
                    reason: reason.clone(),
                }
                .into());
            }
            RegionKind::Chunk { .. } => return self.chunk_image(crypto, i, sub).await,
            _ => self.small_region(crypto, i).await?,
        };
        let mut b = BytesMut::zeroed(rel.len());
        let have = whole.len().min(rel.end).saturating_sub(rel.start);
        if have > 0 {
            b[..have].copy_from_slice(&whole[rel.start..rel.start + have]);
        }
        Ok(b.freeze())
    }

    /// Plaintext of an index, Bloom filter or stand-in region (without trailing zeros).
    async fn small_region(&mut self, crypto: &FileCrypto, i: usize) -> Result<Bytes> {
        if let Some(b) = self.small.get(&i) {
            return Ok(b.clone());
        }
        let region = &crypto.regions[i];
        let (rg, col, column) = (region.row_group, region.ordinal, region.column.as_str());
        let plain = match &region.kind {
            RegionKind::Synthetic(b) => b.clone(),
            RegionKind::ColumnIndex { key } => {
                let enc = self.fetch_region(region.range.clone()).await?;
                let m = self.one_module(crypto, &enc, ModuleType::ColumnIndex, rg, col, column)?;
                Bytes::from(
                    self.decrypt(key, crypto.algorithm, Some(column), vec![m])
                        .await?
                        .remove(0),
                )
            }
            RegionKind::OffsetIndex { key, chunk } => {
                let enc = self.fetch_region(region.range.clone()).await?;
                let m = self.one_module(crypto, &enc, ModuleType::OffsetIndex, rg, col, column)?;
                let mut plain = self
                    .decrypt(key, crypto.algorithm, Some(column), vec![m])
                    .await?
                    .remove(0);
                self.plaintext_offsets(crypto, *chunk, &mut plain)?;
                Bytes::from(plain)
            }
            RegionKind::Bloom { key } => {
                let enc = self.fetch_region(region.range.clone()).await?;
                let bad = |error| DecryptError::Tampered {
                    file: self.file.clone(),
                    column: Some(column.into()),
                    position: ModulePosition::new(ModuleType::BloomFilterHeader, rg, col, 0),
                    error,
                };
                let (header, rest) =
                    split_module(&enc).ok_or_else(|| bad(ModuleError::Truncated))?;
                let (bitset, _) = split_module(rest).ok_or_else(|| bad(ModuleError::Truncated))?;
                let modules = vec![
                    self.module(
                        &crypto.file_aad,
                        ModulePosition::new(ModuleType::BloomFilterHeader, rg, col, 0),
                        enc.slice_ref(header),
                    )?,
                    self.module(
                        &crypto.file_aad,
                        ModulePosition::new(ModuleType::BloomFilterBitset, rg, col, 0),
                        enc.slice_ref(bitset),
                    )?,
                ];
                let mut parts = self
                    .decrypt(key, crypto.algorithm, Some(column), modules)
                    .await?;
                // Readers take the bitset to follow the header struct and to run to the
                // end of `bloom_filter_length`: the header keeps its module's length.
                compact::rewrite_bloom_header(&mut parts[0]).ok_or_else(|| {
                    self.malformed(format!(
                        "column '{column}': bloom filter header does not parse"
                    ))
                })?;
                Bytes::from(parts.concat())
            }
            RegionKind::Chunk { .. } | RegionKind::Refused(_) => unreachable!("not small"),
        };
        self.small.insert(i, plain.clone());
        Ok(plain)
    }

    async fn fetch_region(&mut self, range: Range<u64>) -> Result<Bytes> {
        let file = self.file.clone();
        self.fetch(range)
            .await
            .map_err(|e| DecryptError::Malformed {
                file,
                reason: e.to_string(),
            })
    }

    fn one_module(
        &self,
        crypto: &FileCrypto,
        enc: &Bytes,
        kind: ModuleType,
        rg: usize,
        col: usize,
        column: &str,
    ) -> Result<Module> {
        let position = ModulePosition::new(kind, rg, col, 0);
        let (body, _) = split_module(enc).ok_or(DecryptError::Tampered {
            file: self.file.clone(),
            column: Some(column.into()),
            position,
            error: ModuleError::Truncated,
        })?;
        self.module(&crypto.file_aad, position, enc.slice_ref(body))
    }

    /// Rewrites a decrypted offset index to plaintext page offsets and records the
    /// chunk's pages.
    fn plaintext_offsets(&self, crypto: &FileCrypto, chunk: usize, index: &mut [u8]) -> Result<()> {
        let region = &crypto.regions[chunk];
        let RegionKind::Chunk {
            units, has_dict, ..
        } = &region.kind
        else {
            unreachable!("offset index of a chunk")
        };
        let bad = |reason: &str| {
            self.malformed(format!(
                "column '{}' (row group {}): offset index {reason}",
                region.column, region.row_group
            ))
        };
        let locations =
            compact::offset_index_locations(index).ok_or_else(|| bad("does not parse"))?;
        let algorithm = crypto.algorithm;
        let mut list = Vec::with_capacity(locations.len() + 1);
        let (start, end) = (region.range.start, region.range.end);
        let mut enc_at = start;
        let mut plain_at = start;
        let mut push = |enc: Range<u64>, dict: bool, ordinal: usize| -> Result<()> {
            let kind = if dict {
                ModuleType::DictionaryPage
            } else {
                ModuleType::DataPage
            };
            let overhead = (GCM_OVERHEAD + algorithm.overhead(kind)) as u64;
            let len = (enc.end - enc.start)
                .checked_sub(overhead)
                .ok_or_else(|| bad("has a page smaller than its encryption overhead"))?;
            list.push(Unit {
                enc,
                plain: plain_at..plain_at + len,
                dict,
                ordinal,
            });
            plain_at += len;
            Ok(())
        };
        if let Some(first) = locations.first()
            && (first.offset as u64) > start
        {
            if !has_dict {
                return Err(bad("leaves a gap before the first page"));
            }
            push(start..first.offset as u64, true, 0)?;
            enc_at = first.offset as u64;
        }
        for (ordinal, loc) in locations.iter().enumerate() {
            let (off, size) = (loc.offset as u64, loc.size.max(0) as u64);
            if off != enc_at || off + size > end {
                return Err(bad("does not match the column chunk"));
            }
            push(off..off + size, false, ordinal)?;
            enc_at = off + size;
        }
        let pages: Vec<(i64, i64)> = list
            .iter()
            .filter(|u| !u.dict)
            .map(|u| (u.plain.start as i64, (u.plain.end - u.plain.start) as i64))
            .collect();
        compact::patch_offset_index(index, &locations, pages)
            .ok_or_else(|| bad("cannot be rewritten"))?;
        let _ = units.set(Arc::new(list));
        Ok(())
    }

    /// The plaintext of `sub` inside column chunk region `i`.
    async fn chunk_image(
        &mut self,
        crypto: &FileCrypto,
        i: usize,
        sub: Range<u64>,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[i];
        let RegionKind::Chunk {
            key,
            has_dict,
            units,
            offset_index,
        } = &region.kind
        else {
            unreachable!("chunk region")
        };
        let whole = sub == region.range;
        if !whole
            && units.get().is_none()
            && let Some(oi) = offset_index
        {
            self.small_region(crypto, *oi).await?;
        }
        // A page range (page index reads): decrypt only those pages.
        if !whole
            && let Some(units) = units.get()
            && let Some((first, last)) = page_span(units, &sub)
        {
            let a = &units[first];
            self.counters.page_ranges.add(1);
            let enc = self.fetch_owned(u_enc(units, first, last)).await?;
            let plain = self
                .decrypt_pages(crypto, region, key, enc, a.dict, a.ordinal)
                .await?;
            let from = (sub.start - a.plain.start) as usize;
            let to = (sub.end - a.plain.start) as usize;
            if to > plain.len() {
                return Err(self
                    .malformed(format!(
                        "column '{}' (row group {}): pages do not match the offset index",
                        region.column, region.row_group
                    ))
                    .into());
            }
            return Ok(plain.freeze().slice(from..to));
        }
        self.counters.chunks.add(1);
        let enc = self.fetch_owned(region.range.clone()).await?;
        let enc_len = enc.len();
        let plain = self
            .decrypt_pages(crypto, region, key, enc, *has_dict, 0)
            .await?;
        let plain = self.pad_chunk(region, enc_len, plain)?;
        let rel =
            (sub.start - region.range.start) as usize..(sub.end - region.range.start) as usize;
        Ok(plain.slice(rel))
    }

    /// A decrypted chunk at its encrypted length: the slack becomes an `INDEX_PAGE`.
    fn pad_chunk(
        &self,
        region: &Region,
        enc_len: usize,
        mut plain: BytesMut,
    ) -> parquet::errors::Result<Bytes> {
        let slack = enc_len.checked_sub(plain.len()).ok_or_else(|| {
            self.malformed(format!(
                "column '{}' (row group {}): plaintext longer than its encrypted chunk",
                region.column, region.row_group
            ))
        })?;
        if slack > 0 {
            let pad = compact::index_page(slack).ok_or_else(|| {
                self.malformed(format!(
                    "column '{}' (row group {}): {slack} spare bytes cannot hold a page header",
                    region.column, region.row_group
                ))
            })?;
            plain.extend_from_slice(&pad);
        }
        Ok(plain.freeze())
    }

    /// Decrypts consecutive pages (header and body modules) starting with the page of
    /// ordinal `ordinal` (or the dictionary page), returning them in plaintext, packed.
    async fn decrypt_pages(
        &self,
        crypto: &FileCrypto,
        region: &Region,
        key: &ColumnKey,
        enc: Bytes,
        first_is_dict: bool,
        ordinal: usize,
    ) -> Result<BytesMut> {
        let (rg, col, column) = (region.row_group, region.ordinal, region.column.as_str());
        let truncated = |kind, page| DecryptError::Tampered {
            file: self.file.clone(),
            column: Some(column.into()),
            position: ModulePosition::new(kind, rg, col, page),
            error: ModuleError::Truncated,
        };
        // Module bodies (positions in `enc`), header and page alternating.
        let mut bodies: Vec<(ModulePosition, Range<usize>)> = Vec::new();
        let (mut at, mut dict, mut page) = (0usize, first_is_dict, ordinal);
        while at < enc.len() {
            let (hk, pk) = if dict {
                (ModuleType::DictionaryPageHeader, ModuleType::DictionaryPage)
            } else {
                (ModuleType::DataPageHeader, ModuleType::DataPage)
            };
            let (header, after) = split_module(&enc[at..]).ok_or_else(|| truncated(hk, page))?;
            let h = at + LENGTH_LEN..at + LENGTH_LEN + header.len();
            let (body, _) = split_module(after).ok_or_else(|| truncated(pk, page))?;
            let p = h.end + LENGTH_LEN..h.end + LENGTH_LEN + body.len();
            at = p.end;
            bodies.push((ModulePosition::new(hk, rg, col, page), h));
            bodies.push((ModulePosition::new(pk, rg, col, page), p));
            if !dict {
                page += 1;
            }
            dict = false;
        }
        let aad = |p: &ModulePosition| {
            p.aad(&crypto.file_aad)
                .ok_or_else(|| self.malformed("more than 32767 row groups, columns or pages"))
        };
        match &key.cipher {
            Some(cipher) => {
                // In place: each module decrypts into the buffer it was read into, packed
                // from the start (no copy when the fetched buffer is not shared).
                self.counters.modules.add(bodies.len());
                let mut buf = enc
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                let mut w = 0;
                for pair in bodies.chunks(2) {
                    let mut plain = [0usize; 2];
                    let header_at = w;
                    for (i, (position, range)) in pair.iter().enumerate() {
                        plain[i] = cipher
                            .decrypt_within(
                                crypto.algorithm,
                                position.kind,
                                &aad(position)?,
                                &mut buf,
                                range.clone(),
                                w,
                            )
                            .map_err(|error| DecryptError::Tampered {
                                file: self.file.clone(),
                                column: Some(column.into()),
                                position: *position,
                                error,
                            })?;
                        w += plain[i];
                    }
                    self.fix_header(
                        &mut buf[header_at..header_at + plain[0]],
                        &pair[0].0,
                        plain[1],
                        column,
                    )?;
                }
                buf.truncate(w);
                Ok(buf)
            }
            None => {
                let modules = bodies
                    .iter()
                    .map(|(position, range)| {
                        Ok(Module {
                            position: *position,
                            aad: aad(position)?,
                            data: enc.slice(range.clone()),
                            nonce: None,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let plains = self
                    .decrypt(key, crypto.algorithm, Some(column), modules)
                    .await?;
                let mut out = BytesMut::with_capacity(enc.len());
                // The view's layout follows from module lengths: a plaintext of another
                // length is an error, never a shifted page.
                for ((position, range), plain) in bodies.iter().zip(&plains) {
                    let overhead = crypto.algorithm.overhead(position.kind) - LENGTH_LEN;
                    if plain.len() + overhead != range.len() {
                        return Err(self.malformed(format!(
                            "column '{column}': {}: the crypto provider returned {} bytes for a {}-byte module",
                            error::module_desc(position),
                            plain.len(),
                            range.len()
                        )));
                    }
                }
                for (pair, plain) in bodies.chunks(2).zip(plains.chunks(2)) {
                    let mut header = plain[0].clone();
                    self.fix_header(&mut header, &pair[0].0, plain[1].len(), column)?;
                    out.extend_from_slice(&header);
                    out.extend_from_slice(&plain[1]);
                }
                Ok(out)
            }
        }
    }

    /// Gives a decrypted page header its plaintext body size (same header length).
    fn fix_header(
        &self,
        header: &mut [u8],
        p: &ModulePosition,
        body_len: usize,
        column: &str,
    ) -> Result<()> {
        let p = *p;
        let bad = |reason: String| {
            self.malformed(format!(
                "column '{column}': {}: {reason}",
                error::module_desc(&p)
            ))
        };
        let page_type = compact::rewrite_page_header(header, body_len as i64)
            .ok_or_else(|| bad("page header does not parse".into()))?;
        let is_dict = page_type == compact::DICTIONARY_PAGE;
        if is_dict != (p.kind == ModuleType::DictionaryPageHeader) {
            return Err(bad(format!("unexpected page type {page_type}")));
        }
        Ok(())
    }
}

/// The pages (first and last index) whose plaintext covers `sub`, when `sub` ends within
/// them (not in the chunk's trailing padding).
fn page_span(units: &[Unit], sub: &Range<u64>) -> Option<(usize, usize)> {
    let first = units.iter().position(|u| u.plain.end > sub.start)?;
    let last = units.iter().rposition(|u| u.plain.start < sub.end)?;
    (first <= last && sub.end <= units[last].plain.end).then_some((first, last))
}

/// The encrypted bytes of pages `first..=last`.
fn u_enc(units: &[Unit], first: usize, last: usize) -> Range<u64> {
    units[first].enc.start..units[last].enc.end
}

/// Bytes of `range` inside the regions `hits` (which overlap it).
fn covered(regions: &[Region], hits: &[usize], range: &Range<u64>) -> u64 {
    hits.iter()
        .map(|i| {
            let g = &regions[*i].range;
            g.end.min(range.end) - g.start.max(range.start)
        })
        .sum()
}

/// Indexes of the regions overlapping `range`.
fn overlapping(regions: &[Region], range: &Range<u64>) -> Vec<usize> {
    let from = regions.partition_point(|r| r.range.end <= range.start);
    (from..regions.len())
        .take_while(|i| regions[*i].range.start < range.end)
        .collect()
}

/// After sorting, chunk regions point at their offset index region (and back).
fn relink(regions: &mut [Region]) {
    let mut chunk_at: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, r) in regions.iter().enumerate() {
        if matches!(r.kind, RegionKind::Chunk { .. }) {
            chunk_at.insert((r.row_group, r.ordinal), i);
        }
    }
    let mut oi_at: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, r) in regions.iter_mut().enumerate() {
        if let RegionKind::OffsetIndex { chunk, .. } = &mut r.kind {
            *chunk = chunk_at[&(r.row_group, r.ordinal)];
            oi_at.insert((r.row_group, r.ordinal), i);
        }
    }
    for r in regions.iter_mut() {
        let at = oi_at.get(&(r.row_group, r.ordinal)).copied();
        if let RegionKind::Chunk { offset_index, .. } = &mut r.kind {
            *offset_index = at;
        }
    }
}

fn column_path(chunk: &ColumnChunk) -> String {
    if let Some(m) = &chunk.meta_data {
        return m.path_in_schema.join(".");
    }
    match &chunk.crypto_metadata {
        Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(k)) => k.path_in_schema.join("."),
        _ => "?".into(),
    }
}

/// For each leaf column, in column order: the field id (if the file has one) and name of
/// the top-level field it belongs to. Bounded by the schema's length, whatever
/// `num_children` a malformed file claims.
fn top_level_fields(schema: &[SchemaElement]) -> Vec<(Option<i32>, String)> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < schema.len() {
        let top = &schema[i];
        let mut pending: usize = 1;
        while pending > 0 && i < schema.len() {
            let e = &schema[i];
            i += 1;
            pending -= 1;
            match e.num_children {
                Some(n) if n > 0 => pending = pending.saturating_add(n as usize),
                // A leaf has a physical type; an element without one and without
                // children is an empty group (no column), as parquet-rs reads it.
                _ if e.type_.is_some() => out.push((top.field_id, top.name.clone())),
                _ => {}
            }
        }
    }
    out
}

/// Physical types of the schema's leaves, in column order.
fn leaf_types(schema: &[SchemaElement]) -> Vec<parquet::format::Type> {
    schema
        .iter()
        .skip(1)
        .filter(|e| e.num_children.unwrap_or(0) == 0)
        .map(|e| e.type_.unwrap_or(parquet::format::Type::BYTE_ARRAY))
        .collect()
}

/// Where the chunks of columns whose metadata stays encrypted (encrypted footer, column
/// key not granted) are: between their neighbours, as chunks are laid out in column
/// order. Their placeholders cover these bytes, so that reading them fails (a chunk of
/// zero bytes would read as zero rows).
fn refused_extents(
    meta: &FileMetaData,
    decrypted: &HashMap<(usize, usize), ColumnMetaData>,
    footer_start: u64,
) -> HashMap<(usize, usize), (u64, u64)> {
    let extent = |rg: usize, col: usize| {
        let chunk = &meta.row_groups[rg].columns[col];
        let cmd = decrypted.get(&(rg, col)).or(chunk.meta_data.as_ref())?;
        let start = cmd
            .dictionary_page_offset
            .unwrap_or(cmd.data_page_offset)
            .max(0) as u64;
        Some((start, start + cmd.total_compressed_size.max(0) as u64))
    };
    // Everything else that has a place: known chunks, indexes, Bloom filters, the footer.
    let mut occupied = vec![footer_start];
    for (rg, group) in meta.row_groups.iter().enumerate() {
        for (col, chunk) in group.columns.iter().enumerate() {
            occupied.extend(extent(rg, col).map(|e| e.0));
            occupied.extend(chunk.column_index_offset.map(|o| o.max(0) as u64));
            occupied.extend(chunk.offset_index_offset.map(|o| o.max(0) as u64));
        }
    }
    occupied.sort_unstable();
    let mut out = HashMap::new();
    let mut cursor = 4u64;
    for (rg, group) in meta.row_groups.iter().enumerate() {
        let n = group.columns.len();
        let mut col = 0;
        while col < n {
            if let Some((_, end)) = extent(rg, col) {
                cursor = end;
                col += 1;
                continue;
            }
            let run_end = (col..n).find(|c| extent(rg, *c).is_some()).unwrap_or(n);
            let end = match extent(rg, run_end.min(n.saturating_sub(1))) {
                Some((start, _)) if run_end < n => start,
                _ => occupied
                    .iter()
                    .copied()
                    .find(|o| *o > cursor)
                    .unwrap_or(footer_start),
            };
            let count = (run_end - col) as u64;
            let share = end.saturating_sub(cursor) / count.max(1);
            for (i, c) in (col..run_end).enumerate() {
                out.insert((rg, c), (cursor + i as u64 * share, share));
            }
            cursor = end;
            col = run_end;
        }
    }
    out
}

/// Column metadata for a refused column whose metadata stays encrypted: enough for
/// parquet-rs to build the schema; its data is never read.
fn placeholder(
    leaves: &[parquet::format::Type],
    col: usize,
    path: &str,
    num_rows: i64,
    offset: u64,
    len: u64,
) -> ColumnMetaData {
    ColumnMetaData {
        type_: leaves
            .get(col)
            .copied()
            .unwrap_or(parquet::format::Type::BYTE_ARRAY),
        encodings: vec![],
        path_in_schema: path.split('.').map(Into::into).collect(),
        codec: CompressionCodec::UNCOMPRESSED,
        num_values: num_rows,
        total_uncompressed_size: len as i64,
        total_compressed_size: len as i64,
        key_value_metadata: None,
        data_page_offset: offset as i64,
        index_page_offset: None,
        dictionary_page_offset: None,
        statistics: None,
        encoding_stats: None,
        bloom_filter_offset: None,
        bloom_filter_length: None,
        size_statistics: None,
        geospatial_statistics: None,
    }
}

/// Names the file in errors that do not already (ours always do).
fn named(path: &str, e: parquet::errors::ParquetError) -> parquet::errors::ParquetError {
    use parquet::errors::ParquetError;
    match e {
        ParquetError::External(e) if e.is::<DecryptError>() => ParquetError::External(e),
        e => {
            let msg = e.to_string();
            if msg.contains(path) {
                e
            } else {
                ParquetError::General(format!("file '{path}': {msg}"))
            }
        }
    }
}

impl AsyncFileReader for DecryptingReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let mut v = self
                .get_ranges(vec![range])
                .await
                .map_err(|e| named(&self.file, e))?;
            Ok(v.pop().expect("one range"))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.get_ranges(ranges)
                .await
                .map_err(|e| named(&self.file, e))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let view = self.view().await.map_err(|e| named(&self.file, e))?;
            let column = options.map_or(PageIndexPolicy::Skip, |o| o.column_index_policy());
            let offset = options.map_or(PageIndexPolicy::Skip, |o| o.offset_index_policy());
            if column == PageIndexPolicy::Skip && offset == PageIndexPolicy::Skip {
                return Ok(Arc::clone(&view.metadata));
            }
            let mut reader =
                ParquetMetaDataReader::new_with_metadata(view.metadata.as_ref().clone())
                    .with_column_index_policy(column)
                    .with_offset_index_policy(offset);
            reader.load_page_index(&mut *self).await?;
            Ok(Arc::new(reader.finish().map_err(|e| named(&self.file, e))?))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_finds_regions() {
        let mk = |a: u64, b: u64| Region {
            range: a..b,
            column: String::new(),
            row_group: 0,
            ordinal: 0,
            kind: RegionKind::Refused(String::new()),
        };
        let regions = vec![mk(10, 20), mk(20, 30), mk(40, 50)];
        assert_eq!(overlapping(&regions, &(0..10)), Vec::<usize>::new());
        assert_eq!(overlapping(&regions, &(15..25)), vec![0, 1]);
        assert_eq!(overlapping(&regions, &(30..40)), Vec::<usize>::new());
        assert_eq!(overlapping(&regions, &(0..100)), vec![0, 1, 2]);
    }

    #[test]
    fn leaves_map_to_their_top_level_field() {
        let el = |name: &str, children: Option<i32>, id: Option<i32>| {
            let leaf = children.is_none();
            SchemaElement::new(
                leaf.then_some(parquet::format::Type::INT64),
                None,
                None,
                name.to_owned(),
                children,
                None,
                None,
                None,
                id,
                None,
            )
        };
        // schema { id: 1; address (7) { street (8); geo (9) { lat (10); lon (11) } }; ssn: 4 }
        let schema = vec![
            el("schema", Some(3), None),
            el("id", None, Some(1)),
            el("address", Some(2), Some(7)),
            el("street", None, Some(8)),
            el("geo", Some(2), Some(9)),
            el("lat", None, Some(10)),
            el("lon", None, Some(11)),
            el("ssn", None, Some(4)),
        ];
        let tops: Vec<(Option<i32>, String)> = top_level_fields(&schema);
        let ids: Vec<_> = tops.iter().map(|(f, n)| (*f, n.as_str())).collect();
        assert_eq!(
            ids,
            vec![
                (Some(1), "id"),
                (Some(7), "address"),
                (Some(7), "address"),
                (Some(7), "address"),
                (Some(4), "ssn")
            ]
        );
        // An element with neither a type nor children is an empty group: no column, so
        // the columns after it keep their own fields.
        let mut hole = schema.clone();
        hole.insert(2, el("x", Some(0), Some(99)));
        hole[2].type_ = None;
        hole[0].num_children = Some(4);
        let ids: Vec<_> = top_level_fields(&hole)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        assert_eq!(ids, vec![Some(1), Some(7), Some(7), Some(7), Some(4)]);
        // A malformed count ends with the schema, not beyond it.
        let bad = vec![
            el("schema", Some(1), None),
            el("x", Some(i32::MAX), Some(1)),
        ];
        assert!(top_level_fields(&bad).is_empty());
    }
}
