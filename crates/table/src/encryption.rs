//! DataFusion [`EncryptionFactory`] that decrypts every Parquet file through the
//! ClearIce [`KeyResolver`] (PME key material, KMS, explicit keys).

use std::sync::Arc;

use clearice_crypto::{KeyResolver, KeyScope, SideFileReader};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::EncryptionFactoryOptions;
use datafusion::error::Result;
use datafusion::execution::parquet_encryption::EncryptionFactory;
use object_store::path::Path;
use parquet::encryption::decrypt::FileDecryptionProperties;
use parquet::encryption::encrypt::FileEncryptionProperties;

/// Id under which the factory is registered in the runtime (`crypto.factory_id`).
pub const ENCRYPTION_FACTORY_ID: &str = "clearice";

/// Builds per-file decryption properties with a key retriever bound to the file.
#[derive(Debug)]
pub struct PmeEncryptionFactory {
    resolver: Arc<KeyResolver>,
    scope: KeyScope,
}

impl PmeEncryptionFactory {
    /// A factory over `resolver` that may resolve every key.
    pub fn new(resolver: Arc<KeyResolver>) -> Self {
        Self {
            resolver,
            scope: KeyScope::All,
        }
    }

    /// Restricts which keys the factory's retrievers resolve.
    pub fn with_scope(mut self, scope: KeyScope) -> Self {
        self.scope = scope;
        self
    }
}

/// Reads side files (external key material) from the local filesystem.
#[expect(
    clippy::disallowed_methods,
    reason = "parquet-rs's key retriever is synchronous and is called where the footer is \
              decoded; a small side file read there is the known exception until ClearIce's \
              own decrypting reader (async crypto provider) replaces it"
)]
pub fn local_side_file_reader() -> SideFileReader {
    Arc::new(|path: &str| match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    })
}

#[async_trait::async_trait]
impl EncryptionFactory for PmeEncryptionFactory {
    async fn get_file_encryption_properties(
        &self,
        _config: &EncryptionFactoryOptions,
        _schema: &SchemaRef,
        _file_path: &Path,
    ) -> Result<Option<Arc<FileEncryptionProperties>>> {
        // COPY TO / INSERT into listing tables write plaintext, as without ClearIce;
        // encrypted writes go through the Iceberg write path with the policy's keys.
        Ok(None)
    }

    async fn get_file_decryption_properties(
        &self,
        _config: &EncryptionFactoryOptions,
        file_path: &Path,
    ) -> Result<Option<Arc<FileDecryptionProperties>>> {
        // Object store paths are relative to the store root; on the local store that is `/`.
        let file = format!("/{file_path}");
        let retriever = self.resolver.scoped_retriever(
            file,
            Some(local_side_file_reader()),
            self.scope.clone(),
        );
        Ok(Some(
            FileDecryptionProperties::with_key_retriever(retriever).build()?,
        ))
    }
}

/// Master key id of each column of a local Parquet file: `Some(id)` for columns under
/// their own key (from the key material), `None` for plaintext columns or columns under
/// the footer key. Only the footer key is unwrapped; column keys are not requested.
#[expect(
    clippy::disallowed_methods,
    reason = "synchronous; policy check calls it on a blocking thread"
)]
pub fn file_column_master_keys(
    resolver: &Arc<KeyResolver>,
    path: &std::path::Path,
) -> std::result::Result<Vec<(String, Option<String>)>, String> {
    use parquet::file::column_crypto_metadata::ColumnCryptoMetaData;
    let file = std::fs::File::open(path).map_err(|e| format!("'{}': {e}", path.display()))?;
    let scope = KeyScope::MasterKeys(Default::default());
    let retriever = resolver.scoped_retriever(
        path.display().to_string(),
        Some(local_side_file_reader()),
        scope,
    );
    let props = FileDecryptionProperties::with_key_retriever(retriever)
        .build()
        .map_err(|e| e.to_string())?;
    let md = parquet::file::metadata::ParquetMetaDataReader::new()
        .with_decryption_properties(Some(props))
        .parse_and_finish(&file)
        .map_err(|e| format!("'{}': {e}", path.display()))?;
    let Some(rg) = md.row_groups().first() else {
        return Ok(vec![]);
    };
    Ok(rg
        .columns()
        .iter()
        .map(|c| {
            let key = match c.crypto_metadata() {
                Some(ColumnCryptoMetaData::ENCRYPTION_WITH_COLUMN_KEY(k)) => k
                    .key_metadata
                    .as_deref()
                    .and_then(|m| clearice_crypto::KeyMaterial::parse(m, None).ok().flatten())
                    .map(|m| m.master_key_id)
                    .or_else(|| Some("<explicit key>".into())),
                _ => None,
            };
            (c.column_path().string(), key)
        })
        .collect())
}
