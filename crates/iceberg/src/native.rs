//! Iceberg-native table encryption (format v3, `encryption.key-id`), as Iceberg Java 1.10+
//! writes it:
//!
//! ```text
//!  table key (encryption.key-id, in the KMS)
//!   └─ wraps key encryption keys (metadata `encryption-keys`, encrypted-by-id = table key)
//!       └─ encrypt each snapshot's manifest-list key metadata (AES-GCM, AAD = KEK timestamp)
//!           └─ manifest list (AGS1 stream) ─ key_metadata of each manifest (AGS1)
//!               └─ key_metadata of each data and delete file: its own data key and AAD
//!                  prefix (Parquet: PME, uniform, footer key = data key, prefix not stored;
//!                  Puffin deletion vectors: AGS1)
//! ```
//!
//! iceberg-rust 0.10.1 decrypts manifest lists and manifests when its `Table` has a
//! [`KeyManagementClient`], but its catalogs build tables without one (such a table fails to
//! load). [`NativeCatalog`] wraps a catalog: a table that fails so is located again
//! ([`Locator`]: the SQL catalog's row, the Hive metastore's `metadata_location`) and built
//! with [`TableKms`], the engine's KMS under Iceberg's `KeyManagementClient` semantics (the
//! keyring's wrap format). Data and delete files get their keys from the manifests
//! ([`FileKeys`]), handed to the decrypting reader per file.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use clearice_crypto::{CallContext, Kms, ProviderError, ProviderRef, SecretKey};
use clearice_pme::{FileKey, FileKeys};
use iceberg::encryption::{GeneratedKey, KeyManagementClient, SensitiveBytes, StandardKeyMetadata};
use iceberg::io::FileIO;
use iceberg::spec::{ManifestStatus, TableMetadata};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error as IceError, ErrorKind, Namespace, NamespaceIdent, Result as IceResult,
    TableCommit, TableCreation, TableIdent,
};

/// The table property naming a natively encrypted table's key (Iceberg's
/// `TableProperties.ENCRYPTION_TABLE_KEY`).
pub const TABLE_KEY_PROPERTY: &str = "encryption.key-id";

/// The master key id a table is natively encrypted under, if it is.
pub fn table_key_id(metadata: &TableMetadata) -> Option<&str> {
    metadata
        .properties()
        .get(TABLE_KEY_PROPERTY)
        .map(String::as_str)
}

/// Refuses iceberg-rust's own append path ([`crate::write::commit_append`]) on a table
/// Iceberg encrypts (`name` in messages): its manifests would be plaintext; such tables are
/// committed to by [`crate::commit::commit_overwrite`].
pub(crate) fn refuse_write(table: &Table, name: &str) -> crate::Result<()> {
    match table_key_id(table.metadata()) {
        None => Ok(()),
        Some(key) => Err(crate::Error::Unsupported {
            table: name.to_owned(),
            what: format!(
                "an Iceberg fast append to a table Iceberg encrypts itself (table key '{key}'; ClearIce appends to such tables through its own commit)"
            ),
        }),
    }
}

/// The engine's KMS as Iceberg's `KeyManagementClient`: wrapped keys are the bytes the
/// KMS's text form encodes (the keyring: `nonce || AES-GCM(master, key, aad = id) || tag`,
/// as `clearice.test.KeyringKms` and parquet-java's local wrapping write them). Unwrapped
/// keys are cached per wrapped key for `ttl` (`[kms] key_cache_ttl_s`: a table's key
/// encryption keys are few and long-lived, each query loads its table anew; a table key
/// the KMS stops granting stops working within `ttl`).
pub struct TableKms {
    kms: Arc<dyn Kms>,
    ttl: std::time::Duration,
    cache: std::sync::Mutex<HashMap<WrappedKey, (SecretKey, std::time::Instant)>>,
}

/// A wrapped key: its wrapping key id and bytes.
type WrappedKey = (String, Vec<u8>);

