//! Turns PME key metadata into data keys: KMS unwrap of KEKs behind a TTL cache,
//! local DEK decryption, external (side file) key material and explicit keys.
//!
//! ```text
//!  reader ──key metadata──▶ FileKeyRetriever ──▶ KeyResolver ──unwrap KEK──▶ Kms (async)
//!                                 (per file: DEK      (process: KEK cache,
//!                                  cache, side file)   explicit keys)
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use parquet::encryption::decrypt::KeyRetriever;
use parquet::errors::ParquetError;

use crate::aes;
use crate::error::{Error, Result};
use crate::key_material::{KeyMaterial, side_file_name};
use crate::kms::Kms;
use crate::secret::SecretKey;

/// Reads a side file next to a data file; `Ok(None)` when it does not exist.
pub type SideFileReader = Arc<dyn Fn(&str) -> std::io::Result<Option<Vec<u8>>> + Send + Sync>;

/// Which keys a file's retriever may resolve.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyScope {
    /// Every key the file names (no policy, or a principal allowed to decrypt files).
    #[default]
    All,
    /// The footer key and column keys under these master key ids; others are refused
    /// without asking the KMS (their columns' metadata stays encrypted).
    MasterKeys(std::collections::BTreeSet<String>),
    /// Every key except column keys under these master key ids (used only by columns
    /// the query does not read).
    Except(std::collections::BTreeSet<String>),
    /// The footer key and, for each column, only the master key the policy declares
    /// for that column: a column encrypted under another key, or one the policy does
    /// not declare, stays encrypted even when its key is one another column may use.
    Columns(ColumnKeys),
    /// No key at all, with the reason shown in the error.
    None(String),
}

/// The master key each column a scan reads may use, by its top-level Iceberg field id
/// (what a file written with field ids names) or, for a file without field ids, by its
/// top-level name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColumnKeys {
    /// Field id → master key id.
    pub by_field_id: std::collections::BTreeMap<i32, String>,
    /// Column name → master key id.
    pub by_name: std::collections::BTreeMap<String, String>,
}

/// Default lifetime of cached KEKs.
pub const DEFAULT_KEY_CACHE_TTL: Duration = Duration::from_secs(600);

