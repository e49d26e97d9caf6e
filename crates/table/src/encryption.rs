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

    /// The resolver (for tests and metrics).
    pub fn resolver(&self) -> &Arc<KeyResolver> {
        &self.resolver
    }
}

/// Reads side files (external key material) from the local filesystem.
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
        let retriever = self
            .resolver
            .retriever_for_file(file, Some(local_side_file_reader()));
        Ok(Some(
            FileDecryptionProperties::with_key_retriever(retriever).build()?,
        ))
    }
}