impl TableKms {
    /// Iceberg's key client over `kms`, caching unwrapped keys for `ttl`.
    pub fn new(kms: Arc<dyn Kms>, ttl: std::time::Duration) -> Self {
        Self {
            kms,
            ttl,
            cache: std::sync::Mutex::default(),
        }
    }

    fn cached(&self, id: &str, wrapped: &[u8]) -> Option<SecretKey> {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        cache.retain(|_, (_, at)| now.duration_since(*at) < self.ttl);
        cache
            .get(&(id.to_owned(), wrapped.to_vec()))
            .map(|(k, _)| k.clone())
    }
}

impl fmt::Debug for TableKms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableKms")
            .field("kms", &self.kms.name())
            .finish_non_exhaustive()
    }
}

fn kms_error(e: clearice_crypto::Error) -> IceError {
    IceError::new(ErrorKind::Unexpected, e.to_string())
}

#[async_trait]
impl KeyManagementClient for TableKms {
    async fn wrap_key(&self, key: &[u8], wrapping_key_id: &str) -> IceResult<Vec<u8>> {
        let text = self
            .kms
            .wrap_key(key, wrapping_key_id)
            .await
            .map_err(kms_error)?;
        BASE64_STANDARD.decode(text).map_err(|_| {
            IceError::new(
                ErrorKind::Unexpected,
                format!(
                    "KMS '{}' wrapped key '{wrapping_key_id}' as non-base64 text",
                    self.kms.name()
                ),
            )
        })
    }

    async fn unwrap_key(
        &self,
        wrapped_key: &[u8],
        wrapping_key_id: &str,
    ) -> IceResult<SensitiveBytes> {
        if let Some(k) = self.cached(wrapping_key_id, wrapped_key) {
            return Ok(SensitiveBytes::new(k.expose()));
        }
        let key = self
            .kms
            .unwrap_key(&BASE64_STANDARD.encode(wrapped_key), wrapping_key_id)
            .await
            .map_err(kms_error)?;
        let out = SensitiveBytes::new(key.expose());
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                (wrapping_key_id.to_owned(), wrapped_key.to_vec()),
                (key, std::time::Instant::now()),
            );
        Ok(out)
    }

    fn supports_key_generation(&self) -> bool {
        false
    }

    async fn generate_key(&self, wrapping_key_id: &str) -> IceResult<GeneratedKey> {
        Err(IceError::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "KMS '{}' does not generate keys (key '{wrapping_key_id}')",
                self.kms.name()
            ),
        ))
    }
}

/// A table's current metadata file as its catalog knows it, with what a Hive metastore
/// keeps beside it for tables Iceberg encrypts (Iceberg's `HiveTableOperations`: the table
/// key id is taken from the metastore, not from the metadata file anyone with storage
/// access could rewrite, and the file is checked against the metastore's hash).
struct Located {
    location: String,
    /// The metastore's `encryption.key-id`.
    key_id: Option<String>,
    /// The metastore's `metadata_hash`: base64 SHA-256 of the metadata file.
    hash: Option<String>,
}

/// Where a catalog keeps a table's current metadata file, asked directly (iceberg-rust's
/// catalogs cannot load natively encrypted tables).
pub enum Locator {
    /// An Iceberg SQL catalog: its `iceberg_tables` row.
    Sql {
        /// The catalog's `catalog_name`.
        catalog: String,
        /// Connection URI.
        uri: String,
        /// Connected on first use.
        pool: Arc<tokio::sync::OnceCell<sqlx::AnyPool>>,
    },
    /// A Hive metastore: the table's `metadata_location` parameter.
    Hms {
        /// The metastore's client.
        client: hive_metastore::ThriftHiveMetastoreClient,
    },
    /// The catalog cannot be asked (yet).
    Unsupported {
        /// Why.
        reason: String,
    },
}

impl fmt::Debug for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sql { catalog, .. } => write!(f, "Locator::Sql({catalog})"),
            Self::Hms { .. } => f.write_str("Locator::Hms"),
            Self::Unsupported { reason } => write!(f, "Locator::Unsupported({reason})"),
        }
    }
}