/// Process-wide key resolution: the KMS, the KEK cache and explicit keys.
pub struct KeyResolver {
    kms: Option<Arc<dyn Kms>>,
    explicit: HashMap<String, SecretKey>,
    ttl: Duration,
    keks: Mutex<HashMap<(String, String), (SecretKey, Instant)>>,
    kms_unwraps: AtomicU64,
    unwraps_by_key: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for KeyResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.explicit.keys().collect();
        ids.sort();
        f.debug_struct("KeyResolver")
            .field("kms", &self.kms)
            .field("explicit_key_ids", &ids)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl KeyResolver {
    /// A resolver over `kms` (None: only explicit keys) with KEK cache lifetime `ttl`.
    pub fn new(
        kms: Option<Arc<dyn Kms>>,
        explicit: HashMap<String, SecretKey>,
        ttl: Duration,
    ) -> Self {
        Self {
            kms,
            explicit,
            ttl,
            keks: Mutex::default(),
            kms_unwraps: AtomicU64::new(0),
            unwraps_by_key: Mutex::default(),
        }
    }

    /// Number of KMS unwrap calls made so far (cache misses).
    pub fn kms_unwrap_count(&self) -> u64 {
        self.kms_unwraps.load(Ordering::Relaxed)
    }

    /// KMS unwrap calls made so far for one master key id.
    pub fn kms_unwrap_count_for(&self, master_key_id: &str) -> u64 {
        self.unwraps_by_key
            .lock()
            .expect("counts")
            .get(master_key_id)
            .copied()
            .unwrap_or(0)
    }

    /// Whether the KMS holds a master key (`None` if it cannot tell without a call).
    pub fn has_master_key(&self, master_key_id: &str) -> Option<bool> {
        match &self.kms {
            Some(k) => k.has_master_key(master_key_id),
            None => Some(false),
        }
    }

    /// The KMS, if any.
    pub fn kms(&self) -> Option<&Arc<dyn Kms>> {
        self.kms.as_ref()
    }

    async fn kms_unwrap(&self, wrapped: &str, master_key_id: &str) -> Result<SecretKey> {
        let kms = self.kms.as_ref().ok_or_else(|| Error::UnknownMasterKey {
            kms: "none configured".into(),
            key_id: master_key_id.into(),
        })?;
        let cache_key = (master_key_id.to_owned(), wrapped.to_owned());
        if let Some((key, at)) = self.keks.lock().expect("kek cache").get(&cache_key)
            && at.elapsed() < self.ttl
        {
            clearice_metrics::cache_lookup(clearice_metrics::Cache::KeyEncryptionKey, true);
            return Ok(key.clone());
        }
        clearice_metrics::cache_lookup(clearice_metrics::Cache::KeyEncryptionKey, false);
        self.kms_unwraps.fetch_add(1, Ordering::Relaxed);
        *self
            .unwraps_by_key
            .lock()
            .expect("counts")
            .entry(master_key_id.to_owned())
            .or_default() += 1;
        let key = kms.unwrap_key(wrapped, master_key_id).await?;
        tracing::debug!(master_key_id, "KMS unwrapped a key");
        self.keks
            .lock()
            .expect("kek cache")
            .insert(cache_key, (key.clone(), Instant::now()));
        Ok(key)
    }

    /// Resolves one key material record to its data key.
    pub async fn data_key(&self, m: &KeyMaterial, file: Option<&str>) -> Result<SecretKey> {
        m.check_complete(file)?;
        if !m.double_wrapping {
            return self.kms_unwrap(&m.wrapped_dek, &m.master_key_id).await;
        }
        let (Some(kek_id), Some(wrapped_kek)) = (&m.kek_id, &m.wrapped_kek) else {
            unreachable!("checked by check_complete")
        };
        let kek = self.kms_unwrap(wrapped_kek, &m.master_key_id).await?;
        let bad = |reason: &str| Error::KeyMaterial {
            file: file.map(Into::into),
            reason: reason.into(),
        };
        let aad = BASE64_STANDARD
            .decode(kek_id)
            .map_err(|_| bad("keyEncryptionKeyID is not base64"))?;
        let wrapped_dek = BASE64_STANDARD
            .decode(&m.wrapped_dek)
            .map_err(|_| bad("wrappedDEK is not base64"))?;
        aes::decrypt(kek.expose(), &wrapped_dek, &aad)
            .map(SecretKey::from_bytes)
            .map_err(|_| Error::DataKey {
                key_id: m.master_key_id.clone(),
            })
    }

    /// A key retriever for one data file. `side_files` reads external key material.
    pub fn retriever_for_file(
        self: &Arc<Self>,
        file: impl Into<String>,
        side_files: Option<SideFileReader>,
    ) -> Arc<FileKeyRetriever> {
        self.scoped_retriever(file, side_files, KeyScope::All)
    }

    /// A key retriever for one data file that resolves only the keys in `scope`.
    pub fn scoped_retriever(
        self: &Arc<Self>,
        file: impl Into<String>,
        side_files: Option<SideFileReader>,
        scope: KeyScope,
    ) -> Arc<FileKeyRetriever> {
        Arc::new(FileKeyRetriever {
            resolver: Arc::clone(self),
            file: file.into(),
            side_files,
            scope,
            external: OnceLock::new(),
            deks: Mutex::default(),
        })
    }
}

/// Retrievers kept per file (each caches its side file and data keys).
const RETRIEVER_CACHE: usize = 1024;

/// A bounded cache of per-file retrievers (providers keep one per file they read).
pub struct RetrieverCache {
    resolver: Arc<KeyResolver>,
    side_files: Option<SideFileReader>,
    retrievers: Mutex<HashMap<String, Arc<FileKeyRetriever>>>,
}

impl std::fmt::Debug for RetrieverCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetrieverCache")
            .field("resolver", &self.resolver)
            .finish_non_exhaustive()
    }
}

