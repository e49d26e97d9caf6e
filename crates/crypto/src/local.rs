//! The `local` crypto provider: AES-GCM and AES-CTR in process, keys from the configured
//! KMS (key-tools material, external side files, explicit keys) through [`KeyResolver`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::aes::{NONCE_LEN, random_nonce};
use crate::modules::{ModuleCipher, ModuleError, ModulePosition};
use crate::provider::{
    CallContext, CryptoProvider, KeyAccess, KeyRef, Module, ModuleBatch, ProviderError,
};
use crate::resolver::{FileKeyRetriever, KeyResolver, RetrieverCache, SideFileReader};
use crate::secret::SecretKey;

/// In-process provider. KMS calls and side-file reads run on tokio's blocking pool.
pub struct LocalProvider {
    retrievers: RetrieverCache,
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider")
            .field("resolver", self.retrievers.resolver())
            .finish_non_exhaustive()
    }
}

impl LocalProvider {
    /// A provider resolving keys through `resolver`, reading external key material with
    /// `side_files`.
    pub fn new(resolver: Arc<KeyResolver>, side_files: Option<SideFileReader>) -> Self {
        Self {
            retrievers: RetrieverCache::new(resolver, side_files),
        }
    }

    /// The key resolver (for KMS request accounting).
    pub fn resolver(&self) -> &Arc<KeyResolver> {
        self.retrievers.resolver()
    }

    fn retriever(&self, file: &str) -> Arc<FileKeyRetriever> {
        self.retrievers.get(file)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
    ) -> Result<T, ProviderError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| ProviderError::Unavailable {
                provider: self.name().into(),
                reason: format!("key task failed: {e}"),
            })?
    }

    async fn key(&self, ctx: &CallContext, key: &KeyRef) -> Result<SecretKey, ProviderError> {
        let retriever = self.retriever(&ctx.file);
        let metadata = key.key_metadata.clone();
        // A side file is read on the blocking pool (once per file); the KMS is called on
        // this task, asynchronously.
        if retriever.may_block(&metadata) {
            let (r, m) = (Arc::clone(&retriever), metadata.clone());
            self.blocking(move || Ok(r.describe(&m).map(drop)?)).await?;
        }
        Ok(retriever.resolve(&metadata).await?)
    }
}

#[async_trait::async_trait]
impl CryptoProvider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    async fn describe_key(
        &self,
        ctx: &CallContext,
        key_metadata: Bytes,
    ) -> Result<KeyRef, ProviderError> {
        let retriever = self.retriever(&ctx.file);
        // Internal key material and explicit keys are described in place; a side file to
        // read goes to the blocking pool.
        let in_place = !retriever.may_block(&key_metadata);
        let describe = move || {
            let info = retriever.describe(&key_metadata)?;
            Ok(KeyRef {
                key_metadata,
                master_key: info.material.is_some(),
                key_id: info.key_id,
                is_footer_key: info.is_footer_key,
            })
        };
        if in_place {
            return describe();
        }
        self.blocking(describe).await
    }

    async fn decrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Bytes>, ProviderError> {
        let plains = self
            .each_module(ctx, &batch, |c, m| {
                c.decrypt(batch.algorithm, m.position.kind, &m.aad, &m.data)
            })
            .await?;
        Ok(plains.into_iter().map(Bytes::from).collect())
    }

    async fn encrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Vec<u8>>, ProviderError> {
        self.each_module(ctx, &batch, |c, m| {
            let nonce = m.nonce.unwrap_or_else(random_nonce);
            c.encrypt(batch.algorithm, m.position.kind, &m.aad, &nonce, &m.data)
        })
        .await
    }

    async fn check_access(
        &self,
        _ctx: &CallContext,
        key_ids: &[String],
    ) -> Result<BTreeMap<String, KeyAccess>, ProviderError> {
        // The local KMS decides nothing per principal (the policy does): a key is usable
        // when the KMS holds it, or may (a remote KMS answers only when asked).
        Ok(key_ids
            .iter()
            .map(|k| {
                let access = match self.resolver().has_master_key(k) {
                    Some(false) => KeyAccess::Unknown,
                    _ => KeyAccess::Granted,
                };
                (k.clone(), access)
            })
            .collect())
    }

    async fn release_key(
        &self,
        ctx: &CallContext,
        key: &KeyRef,
    ) -> Result<Option<SecretKey>, ProviderError> {
        self.key(ctx, key).await.map(Some)
    }
}

impl LocalProvider {
    /// Decrypts the batch's modules where they lie in `buf`: module `i`'s body
    /// (`nonce || ciphertext [|| tag]`) is `buf[bodies[i]]` (its `data` is not read).
    /// Returns each plaintext's range in `buf`, where its ciphertext was. No other buffer:
    /// the crypto service decrypts a request's modules in the request's own buffer.
    pub async fn decrypt_in_place(
        &self,
        ctx: &CallContext,
        batch: &ModuleBatch,
        buf: &mut [u8],
        bodies: &[Range<usize>],
    ) -> Result<Vec<Range<usize>>, ProviderError> {
        debug_assert_eq!(batch.modules.len(), bodies.len(), "one body per module");
        let cipher = self.cipher(ctx, batch).await?;
        let modules = batch.modules.iter().zip(bodies).enumerate();
        modules
            .map(|(index, (m, body))| {
                let at = body.start + NONCE_LEN;
                let kind = m.position.kind;
                cipher
                    .decrypt_within(batch.algorithm, kind, &m.aad, buf, body.clone(), at)
                    .map(|n| at..at + n)
                    .map_err(|error| invalid(index, m.position, error))
            })
            .collect()
    }

    /// The cipher of the batch's key; a key that is not one is `Invalid` at module 0.
    async fn cipher(
        &self,
        ctx: &CallContext,
        batch: &ModuleBatch,
    ) -> Result<ModuleCipher, ProviderError> {
        let key = self.key(ctx, &batch.key).await?;
        let first = batch
            .modules
            .first()
            .map_or_else(ModulePosition::footer, |m| m.position);
        ModuleCipher::new(key.expose()).map_err(|e| invalid(0, first, e))
    }

    /// Runs `f` on every module of the batch with the batch key's cipher; a failure is
    /// `Invalid`, with the module's index and position.
    async fn each_module(
        &self,
        ctx: &CallContext,
        batch: &ModuleBatch,
        f: impl Fn(&ModuleCipher, &Module) -> Result<Vec<u8>, ModuleError>,
    ) -> Result<Vec<Vec<u8>>, ProviderError> {
        let cipher = self.cipher(ctx, batch).await?;
        batch
            .modules
            .iter()
            .enumerate()
            .map(|(index, m)| f(&cipher, m).map_err(|e| invalid(index, m.position, e)))
            .collect()
    }
}

fn invalid(index: usize, position: ModulePosition, error: ModuleError) -> ProviderError {
    ProviderError::Invalid {
        index,
        position,
        error,
    }
}