impl Locator {
    /// A SQL catalog's locator (`uri` as the catalog was opened with).
    pub fn sql(catalog: &str, uri: &str) -> Self {
        Self::Sql {
            catalog: catalog.to_owned(),
            uri: uri.to_owned(),
            pool: Arc::default(),
        }
    }

    /// A Hive metastore's locator (`host:port`, or `thrift://host:port`).
    pub async fn hms(uri: &str) -> IceResult<Self> {
        let address = uri.strip_prefix("thrift://").unwrap_or(uri);
        let address = tokio::net::lookup_host(address.trim_end_matches('/'))
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                IceError::new(
                    ErrorKind::DataInvalid,
                    format!("Hive metastore address '{uri}' does not resolve"),
                )
            })?;
        let client = hive_metastore::ThriftHiveMetastoreClientBuilder::new("hms")
            .address(address)
            .make_codec(volo_thrift::codec::default::DefaultMakeCodec::buffered())
            .build();
        Ok(Self::Hms { client })
    }

    /// Whether the catalog itself says which tables are encrypted (a Hive metastore): then
    /// every table is located here first.
    fn keeps_table_keys(&self) -> bool {
        matches!(self, Self::Hms { .. })
    }

    /// The current metadata file of `ident`.
    async fn locate(&self, ident: &TableIdent) -> IceResult<Located> {
        let unexpected = |what: String| IceError::new(ErrorKind::Unexpected, what);
        match self {
            Self::Sql { catalog, uri, pool } => {
                let pool = pool
                    .get_or_try_init(|| async {
                        sqlx::any::install_default_drivers();
                        sqlx::any::AnyPoolOptions::new()
                            .max_connections(2)
                            .connect(uri)
                            .await
                    })
                    .await
                    .map_err(|e| unexpected(format!("catalog database: {e}")))?;
                let p = |n: usize| {
                    if uri.starts_with("postgres") {
                        format!("${n}")
                    } else {
                        "?".to_owned()
                    }
                };
                let sql = format!(
                    "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = {} \
                     AND table_namespace = {} AND table_name = {}",
                    p(1),
                    p(2),
                    p(3)
                );
                let row: Option<(String,)> = sqlx::query_as(&sql)
                    .bind(catalog.clone())
                    .bind(ident.namespace().join("."))
                    .bind(ident.name().to_owned())
                    .fetch_optional(pool)
                    .await
                    .map_err(|e| unexpected(format!("catalog database: {e}")))?;
                let location = row.map(|r| r.0).ok_or_else(|| {
                    IceError::new(ErrorKind::TableNotFound, format!("table {ident} not found"))
                })?;
                Ok(Located {
                    location,
                    key_id: None,
                    hash: None,
                })
            }
            Self::Hms { client } => {
                let db = ident.namespace().join(".");
                let table = client
                    .get_table(db.into(), ident.name().to_owned().into())
                    .await
                    .map_err(|e| unexpected(format!("Hive metastore: {e}")))?;
                let table = match table {
                    volo_thrift::MaybeException::Ok(t) => t,
                    volo_thrift::MaybeException::Exception(e) => {
                        return Err(unexpected(format!("Hive metastore: {e:?}")));
                    }
                };
                let param = |k: &str| {
                    table
                        .parameters
                        .as_ref()
                        .and_then(|p| p.get(k))
                        .map(|v| v.to_string())
                };
                let location = param("metadata_location").ok_or_else(|| {
                    unexpected(format!(
                        "Hive table {ident} has no 'metadata_location' (not an Iceberg table)"
                    ))
                })?;
                Ok(Located {
                    location,
                    key_id: param(TABLE_KEY_PROPERTY),
                    hash: param("metadata_hash"),
                })
            }
            Self::Unsupported { reason } => Err(IceError::new(
                ErrorKind::FeatureUnsupported,
                format!("Iceberg-native table encryption through this catalog ({reason})"),
            )),
        }
    }
}