impl RetrieverCache {
    /// A cache resolving through `resolver`, reading side files with `side_files`.
    pub fn new(resolver: Arc<KeyResolver>, side_files: Option<SideFileReader>) -> Self {
        Self {
            resolver,
            side_files,
            retrievers: Mutex::default(),
        }
    }

    /// The resolver.
    pub fn resolver(&self) -> &Arc<KeyResolver> {
        &self.resolver
    }

    /// The retriever of `file` (all keys in scope: providers check scope themselves).
    pub fn get(&self, file: &str) -> Arc<FileKeyRetriever> {
        let mut map = self.retrievers.lock().expect("retrievers");
        if let Some(r) = map.get(file) {
            return Arc::clone(r);
        }
        if map.len() >= RETRIEVER_CACHE {
            map.clear();
        }
        let r = self
            .resolver
            .scoped_retriever(file, self.side_files.clone(), KeyScope::All);
        map.insert(file.to_owned(), Arc::clone(&r));
        r
    }
}

/// Key retriever for one file (parquet-rs calls it per column per row group: keys are
/// cached here so the KMS and AES work happen once per distinct key metadata).
pub struct FileKeyRetriever {
    resolver: Arc<KeyResolver>,
    file: String,
    side_files: Option<SideFileReader>,
    scope: KeyScope,
    external: OnceLock<std::result::Result<HashMap<String, String>, String>>,
    deks: Mutex<HashMap<Vec<u8>, SecretKey>>,
}

impl std::fmt::Debug for FileKeyRetriever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileKeyRetriever")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl FileKeyRetriever {
    fn side_file_path(&self) -> String {
        match self.file.rsplit_once('/') {
            Some((dir, name)) => format!("{dir}/{}", side_file_name(name)),
            None => side_file_name(&self.file),
        }
    }

    fn external_material(&self, reference: &str) -> Result<KeyMaterial> {
        let path = self.side_file_path();
        let map = self.external.get_or_init(|| {
            let reader = self
                .side_files
                .as_ref()
                .ok_or("no reader for side files on this store")?;
            let bytes = reader(&path)
                .map_err(|e| e.to_string())?
                .ok_or("file not found")?;
            serde_json::from_slice::<HashMap<String, String>>(&bytes)
                .map_err(|e| format!("not a JSON object: {e}"))
        });
        let map = map.as_ref().map_err(|reason| Error::ExternalKeyMaterial {
            path: path.clone(),
            reason: reason.clone(),
        })?;
        let text = map
            .get(reference)
            .ok_or_else(|| Error::ExternalKeyMaterial {
                path: path.clone(),
                reason: format!("no key material for reference '{reference}'"),
            })?;
        KeyMaterial::parse(text.as_bytes(), Some(&path))?.ok_or_else(|| {
            Error::ExternalKeyMaterial {
                path,
                reason: format!("entry '{reference}' is not key material"),
            }
        })
    }

    /// What key metadata names: the master key id of key-tools material (internal or,
    /// through the side file, external) or the id of an explicit key. Reads the side file
    /// (blocking) for external material; asks no KMS.
    pub fn describe(&self, key_metadata: &[u8]) -> Result<KeyInfo> {
        Ok(match KeyMaterial::parse(key_metadata, Some(&self.file))? {
            Some(m) => {
                let m = self.internal(m)?;
                KeyInfo {
                    key_id: m.master_key_id.clone(),
                    is_footer_key: m.is_footer_key,
                    material: Some(m),
                }
            }
            None => KeyInfo {
                key_id: String::from_utf8_lossy(key_metadata).into_owned(),
                is_footer_key: false,
                material: None,
            },
        })
    }

    fn internal(&self, m: KeyMaterial) -> Result<KeyMaterial> {
        if m.internal_storage {
            return Ok(m);
        }
        let reference = m.key_reference.clone().ok_or_else(|| Error::KeyMaterial {
            file: Some(self.file.clone()),
            reason: "external key material without keyReference".into(),
        })?;
        self.external_material(&reference)
    }

    /// Whether [`Self::describe`] (and so [`Self::resolve`]) of this key metadata reads a
    /// side file (blocking: do it on a blocking thread first, it is read once per file);
    /// `false` when everything is at hand. KMS calls are asynchronous and never block.
    pub fn may_block(&self, key_metadata: &[u8]) -> bool {
        match KeyMaterial::parse(key_metadata, Some(&self.file)) {
            Ok(Some(m)) if !m.internal_storage => self.external.get().is_none(),
            // Internal material, explicit keys and malformed material: no IO.
            Ok(_) | Err(_) => false,
        }
    }

    /// Resolves key metadata to a key (describing it in place: see [`Self::may_block`]).
    pub async fn resolve(&self, key_metadata: &[u8]) -> Result<SecretKey> {
        if let Some(k) = self.deks.lock().expect("dek cache").get(key_metadata) {
            clearice_metrics::cache_lookup(clearice_metrics::Cache::DataKey, true);
            return Ok(k.clone());
        }
        clearice_metrics::cache_lookup(clearice_metrics::Cache::DataKey, false);
        if let KeyScope::None(reason) = &self.scope {
            return Err(Error::NotRequested {
                key_id: "any".into(),
                reason: reason.clone(),
            });
        }
        let info = self.describe(key_metadata)?;
        self.scope.check(&info)?;
        let key = self.resolve_described(&info).await?;
        self.deks
            .lock()
            .expect("dek cache")
            .insert(key_metadata.to_vec(), key.clone());
        Ok(key)
    }

    /// Resolves a described key (no scope check: the caller made it).
    pub async fn resolve_described(&self, info: &KeyInfo) -> Result<SecretKey> {
        match &info.material {
            Some(m) => self.resolver.data_key(m, Some(&self.file)).await,
            None => self
                .resolver
                .explicit
                .get(&info.key_id)
                .cloned()
                .ok_or_else(|| Error::NoExplicitKey {
                    key_id: info.key_id.clone(),
                }),
        }
    }
}

