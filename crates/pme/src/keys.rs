//! Keys: what a scan may decrypt ([`ScanKeys`], [`GivenKeys`]), a key of the file resolved
//! for the scan ([`ColumnKey`]: scope check, then the provider), modules decrypted under one
//! key, and the schema walks that bind each column to the key declared for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use clearice_crypto::{
    Algorithm, CallContext, KeyRef, Module, ModuleBatch, ModuleCipher, ModulePosition,
    ProviderError, ProviderRef, ScanGrant, SecretKey,
};
use parquet::format::{ColumnChunk, ColumnCryptoMetaData, SchemaElement};

use crate::reader::Counters;
use crate::{DecryptError, Result};

/// A scan's [`ScanGrant`] where it is read: the grant as the access layer decided it, the
/// provider it resolved to, and what the reader adds to every provider call.
#[derive(Debug, Clone)]
pub struct ScanKeys {
    /// What the scan may decrypt, and as whom (its scope, principal, token, AAD prefix).
    pub grant: ScanGrant,
    /// Does the cryptography: the grant's provider, else the catalog's.
    pub provider: ProviderRef,
    /// Application context sent with every provider call (`table`, `namespace`...).
    pub application: BTreeMap<String, String>,
    /// Keys given with the table (DataFusion's `format.crypto.file_decryption.*`
    /// options): used as given, before the provider.
    pub given: Option<Arc<GivenKeys>>,
}

impl ScanKeys {
    /// The keys of a scan under `grant`, through the grant's provider or else `fallback`
    /// (the catalog's).
    pub fn new(grant: ScanGrant, fallback: &ProviderRef) -> Self {
        let provider = grant
            .provider
            .clone()
            .unwrap_or_else(|| Arc::clone(fallback));
        Self {
            grant,
            provider,
            application: BTreeMap::new(),
            given: None,
        }
    }

    /// With `application` sent with every provider call.
    pub fn with_application(mut self, application: BTreeMap<String, String>) -> Self {
        self.application = application;
        self
    }

    /// What a provider call about `file` carries: the grant's principal and token.
    pub fn call_context(&self, file: &str) -> CallContext {
        CallContext {
            principal: self.grant.principal.clone(),
            file: file.to_owned(),
            application: self.application.clone(),
            credential: self.grant.credential.clone(),
        }
    }
}

/// A file's own data key and AAD prefix, known from outside the file (Iceberg-native table
/// encryption: the manifest entry's `key_metadata`). The file is uniform PME under it
/// (the footer key; its columns under the footer key), with the prefix not stored.
#[derive(Clone)]
pub struct FileKey {
    /// The data key.
    pub key: SecretKey,
    /// The AAD prefix.
    pub aad_prefix: Vec<u8>,
}

impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileKey(<redacted>)")
    }
}

/// Keys of each file of a scan by its path in the store.
pub type FileKeys = HashMap<String, FileKey>;

impl ScanKeys {
    /// The keys of a file whose own key is `key`: it decrypts the footer and the columns
    /// under it, with its AAD prefix; column keys the file names go through the grant.
    pub(crate) fn for_file(&self, key: &FileKey) -> Self {
        let mut keys = self.clone();
        keys.given = Some(Arc::new(GivenKeys {
            footer: Some(key.key.clone()),
            columns: HashMap::new(),
            verify_signature: true,
            require_encryption: true,
        }));
        keys.grant.aad_prefix = Some(key.aad_prefix.clone());
        keys
    }
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
    /// A file without encryption is refused (its table says it has a key: a plaintext
    /// file in its place is forged).
    pub require_encryption: bool,
}

impl GivenKeys {
    pub(crate) fn cipher(
        &self,
        key: &SecretKey,
        metadata: &[u8],
    ) -> Result<Arc<ColumnKey>, ProviderError> {
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

/// A key of the file, resolved for this scan.
pub(crate) struct ColumnKey {
    pub(crate) key: KeyRef,
    /// The data key, when the provider releases it.
    pub(crate) cipher: Option<ModuleCipher>,
}

/// One file of a scan as its keys are resolved and its modules decrypted: its name (in
/// errors and provider calls), the scan's keys and its reader's counters. Cloned into the
/// tasks that decrypt column chunks ahead of the reader.
#[derive(Clone)]
pub(crate) struct FileDecryptor {
    pub(crate) file: String,
    pub(crate) keys: Arc<ScanKeys>,
    pub(crate) counters: Counters,
}

/// Reported instead of a master key id for columns under explicit keys.
pub const EXPLICIT_KEY: &str = "<explicit key>";

impl FileDecryptor {
    pub(crate) fn malformed(&self, reason: impl Into<String>) -> DecryptError {
        DecryptError::Malformed {
            file: self.file.clone(),
            reason: reason.into(),
        }
    }

    pub(crate) fn ctx(&self) -> CallContext {
        self.keys.call_context(&self.file)
    }

    /// Resolves a key named by the file for this scan: scope check, then the provider.
    pub(crate) async fn key(
        &self,
        metadata: &[u8],
        footer: bool,
    ) -> std::result::Result<Arc<ColumnKey>, ProviderError> {
        let key = self.describe(metadata).await?;
        self.grant(key, footer).await
    }

    pub(crate) async fn describe(
        &self,
        metadata: &[u8],
    ) -> std::result::Result<KeyRef, ProviderError> {
        self.counters.provider_calls.add(1);
        self.keys
            .provider
            .describe_key(&self.ctx(), Bytes::copy_from_slice(metadata))
            .await
    }

    pub(crate) async fn grant(
        &self,
        key: KeyRef,
        footer: bool,
    ) -> std::result::Result<Arc<ColumnKey>, ProviderError> {
        self.keys
            .grant
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
    pub(crate) async fn decrypt(
        &self,
        key: &ColumnKey,
        algorithm: Algorithm,
        column: Option<&str>,
        modules: Vec<Module>,
    ) -> Result<Vec<Bytes>> {
        self.counters.modules.add(modules.len());
        if let Some(cipher) = &key.cipher {
            return modules
                .iter()
                .map(|m| {
                    cipher
                        .decrypt(algorithm, m.position.kind, &m.aad, &m.data)
                        .map(Bytes::from)
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

    pub(crate) fn module(
        &self,
        file_aad: &[u8],
        position: ModulePosition,
        data: Bytes,
    ) -> Result<Module> {
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
}

pub(crate) fn column_path(chunk: &ColumnChunk) -> String {
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
pub(crate) fn top_level_fields(schema: &[SchemaElement]) -> Vec<(Option<i32>, String)> {
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
pub(crate) fn leaf_types(schema: &[SchemaElement]) -> Vec<parquet::format::Type> {
    schema
        .iter()
        .skip(1)
        .filter(|e| e.num_children.unwrap_or(0) == 0)
        .map(|e| e.type_.unwrap_or(parquet::format::Type::BYTE_ARRAY))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