/// A file IO over `stores` with catalog properties `props` (`s3.*`), as the catalogs have.
pub fn file_io(stores: &clearice_storage::LakeStores, props: &HashMap<String, String>) -> FileIO {
    iceberg::io::FileIOBuilder::new(Arc::new(clearice_storage::LakeStorageFactory::new(
        stores.clone(),
    )))
    .with_props(props.clone())
    .build()
}

/// A catalog whose natively encrypted tables load with a KMS client. Everything else is
/// the inner catalog's.
#[derive(Debug)]
pub struct NativeCatalog {
    inner: Arc<dyn Catalog>,
    locator: Locator,
    kms: Option<Arc<TableKms>>,
    file_io: FileIO,
}

impl NativeCatalog {
    /// Wraps `inner`: tables it cannot load for want of a KMS client are located by
    /// `locator`, read with `file_io` and built with `kms` (none: such tables fail in one
    /// line naming the table key), whose unwrapped keys are cached for `ttl`.
    pub fn wrap(
        inner: Arc<dyn Catalog>,
        locator: Locator,
        kms: Option<(Arc<dyn Kms>, std::time::Duration)>,
        file_io: FileIO,
    ) -> Arc<dyn Catalog> {
        Arc::new(Self {
            inner,
            locator,
            kms: kms.map(|(k, ttl)| Arc::new(TableKms::new(k, ttl))),
            file_io,
        })
    }

    async fn load_native(&self, ident: &TableIdent, located: Located) -> IceResult<Table> {
        self.load_checked(ident, located, Trust::Verify).await
    }

    /// [`Self::load_native`]; `trust` says whether the file must prove it is the one its
    /// catalog vouches for (a Hive metastore: its key id and hash; a SQL catalog: a name
    /// that carries its hash, see [`anchored_location`]).
    async fn load_checked(
        &self,
        ident: &TableIdent,
        located: Located,
        trust: Trust,
    ) -> IceResult<Table> {
        let Located {
            location,
            key_id,
            hash,
        } = located;
        let modified = |why: String| {
            IceError::new(
                ErrorKind::DataInvalid,
                format!(
                    "metadata file '{location}' of table {ident} might have been modified: {why}"
                ),
            )
            .with_source(Untrusted)
        };
        let bytes = self.file_io.new_input(&location)?.read().await?;
        use sha2::Digest;
        let digest = sha2::Sha256::digest(&bytes);
        match (&self.locator, trust) {
            // The metastore says which tables are encrypted, under which key, and hashes
            // their metadata (Iceberg's HiveTableOperations): all three must hold.
            (Locator::Hms { .. }, _) => {
                if key_id.is_none() {
                    return Err(modified(
                        "the metastore does not say the table is encrypted, the file does".into(),
                    ));
                }
                let Some(hash) = &hash else {
                    return Err(modified(
                        "the metastore keeps no metadata_hash for this encrypted table".into(),
                    ));
                };
                if BASE64_STANDARD.encode(digest) != *hash {
                    return Err(modified(
                        "its SHA-256 differs from the metastore's metadata_hash".into(),
                    ));
                }
            }
            (_, Trust::JustCreated) => {}
            // A SQL catalog row vouches only for the file's name, so the name must carry
            // the file's hash (as ClearIce names them).
            (_, Trust::Verify) => {
                if !is_anchored(&location, &digest) {
                    return Err(modified(
                        "a SQL catalog vouches for a table Iceberg encrypts only through a metadata file name that carries its SHA-256 (as ClearIce writes them; tables written elsewhere are read through their Hive metastore)".into(),
                    ));
                }
            }
        }
        let metadata: TableMetadata = serde_json::from_slice(&bytes).map_err(|e| {
            IceError::new(
                ErrorKind::DataInvalid,
                format!("metadata file '{location}' of table {ident} does not parse (compressed metadata is not read for encrypted tables): {e}"),
            )
        })?;
        if let Some(trusted) = &key_id
            && table_key_id(&metadata) != Some(trusted.as_str())
        {
            return Err(modified(format!(
                "the metastore encrypts it under table key '{trusted}', the file says {}",
                table_key_id(&metadata).map_or("none".into(), |k| format!("'{k}'"))
            )));
        }
        let key = table_key_id(&metadata).unwrap_or_default().to_owned();
        self.build(ident, metadata, location, key)
    }