/// What a file's key metadata names.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    /// Master key id (key-tools material) or explicit key id.
    pub key_id: String,
    /// Whether the material says it is the footer key.
    pub is_footer_key: bool,
    /// The key material (with external material read in), `None` for explicit keys.
    pub material: Option<KeyMaterial>,
}

impl KeyScope {
    /// Whether this scope lets a column key be requested; the footer key always may,
    /// unless the scope is [`KeyScope::None`].
    pub fn check(&self, info: &KeyInfo) -> Result<()> {
        self.check_key(&info.key_id, info.is_footer_key, info.material.is_some())
    }

    /// [`Self::check`] by key id: `footer` for the file's footer key, `master_key` when
    /// the id is a KMS master key id (scopes name master keys; explicit keys pass).
    pub fn check_key(&self, key_id: &str, footer: bool, master_key: bool) -> Result<()> {
        const WHY: &str = "no column this query reads is declared under it in the policy; declare master_key for every encrypted column";
        let refused = match self {
            KeyScope::All => false,
            KeyScope::None(reason) => {
                return Err(Error::NotRequested {
                    key_id: key_id.into(),
                    reason: reason.clone(),
                });
            }
            // Explicit keys have no master key id to declare; scopes name master keys.
            _ if !master_key || footer => false,
            KeyScope::MasterKeys(allowed) => !allowed.contains(key_id),
            KeyScope::Except(refused) => refused.contains(key_id),
            KeyScope::Columns(c) => !c
                .by_field_id
                .values()
                .chain(c.by_name.values())
                .any(|k| k == key_id),
        };
        if refused {
            return Err(Error::NotRequested {
                key_id: key_id.into(),
                reason: WHY.into(),
            });
        }
        Ok(())
    }

