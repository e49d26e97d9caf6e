//! Several providers behind one: the policy says which provider protects each column
//! (`provider = "NAME"`), so a table may mix local and remote columns. Keys are routed by
//! their master key id; keys without a route go to the table's provider.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::provider::{
    CallContext, CryptoProvider, KeyAccess, KeyRef, ModuleBatch, ProviderError, ProviderRef,
};
use crate::secret::SecretKey;

/// The configured providers by name; `local` is always there.
#[derive(Debug, Clone)]
pub struct Providers {
    by_name: BTreeMap<String, ProviderRef>,
}

/// The name of the in-process provider.
pub const LOCAL: &str = "local";

impl Providers {
    /// `local` plus the named ones.
    pub fn new(local: ProviderRef, named: impl IntoIterator<Item = (String, ProviderRef)>) -> Self {
        let mut by_name: BTreeMap<_, _> = named.into_iter().collect();
        by_name.insert(LOCAL.into(), local);
        Self { by_name }
    }

    /// The `local` provider.
    pub fn local(&self) -> &ProviderRef {
        &self.by_name[LOCAL]
    }

    /// A provider by name.
    pub fn get(&self, name: &str) -> Option<&ProviderRef> {
        self.by_name.get(name)
    }

    /// Names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// A provider routing master key ids in `routes` to the named providers, and every
    /// other key to `default`. Unknown names fall back to `local` (the engine validates
    /// names when it loads the policy).
    pub fn routed(&self, default: &str, routes: &BTreeMap<String, String>) -> ProviderRef {
        let pick = |n: &str| Arc::clone(self.get(n).unwrap_or_else(|| self.local()));
        if routes.values().all(|p| p == default) {
            return pick(default);
        }
        Arc::new(RoutedProvider {
            default: pick(default),
            routes: routes.iter().map(|(k, p)| (k.clone(), pick(p))).collect(),
        })
    }
}

/// Routes each key to its provider.
#[derive(Debug)]
pub struct RoutedProvider {
    default: ProviderRef,
    routes: BTreeMap<String, ProviderRef>,
}

impl RoutedProvider {
    fn for_key(&self, key_id: &str) -> &ProviderRef {
        self.routes.get(key_id).unwrap_or(&self.default)
    }
}

#[async_trait::async_trait]
impl CryptoProvider for RoutedProvider {
    fn name(&self) -> &str {
        self.default.name()
    }

    async fn describe_key(
        &self,
        ctx: &CallContext,
        key_metadata: Bytes,
    ) -> Result<KeyRef, ProviderError> {
        // Key metadata names its master key: read it, then let the key's own provider
        // describe it (a remote one inlines external key material).
        let key = self.default.describe_key(ctx, key_metadata.clone()).await?;
        let owner = self.for_key(&key.key_id);
        if Arc::ptr_eq(owner, &self.default) {
            return Ok(key);
        }
        owner.describe_key(ctx, key_metadata).await
    }

    async fn decrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Bytes>, ProviderError> {
        self.for_key(&batch.key.key_id).decrypt(ctx, batch).await
    }

    async fn encrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Vec<u8>>, ProviderError> {
        self.for_key(&batch.key.key_id).encrypt(ctx, batch).await
    }

    async fn check_access(
        &self,
        ctx: &CallContext,
        key_ids: &[String],
    ) -> Result<BTreeMap<String, KeyAccess>, ProviderError> {
        let mut groups: Vec<(&ProviderRef, Vec<String>)> = Vec::new();
        for k in key_ids {
            let p = self.for_key(k);
            match groups.iter_mut().find(|(q, _)| Arc::ptr_eq(q, p)) {
                Some((_, ks)) => ks.push(k.clone()),
                None => groups.push((p, vec![k.clone()])),
            }
        }
        let mut out = BTreeMap::new();
        for (p, ks) in groups {
            out.extend(p.check_access(ctx, &ks).await?);
        }
        Ok(out)
    }

    async fn new_data_key(
        &self,
        ctx: &CallContext,
        master_key_id: &str,
        is_footer_key: bool,
    ) -> Result<crate::provider::NewDataKey, ProviderError> {
        self.for_key(master_key_id)
            .new_data_key(ctx, master_key_id, is_footer_key)
            .await
    }

    async fn wrap_key(
        &self,
        ctx: &CallContext,
        key: &[u8],
        wrapping_key_id: &str,
    ) -> Result<Vec<u8>, ProviderError> {
        self.for_key(wrapping_key_id)
            .wrap_key(ctx, key, wrapping_key_id)
            .await
    }

    async fn unwrap_key(
        &self,
        ctx: &CallContext,
        wrapped: &[u8],
        wrapping_key_id: &str,
    ) -> Result<SecretKey, ProviderError> {
        self.for_key(wrapping_key_id)
            .unwrap_key(ctx, wrapped, wrapping_key_id)
            .await
    }

    async fn release_key(
        &self,
        ctx: &CallContext,
        key: &KeyRef,
    ) -> Result<Option<SecretKey>, ProviderError> {
        self.for_key(&key.key_id).release_key(ctx, key).await
    }
}