    /// `metadata` at `location` as a table whose key encryption keys unwrap under table
    /// key `key` only, through the engine's KMS (none: every key refused, naming it).
    fn build(
        &self,
        ident: &TableIdent,
        metadata: TableMetadata,
        location: String,
        key: String,
    ) -> IceResult<Table> {
        let inner: Arc<dyn KeyManagementClient> = match &self.kms {
            Some(kms) => Arc::clone(kms) as Arc<dyn KeyManagementClient>,
            None => Arc::new(NoKms {
                table: ident.to_string(),
            }),
        };
        let client = BoundKms { inner, key };
        Table::builder()
            .file_io(self.file_io.clone())
            .metadata_location(location)
            .metadata(metadata)
            .identifier(ident.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .kms_client(Arc::new(client) as Arc<dyn KeyManagementClient>)
            .build()
    }

    /// Creates a table Iceberg encrypts in a SQL catalog: the inner catalog writes its first
    /// metadata file and row; the file is checked against what was asked, then committed
    /// again under a name that carries its hash, so the row vouches for it.
    async fn create_native(
        &self,
        ident: &TableIdent,
        key: &str,
        fields: Vec<(String, iceberg::spec::Type)>,
    ) -> IceResult<Table> {
        let Locator::Sql { catalog, uri, pool } = &self.locator else {
            return Err(IceError::new(
                ErrorKind::FeatureUnsupported,
                "tables Iceberg encrypts itself are created in SQL catalogs only",
            ));
        };
        let located = self.locator.locate(ident).await?;
        let table = self
            .load_checked(ident, located, Trust::JustCreated)
            .await?;
        let m = table.metadata();
        let got: Vec<(String, iceberg::spec::Type)> = m
            .current_schema()
            .as_struct()
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.field_type.as_ref().clone()))
            .collect();
        if table_key_id(m) != Some(key) || got != fields {
            return Err(IceError::new(
                ErrorKind::DataInvalid,
                format!(
                    "metadata file '{}' of new table {ident} is not the table that was created (modified while it was created?)",
                    table.metadata_location().unwrap_or_default()
                ),
            ));
        }
        let committer = crate::commit::Committer::Sql {
            catalog: catalog.clone(),
            uri: uri.clone(),
            pool: Arc::clone(pool),
        };
        let (metadata, location) = committer
            .swap_metadata(
                &ident.to_string(),
                &table,
                vec![],
                &std::sync::atomic::AtomicBool::new(false),
            )
            .await
            .map_err(|e| IceError::new(ErrorKind::Unexpected, e.to_string()))?;
        self.build(ident, metadata, location, key.to_owned())
    }
}

/// The typed source of a load error for a metadata file its catalog does not vouch for
/// (a swapped, renamed or re-keyed file): the table lists but is not read.
#[derive(Debug, thiserror::Error)]
#[error("its catalog does not vouch for this metadata file")]
pub struct Untrusted;

/// Whether `e` is a metadata file its catalog does not vouch for ([`Untrusted`]).
pub fn is_untrusted(e: &IceError) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<Untrusted>().is_some())
}

/// Whether a metadata file is checked against its catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// It must prove it is the file the catalog vouches for.
    Verify,
    /// This engine's catalog call wrote it a moment ago (checked against the request).
    JustCreated,
}