    /// Whether the column whose top-level field is `field_id` (`None`: the file has no
    /// field ids) named `name` may use a column key under master key `key_id`. Only
    /// [`KeyScope::Columns`] binds keys to columns; other scopes decide by key alone
    /// ([`Self::check_key`]).
    pub fn check_column(&self, field_id: Option<i32>, name: &str, key_id: &str) -> Result<()> {
        let KeyScope::Columns(c) = self else {
            return Ok(());
        };
        let declared = match field_id {
            Some(id) => c.by_field_id.get(&id),
            None => c.by_name.get(name),
        };
        if declared.is_some_and(|k| k == key_id) {
            return Ok(());
        }
        Err(Error::NotRequested {
            key_id: key_id.into(),
            reason: format!(
                "column '{name}' is not declared under this key in the policy (declare its master_key)"
            ),
        })
    }
}

/// parquet-rs's own, synchronous key hook, for its reader as an oracle (tests and
/// benchmarks compare ClearIce's reader with it). ClearIce's reader never goes through it.
/// A key not yet cached is resolved on a runtime of its own on another thread, so the
/// caller's runtime is never blocked on itself; its side files must be readable there
/// (a plain file reader: an object-store reader that blocks on its own runtime is not).
impl KeyRetriever for FileKeyRetriever {
    fn retrieve_key(&self, key_metadata: &[u8]) -> parquet::errors::Result<Vec<u8>> {
        let named = |e: String| ParquetError::General(format!("file '{}': {e}", self.file));
        if let Some(k) = self.deks.lock().expect("dek cache").get(key_metadata) {
            clearice_metrics::cache_lookup(clearice_metrics::Cache::DataKey, true);
            return Ok(k.expose().to_vec());
        }
        let resolve = || -> std::result::Result<SecretKey, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(self.resolve(key_metadata))
                .map_err(|e| e.to_string())
        };
        std::thread::scope(|s| s.spawn(resolve).join())
            .map_err(|_| named("key resolution panicked".into()))?
            .map(|k| k.expose().to_vec())
            .map_err(named)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use crate::kms::KeyringKms;

