//! What one scan may decrypt, and as whom: decided once by the access layer, read as is
//! by the decrypting reader, sent as is (serialized, then signed) to a worker.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AccessToken, KeyScope, ProviderRef, Providers};

/// One scan's grant: the principal, the keys it may request (per column), the AAD prefix
/// of files that do not store theirs, and the crypto provider doing the work.
///
/// Key ids and decisions only, never key bytes. The resolved provider never leaves the
/// process (a worker resolves [`ScanGrant::route`] with its own providers), and the
/// principal's own provider token is not serialized with the grant: the cluster layer
/// sends it to workers sealed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanGrant {
    /// The principal (sent to the crypto provider, shown in messages).
    pub principal: String,
    /// The principal's own provider token (a Flight client's `key_access_token`).
    #[serde(skip)]
    pub credential: Option<AccessToken>,
    /// Keys the scan may request.
    pub scope: KeyScope,
    /// AAD prefix for files that do not store theirs (policy `aad_prefix`).
    pub aad_prefix: Option<Vec<u8>>,
    /// The table's provider by name, and keys routed elsewhere; `None`: the catalog's.
    pub route: Option<ProviderRoute>,
    /// The provider [`ScanGrant::route`] resolves to here; `None`: the catalog's.
    #[serde(skip)]
    pub provider: Option<ProviderRef>,
    /// Master key of each protected column, by column name (the policy's): equality
    /// deletes on a column need its key even where the query does not read it.
    pub column_keys: BTreeMap<String, String>,
}

/// A table's crypto provider by name, with the master keys the policy routes to others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRoute {
    /// The table's provider (policy `provider`).
    pub name: String,
    /// Master key id → provider name, for keys routed elsewhere.
    pub routes: BTreeMap<String, String>,
}

impl ScanGrant {
    /// The grant of a scan outside any policy: every key, no principal, the catalog's
    /// provider. Spelled out (there is no `Default`), so no grant widens to every key by
    /// a forgotten field.
    pub fn unrestricted() -> Self {
        Self {
            principal: String::new(),
            credential: None,
            scope: KeyScope::All,
            aad_prefix: None,
            route: None,
            provider: None,
            column_keys: BTreeMap::new(),
        }
    }

    /// The same grant, limited to `scope`.
    pub fn with_scope(&self, scope: KeyScope) -> Self {
        Self {
            scope,
            ..self.clone()
        }
    }

    /// The grant with its provider resolved by `providers` (a worker's): the route's
    /// provider, or none (the catalog's) without a route. `Err(name)` when the route
    /// names a provider `providers` does not have (a worker configured apart from its
    /// coordinator): the scan fails rather than ask another provider for the keys.
    pub fn resolved(mut self, providers: &Providers) -> Result<Self, String> {
        if let Some(r) = &self.route {
            if let Some(missing) = std::iter::once(&r.name)
                .chain(r.routes.values())
                .find(|n| providers.get(n).is_none())
            {
                return Err(missing.clone());
            }
            self.provider = Some(providers.routed(&r.name, &r.routes));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{DEFAULT_KEY_CACHE_TTL, KeyResolver, LocalProvider};

    #[test]
    fn a_route_to_a_provider_this_side_does_not_have_is_refused() {
        let resolver = Arc::new(KeyResolver::new(
            None,
            Default::default(),
            DEFAULT_KEY_CACHE_TTL,
        ));
        let providers = Providers::new(Arc::new(LocalProvider::new(resolver, None)), []);
        let grant = |name: &str, routes: &[(&str, &str)]| ScanGrant {
            route: Some(ProviderRoute {
                name: name.into(),
                routes: routes
                    .iter()
                    .map(|(k, p)| ((*k).to_owned(), (*p).to_owned()))
                    .collect(),
            }),
            ..ScanGrant::unrestricted()
        };
        assert!(
            grant("local", &[])
                .resolved(&providers)
                .unwrap()
                .provider
                .is_some()
        );
        assert_eq!(
            grant("vault", &[]).resolved(&providers).unwrap_err(),
            "vault"
        );
        assert_eq!(
            grant("local", &[("pii_key", "vault")])
                .resolved(&providers)
                .unwrap_err(),
            "vault"
        );
        // No route: the catalog's provider, decided where the scan runs.
        assert!(
            ScanGrant::unrestricted()
                .resolved(&providers)
                .unwrap()
                .provider
                .is_none()
        );
    }
}