/// The first 128 bits of a SHA-256 in UUID form (the uuid part of Iceberg's metadata file
/// names).
fn hash_uuid(digest: &[u8]) -> String {
    let h: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The location of the metadata file that follows `current` for a table Iceberg encrypts
/// in a SQL catalog: `…/metadata/<next version>-<hash uuid>.metadata.json`, the hash of
/// its `bytes`, so the catalog row, which only an authorized writer changes, vouches for
/// the content (the warehouse may be writable by others).
pub(crate) fn anchored_location(current: &str, bytes: &[u8]) -> crate::Result<String> {
    use sha2::Digest;
    let (dir, file) = current.rsplit_once('/').unwrap_or(("", current));
    let version = file
        .split_once('-')
        .and_then(|(v, _)| v.parse::<u64>().ok())
        .ok_or_else(|| crate::Error::Write {
            table: String::new(),
            reason: format!(
                "metadata file '{current}' is not named <version>-<uuid>.metadata.json"
            ),
        })?;
    Ok(format!(
        "{dir}/{:05}-{}.metadata.json",
        version + 1,
        hash_uuid(&sha2::Sha256::digest(bytes))
    ))
}

/// Whether `location`'s file name carries `digest` ([`anchored_location`]).
fn is_anchored(location: &str, digest: &[u8]) -> bool {
    let file = location.rsplit('/').next().unwrap_or(location);
    file.strip_suffix(".metadata.json")
        .and_then(|f| f.split_once('-'))
        .is_some_and(|(_, uuid)| uuid == hash_uuid(digest))
}

/// A table's key client: unwraps and wraps under its table key only (a key encryption key
/// the metadata says is wrapped by another key is refused, not unwrapped).
#[derive(Debug)]
struct BoundKms {
    inner: Arc<dyn KeyManagementClient>,
    key: String,
}

impl BoundKms {
    fn check(&self, wrapping_key_id: &str) -> IceResult<()> {
        if wrapping_key_id == self.key {
            return Ok(());
        }
        Err(IceError::new(
            ErrorKind::DataInvalid,
            format!(
                "a key of this table is wrapped by key '{wrapping_key_id}', not by its table key '{}' (its metadata might have been modified)",
                self.key
            ),
        ))
    }
}

#[async_trait]
impl KeyManagementClient for BoundKms {
    async fn wrap_key(&self, key: &[u8], wrapping_key_id: &str) -> IceResult<Vec<u8>> {
        self.check(wrapping_key_id)?;
        self.inner.wrap_key(key, wrapping_key_id).await
    }

    async fn unwrap_key(
        &self,
        wrapped_key: &[u8],
        wrapping_key_id: &str,
    ) -> IceResult<SensitiveBytes> {
        self.check(wrapping_key_id)?;
        self.inner.unwrap_key(wrapped_key, wrapping_key_id).await
    }

    fn supports_key_generation(&self) -> bool {
        self.inner.supports_key_generation()
    }

    async fn generate_key(&self, wrapping_key_id: &str) -> IceResult<GeneratedKey> {
        self.check(wrapping_key_id)?;
        self.inner.generate_key(wrapping_key_id).await
    }
}

/// The key client of a table whose engine has no KMS: every key is refused, naming the
/// table key ([`with_key_client`] gives a scan its principal's own client).
#[derive(Debug)]
struct NoKms {
    table: String,
}

impl NoKms {
    fn refuse(&self, key: &str) -> IceError {
        IceError::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "table {} is encrypted by Iceberg under table key '{key}', and no KMS is configured ([kms])",
                self.table
            ),
        )
    }
}

#[async_trait]
impl KeyManagementClient for NoKms {
    async fn wrap_key(&self, _key: &[u8], wrapping_key_id: &str) -> IceResult<Vec<u8>> {
        Err(self.refuse(wrapping_key_id))
    }

    async fn unwrap_key(
        &self,
        _wrapped: &[u8],
        wrapping_key_id: &str,
    ) -> IceResult<SensitiveBytes> {
        Err(self.refuse(wrapping_key_id))
    }

    fn supports_key_generation(&self) -> bool {
        false
    }

    async fn generate_key(&self, wrapping_key_id: &str) -> IceResult<GeneratedKey> {
        Err(self.refuse(wrapping_key_id))
    }
}

/// A crypto provider that keeps table keys ([`clearice_crypto::CryptoProvider::unwrap_key`]) as one
/// principal's key client: the provider decides on every wrap and unwrap, for `ctx`.
#[derive(Debug)]
pub struct ProviderKeys {
    provider: ProviderRef,
    ctx: CallContext,
}