    fn resolver() -> Arc<KeyResolver> {
        let kms = KeyringKms::from_json(r#"{"m":"MDEyMzQ1Njc4OTAxMjM0NQ=="}"#).unwrap();
        Arc::new(KeyResolver::new(
            Some(Arc::new(kms)),
            HashMap::new(),
            DEFAULT_KEY_CACHE_TTL,
        ))
    }

    async fn material(r: &KeyResolver, dek: &[u8]) -> String {
        let kek = [9u8; 16];
        let kek_id = [3u8; 16];
        let wrapped_kek = r.kms().unwrap().wrap_key(&kek, "m").await.unwrap();
        let wrapped_dek = aes::encrypt(&kek, &aes::random_nonce(), dek, &kek_id).unwrap();
        format!(
            r#"{{"keyMaterialType":"PKMT1","internalStorage":true,"isFooterKey":false,"masterKeyID":"m","wrappedDEK":"{}","doubleWrapping":true,"keyEncryptionKeyID":"{}","wrappedKEK":"{}"}}"#,
            BASE64_STANDARD.encode(wrapped_dek),
            BASE64_STANDARD.encode(kek_id),
            wrapped_kek
        )
    }

    #[tokio::test]
    async fn double_wrapped_key_resolves_and_kms_is_asked_once() {
        let r = resolver();
        let m = material(&r, b"fedcba9876543210").await;
        let a = r.retriever_for_file("a.parquet", None);
        let b = r.retriever_for_file("b.parquet", None);
        assert_eq!(
            a.resolve(m.as_bytes()).await.unwrap().expose(),
            b"fedcba9876543210"
        );
        assert_eq!(
            a.resolve(m.as_bytes()).await.unwrap().expose(),
            b"fedcba9876543210"
        );
        assert_eq!(
            b.resolve(m.as_bytes()).await.unwrap().expose(),
            b"fedcba9876543210"
        );
        assert_eq!(r.kms_unwrap_count(), 1);
    }

    #[tokio::test]
    async fn external_material_is_read_from_the_side_file() {
        let r = resolver();
        let m = material(&r, b"fedcba9876543210").await;
        let side = serde_json::to_vec(&HashMap::from([("columnKey0".to_string(), m)])).unwrap();
        let reader: SideFileReader = Arc::new(move |p: &str| {
            assert_eq!(p, "/d/_KEY_MATERIAL_FOR_x.parquet.json");
            Ok(Some(side.clone()))
        });
        let ret = r.retriever_for_file("/d/x.parquet", Some(reader));
        let key = ret
            .resolve(br#"{"keyMaterialType":"PKMT1","internalStorage":false,"keyReference":"columnKey0"}"#)
            .await
            .unwrap();
        assert_eq!(key.expose(), b"fedcba9876543210");
    }

    #[tokio::test]
    async fn missing_side_file_is_a_clear_error() {
        let r = resolver();
        let reader: SideFileReader = Arc::new(|_: &str| Ok(None));
        let e = r
            .retriever_for_file("/d/x.parquet", Some(reader))
            .resolve(br#"{"keyMaterialType":"PKMT1","internalStorage":false,"keyReference":"k"}"#)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("_KEY_MATERIAL_FOR_x.parquet.json") && e.contains("not found"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn scoped_retriever_refuses_other_master_keys_without_asking_the_kms() {
        let r = resolver();
        let m = material(&r, b"fedcba9876543210").await;
        let before = r.kms_unwrap_count();
        let scope = KeyScope::MasterKeys(["other".to_string()].into());
        let e = r
            .scoped_retriever("f", None, scope)
            .resolve(m.as_bytes())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("'m'") && e.contains("not requested"), "{e}");
        assert_eq!(r.kms_unwrap_count(), before);
        let scope = KeyScope::MasterKeys(["m".to_string()].into());
        assert!(
            r.scoped_retriever("f", None, scope)
                .resolve(m.as_bytes())
                .await
                .is_ok()
        );
        assert_eq!(r.kms_unwrap_count_for("m"), before + 1);
    }

    #[test]
    fn column_scopes_bind_each_key_to_its_declared_column() {
        let scope = KeyScope::Columns(ColumnKeys {
            by_field_id: [(4, "ssn_key".to_string())].into(),
            by_name: [("ssn".to_string(), "ssn_key".to_string())].into(),
        });
        assert!(scope.check_key("ssn_key", false, true).is_ok());
        assert!(scope.check_key("other", false, true).is_err());
        assert!(scope.check_key("footer", true, true).is_ok());
        assert!(scope.check_column(Some(4), "ssn", "ssn_key").is_ok());
        // Another column under the same key: refused, naming the column.
        let e = scope
            .check_column(Some(5), "tax_id", "ssn_key")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'tax_id'") && e.contains("ssn_key"), "{e}");
        // Field ids decide when the file has them; names only when it has none.
        assert!(scope.check_column(Some(9), "ssn", "ssn_key").is_err());
        assert!(scope.check_column(None, "ssn", "ssn_key").is_ok());
        assert!(scope.check_column(None, "tax_id", "ssn_key").is_err());
        // Other scopes decide by key alone.
        assert!(
            KeyScope::All
                .check_column(Some(5), "tax_id", "ssn_key")
                .is_ok()
        );
    }

    #[tokio::test]
    async fn explicit_key_ids_resolve_and_unknown_ids_are_named() {
        let r = Arc::new(KeyResolver::new(
            None,
            HashMap::from([(
                "kf".to_string(),
                SecretKey::from_bytes(b"0123456789012345".to_vec()),
            )]),
            DEFAULT_KEY_CACHE_TTL,
        ));
        let ret = r.retriever_for_file("f", None);
        assert_eq!(
            ret.resolve(b"kf").await.unwrap().expose(),
            b"0123456789012345"
        );
        let e = ret.resolve(b"kc9").await.unwrap_err().to_string();
        assert!(e.contains("'kc9'"), "{e}");
    }
}