impl ProviderKeys {
    /// `provider`'s table keys, asked for as `ctx` says.
    pub fn new(provider: ProviderRef, ctx: CallContext) -> Self {
        Self { provider, ctx }
    }
}

/// A provider's refusal as an Iceberg error, its type kept as the source (a denial stays
/// a denial).
fn provider_error(e: ProviderError) -> IceError {
    IceError::new(ErrorKind::Unexpected, e.to_string()).with_source(e)
}

#[async_trait]
impl KeyManagementClient for ProviderKeys {
    async fn wrap_key(&self, key: &[u8], wrapping_key_id: &str) -> IceResult<Vec<u8>> {
        self.provider
            .wrap_key(&self.ctx, key, wrapping_key_id)
            .await
            .map_err(provider_error)
    }

    async fn unwrap_key(&self, wrapped: &[u8], wrapping_key_id: &str) -> IceResult<SensitiveBytes> {
        let key = self
            .provider
            .unwrap_key(&self.ctx, wrapped, wrapping_key_id)
            .await
            .map_err(provider_error)?;
        Ok(SensitiveBytes::new(key.expose()))
    }

    fn supports_key_generation(&self) -> bool {
        false
    }

    async fn generate_key(&self, wrapping_key_id: &str) -> IceResult<GeneratedKey> {
        Err(IceError::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "crypto provider '{}' does not generate keys (key '{wrapping_key_id}')",
                self.provider.name()
            ),
        ))
    }
}

/// `table` (natively encrypted) with its key encryption keys wrapped and unwrapped by
/// `client` instead of the client its catalog built it with, still under its table key
/// only. A fresh table: keys unwrapped through the old client are not carried over.
pub fn with_key_client(table: &Table, client: Arc<dyn KeyManagementClient>) -> IceResult<Table> {
    let key = table_key_id(table.metadata())
        .unwrap_or_default()
        .to_owned();
    let mut builder = Table::builder()
        .file_io(table.file_io().clone())
        .metadata(table.metadata_ref())
        .identifier(table.identifier().clone())
        .runtime(iceberg::Runtime::try_current()?)
        .kms_client(Arc::new(BoundKms { inner: client, key }) as Arc<dyn KeyManagementClient>);
    if let Some(location) = table.metadata_location() {
        builder = builder.metadata_location(location);
    }
    builder.build()
}

/// Whether iceberg-rust refused to build `e`'s table for want of a KMS client.
fn needs_kms(e: &IceError) -> bool {
    e.kind() == ErrorKind::PreconditionFailed && e.message().contains(TABLE_KEY_PROPERTY)
}

#[async_trait]
impl Catalog for NativeCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> IceResult<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> IceResult<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> IceResult<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> IceResult<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> IceResult<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> IceResult<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> IceResult<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> IceResult<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let key = creation.properties.get(TABLE_KEY_PROPERTY).cloned();
        let fields: Vec<(String, iceberg::spec::Type)> = creation
            .schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.field_type.as_ref().clone()))
            .collect();
        match self.inner.create_table(namespace, creation).await {
            // Created, but the inner catalog cannot build a table Iceberg encrypts.
            Err(e) if needs_kms(&e) => match key {
                Some(key) => self.create_native(&ident, &key, fields).await,
                None => Err(e),
            },
            other => other,
        }
    }

    async fn load_table(&self, table: &TableIdent) -> IceResult<Table> {
        if self.locator.keeps_table_keys() {
            let located = self.locator.locate(table).await?;
            if located.key_id.is_some() {
                return self.load_native(table, located).await;
            }
        }
        match self.inner.load_table(table).await {
            Err(e) if needs_kms(&e) => {
                let located = self.locator.locate(table).await?;
                self.load_native(table, located).await
            }
            other => other,
        }
    }

    async fn drop_table(&self, table: &TableIdent) -> IceResult<()> {
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> IceResult<()> {
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> IceResult<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> IceResult<()> {
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(
        &self,
        table: &TableIdent,
        metadata_location: String,
    ) -> IceResult<Table> {
        self.inner.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> IceResult<Table> {
        self.inner.update_table(commit).await
    }
}

/// Why [`file_keys`] failed.
#[derive(Debug)]
pub enum FileKeysError {
    /// A manifest list or manifest does not decrypt: `(kind, file)`.
    Tampered(&'static str, String),
    /// Anything else (a key that does not unwrap, a file without key metadata).
    Other(IceError),
}

/// Whether `e` is AES-GCM refusing a file (iceberg-rust reports it as a decryption
/// failure somewhere in the chain; a missing key or a KMS failure reads otherwise).
fn is_decryption_failure(e: &IceError) -> bool {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.contains("decryption failed") || text.contains("aead::Error")
}

/// Reads the keys of every live file of `snapshot_id` from its (decrypted) manifests, by
/// file location. A file without key metadata in a natively encrypted table is refused.
pub async fn file_keys(table: &Table, snapshot_id: i64) -> Result<FileKeys, FileKeysError> {
    let Some(snapshot) = table.metadata().snapshot_by_id(snapshot_id) else {
        return Ok(FileKeys::new());
    };
    fn named<'a>(kind: &'static str, file: &'a str) -> impl FnOnce(IceError) -> FileKeysError + 'a {
        move |e| {
            if is_decryption_failure(&e) {
                FileKeysError::Tampered(kind, file.to_owned())
            } else {
                FileKeysError::Other(e)
            }
        }
    }
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(named("manifest list", snapshot.manifest_list()))?;
    let mut keys = FileKeys::new();
    for mf in list.entries() {
        let manifest = mf
            .load_manifest(table.file_io())
            .await
            .map_err(named("manifest", &mf.manifest_path))?;
        for entry in manifest.entries() {
            if entry.status() == ManifestStatus::Deleted {
                continue;
            }
            let file = entry.data_file();
            let invalid = |what: String| {
                FileKeysError::Other(IceError::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "file '{}' of a natively encrypted table {what}",
                        file.file_path()
                    ),
                ))
            };
            let Some(bytes) = file.key_metadata() else {
                return Err(invalid("has no key metadata (written unencrypted)".into()));
            };
            let m = StandardKeyMetadata::decode(bytes)
                .map_err(|e| invalid(format!("has key metadata that does not parse: {e}")))?;
            keys.insert(
                file.file_path().to_owned(),
                FileKey {
                    key: SecretKey::from_bytes(m.encryption_key().as_bytes().to_vec()),
                    aad_prefix: m.aad_prefix().unwrap_or_default().to_vec(),
                },
            );
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The keyring, counting its unwraps.
    #[derive(Debug)]
    struct Counting(clearice_crypto::KeyringKms, AtomicUsize);

    #[async_trait]
    impl Kms for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        async fn wrap_key(&self, key: &[u8], id: &str) -> clearice_crypto::Result<String> {
            self.0.wrap_key(key, id).await
        }
        async fn unwrap_key(&self, wrapped: &str, id: &str) -> clearice_crypto::Result<SecretKey> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.unwrap_key(wrapped, id).await
        }
    }

    #[tokio::test]
    async fn unwrapped_table_keys_are_asked_for_again_after_the_cache_ttl() {
        for (ttl, calls) in [
            (std::time::Duration::ZERO, 2),
            (std::time::Duration::from_secs(3600), 1),
        ] {
            let kms = Arc::new(Counting(
                clearice_crypto::KeyringKms::from_keys([(
                    "t".to_owned(),
                    SecretKey::from_bytes(vec![7; 16]),
                )]),
                AtomicUsize::new(0),
            ));
            let wrapped = BASE64_STANDARD
                .decode(kms.wrap_key(&[1; 16], "t").await.unwrap())
                .unwrap();
            let table_kms = TableKms::new(Arc::clone(&kms) as Arc<dyn Kms>, ttl);
            for _ in 0..2 {
                let k = table_kms.unwrap_key(&wrapped, "t").await.unwrap();
                assert_eq!(k.as_bytes(), &[1; 16]);
            }
            assert_eq!(kms.1.load(Ordering::SeqCst), calls, "ttl {ttl:?}");
        }
    }
}
