//! KMS clients: the [`Kms`] trait and the embedded keyring KMS.
//!
//! The keyring wrap format is the interop contract with PyArrow and parquet-java
//! (`KeyToolkit` local wrapping): `base64(nonce(12) || AES-GCM(master key, nonce, key,
//! aad = master key id) || tag(16))`.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;

use crate::aes;
use crate::error::{Error, Result};
use crate::secret::SecretKey;

/// A key management service that wraps and unwraps keys under master keys it holds.
///
/// Asynchronous, as iceberg-rust's `KeyManagementClient` is: a remote KMS (AWS KMS) is an
/// HTTP call on the caller's runtime, through one pooled client per KMS. The embedded
/// keyring answers at once. The resolver's KEK cache asks once per master key and KEK.
#[async_trait::async_trait]
pub trait Kms: Send + Sync + std::fmt::Debug {
    /// Name used in error messages (e.g. `keyring`).
    fn name(&self) -> &str;
    /// Wraps `key` under master key `master_key_id`; the result is text (base64).
    async fn wrap_key(&self, key: &[u8], master_key_id: &str) -> Result<String>;
    /// Unwraps a key wrapped by [`Kms::wrap_key`].
    async fn unwrap_key(&self, wrapped: &str, master_key_id: &str) -> Result<SecretKey>;
    /// Whether the KMS holds `master_key_id`, when it can tell without a call
    /// (`None`: unknown until an unwrap is tried).
    fn has_master_key(&self, master_key_id: &str) -> Option<bool> {
        let _ = master_key_id;
        None
    }
}

/// Master keys in a JSON object file `{"<id>": "<base64 of 16, 24 or 32 bytes>"}`. A key
/// that was rotated (`clearice keys rotate`) holds its versions, oldest first:
/// `{"<id>": ["<base64 v1>", "<base64 v2>"]}`. Wrapping uses the newest version;
/// unwrapping tries the newest first, then older ones (AES-GCM tells which one wrapped).
pub struct KeyringKms {
    keys: HashMap<String, Vec<SecretKey>>,
}

impl std::fmt::Debug for KeyringKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("KeyringKms")
            .field("master_key_ids", &ids)
            .finish()
    }
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Versions {
    One(String),
    Many(Vec<String>),
}

impl KeyringKms {
    /// Loads a keyring file (blocking: async callers run it on a blocking thread).
    #[expect(
        clippy::disallowed_methods,
        reason = "a synchronous loader; Engine::open calls it on a blocking thread"
    )]
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Keyring {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_json(&text).map_err(|reason| Error::Keyring {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Parses keyring JSON; the error names the key id, never the key.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let map: HashMap<String, Versions> = serde_json::from_str(text)
            .map_err(|e| format!("not a JSON object of base64 strings (or arrays of them): {e}"))?;
        let mut keys = HashMap::with_capacity(map.len());
        for (id, versions) in map {
            let versions = match versions {
                Versions::One(v) => vec![v],
                Versions::Many(v) => v,
            };
            if versions.is_empty() {
                return Err(format!("master key '{id}' has no versions"));
            }
            let mut out = Vec::with_capacity(versions.len());
            for b64 in versions {
                let bytes = BASE64_STANDARD
                    .decode(b64.trim())
                    .map_err(|_| format!("master key '{id}' is not valid base64"))?;
                if !matches!(bytes.len(), 16 | 24 | 32) {
                    return Err(format!(
                        "master key '{id}' has {} bytes; expected 16, 24 or 32",
                        bytes.len()
                    ));
                }
                out.push(SecretKey::from_bytes(bytes));
            }
            keys.insert(id, out);
        }
        Ok(Self { keys })
    }

    /// Builds a keyring from id/key pairs (tests, demo).
    pub fn from_keys(keys: impl IntoIterator<Item = (String, SecretKey)>) -> Self {
        Self {
            keys: keys.into_iter().map(|(k, v)| (k, vec![v])).collect(),
        }
    }

    /// Serializes the keyring as its JSON file format.
    pub fn to_json(&self) -> String {
        let map: std::collections::BTreeMap<_, serde_json::Value> = self
            .keys
            .iter()
            .map(|(k, v)| {
                let mut b64: Vec<serde_json::Value> = v
                    .iter()
                    .map(|key| BASE64_STANDARD.encode(key.expose()).into())
                    .collect();
                let value = if b64.len() == 1 {
                    b64.remove(0)
                } else {
                    serde_json::Value::Array(b64)
                };
                (k.clone(), value)
            })
            .collect();
        serde_json::to_string_pretty(&map).expect("string map serializes")
    }

    /// Master key ids held.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Adds a new version of master key `id` (same length as the current one): new wraps
    /// use it, older versions still unwrap. Returns the number of versions.
    pub fn rotate(&mut self, id: &str) -> Result<usize> {
        let versions = self
            .keys
            .get_mut(id)
            .ok_or_else(|| Error::UnknownMasterKey {
                kms: "keyring".into(),
                key_id: id.into(),
            })?;
        let len = versions.last().map_or(32, SecretKey::len);
        let mut bytes = vec![0u8; len];
        rand::Rng::fill(&mut rand::rng(), bytes.as_mut_slice());
        versions.push(SecretKey::from_bytes(bytes));
        Ok(versions.len())
    }

    fn versions(&self, id: &str) -> Result<&[SecretKey]> {
        self.keys
            .get(id)
            .map(Vec::as_slice)
            .ok_or_else(|| Error::UnknownMasterKey {
                kms: self.name().into(),
                key_id: id.into(),
            })
    }
}

#[async_trait::async_trait]
impl Kms for KeyringKms {
    fn name(&self) -> &str {
        "keyring"
    }

    async fn wrap_key(&self, key: &[u8], master_key_id: &str) -> Result<String> {
        let master = self
            .versions(master_key_id)?
            .last()
            .expect("versions are never empty");
        let out = aes::encrypt(
            master.expose(),
            &aes::random_nonce(),
            key,
            master_key_id.as_bytes(),
        )
        .map_err(|_| Error::Wrap {
            kms: self.name().into(),
            key_id: master_key_id.into(),
        })?;
        Ok(BASE64_STANDARD.encode(out))
    }

    fn has_master_key(&self, master_key_id: &str) -> Option<bool> {
        Some(self.keys.contains_key(master_key_id))
    }

    async fn unwrap_key(&self, wrapped: &str, master_key_id: &str) -> Result<SecretKey> {
        let versions = self.versions(master_key_id)?;
        let err = || Error::Unwrap {
            kms: self.name().into(),
            key_id: master_key_id.into(),
        };
        let data = BASE64_STANDARD.decode(wrapped.trim()).map_err(|_| err())?;
        versions
            .iter()
            .rev()
            .find_map(|master| aes::decrypt(master.expose(), &data, master_key_id.as_bytes()).ok())
            .map(SecretKey::from_bytes)
            .ok_or_else(err)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    fn keyring() -> KeyringKms {
        KeyringKms::from_json(
            r#"{"k16":"MDEyMzQ1Njc4OTAxMjM0NQ==","k24":"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIz"}"#,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn wrap_then_unwrap_round_trips_for_128_and_192_bit_masters() {
        let kms = keyring();
        for id in ["k16", "k24"] {
            let w = kms.wrap_key(b"0123456789abcdef", id).await.unwrap();
            assert_eq!(
                kms.unwrap_key(&w, id).await.unwrap().expose(),
                b"0123456789abcdef"
            );
        }
    }

    #[tokio::test]
    async fn unwrap_under_other_master_key_id_fails() {
        let kms = KeyringKms::from_json(
            r#"{"a":"MDEyMzQ1Njc4OTAxMjM0NQ==","b":"MDEyMzQ1Njc4OTAxMjM0NQ=="}"#,
        )
        .unwrap();
        let w = kms.wrap_key(b"0123456789abcdef", "a").await.unwrap();
        // same key bytes, different id: the AAD differs
        assert!(matches!(
            kms.unwrap_key(&w, "b").await,
            Err(Error::Unwrap { .. })
        ));
    }

    #[tokio::test]
    async fn unknown_master_key_is_named() {
        let err = keyring()
            .unwrap_key("AAAA", "nope")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("'nope'"), "{err}");
    }

    #[test]
    fn bad_key_length_is_rejected_without_showing_the_key() {
        let err = KeyringKms::from_json(r#"{"short":"MDEy"}"#).unwrap_err();
        assert!(err.contains("'short'") && !err.contains("MDEy"), "{err}");
    }

    #[tokio::test]
    async fn rotation_wraps_with_the_new_version_and_unwraps_both() {
        let mut kms = keyring();
        let old = kms.wrap_key(b"0123456789abcdef", "k16").await.unwrap();
        assert_eq!(kms.rotate("k16").unwrap(), 2);
        let new = kms.wrap_key(b"0123456789abcdef", "k16").await.unwrap();
        let reloaded = KeyringKms::from_json(&kms.to_json()).unwrap();
        for w in [&old, &new] {
            assert_eq!(
                reloaded.unwrap_key(w, "k16").await.unwrap().expose(),
                b"0123456789abcdef"
            );
        }
        // the new wrap is not under the old version
        let only_old = keyring();
        assert!(only_old.unwrap_key(&new, "k16").await.is_err());
    }

    #[test]
    fn debug_lists_ids_only() {
        let s = format!("{:?}", keyring());
        assert!(s.contains("k16") && !s.contains("MDEy"), "{s}");
    }
}

/// The `[kms]` section of ClearIce's and the crypto service's config files.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KmsConfig {
    /// KMS kind; `keyring` (master keys in a local JSON file) or `aws` (AWS KMS).
    #[serde(rename = "type")]
    pub kind: KmsKind,
    /// Keyring file (for `keyring`).
    pub path: Option<std::path::PathBuf>,
    /// Lifetime of unwrapped keys in the cache, seconds; default 600.
    #[serde(default)]
    pub key_cache_ttl_s: Option<u64>,
    /// AWS region (`aws`; default from AWS_REGION or the profile).
    #[serde(default)]
    pub region: Option<String>,
    /// AWS KMS endpoint URL (`aws`; default from AWS_ENDPOINT_URL_KMS / AWS_ENDPOINT_URL,
    /// else the region's).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// AWS shared-files profile (`aws`; default AWS_PROFILE, else `default`).
    #[serde(default)]
    pub profile: Option<String>,
}

/// KMS kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KmsKind {
    /// Master keys in a local JSON file (embedded default).
    Keyring,
    /// AWS KMS (or an AWS-compatible KMS endpoint).
    Aws,
}

impl KmsConfig {
    /// The AWS KMS client settings of this section.
    pub fn aws(&self) -> crate::AwsKmsConfig {
        crate::AwsKmsConfig {
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            profile: self.profile.clone(),
            timeout: None,
        }
    }

    /// How long unwrapped keys stay cached.
    pub fn cache_ttl(&self) -> std::time::Duration {
        self.key_cache_ttl_s
            .map_or(crate::DEFAULT_KEY_CACHE_TTL, std::time::Duration::from_secs)
    }

    /// Opens the KMS; `resolve` turns the keyring path into a file to read (relative to
    /// the config file). A keyring needs `path` (callers check it when loading the
    /// config). Blocking: reads the keyring or AWS's shared files.
    pub fn open(
        &self,
        resolve: impl Fn(&Path) -> std::path::PathBuf,
    ) -> Result<std::sync::Arc<dyn Kms>> {
        let (kind, kms): (&'static str, std::sync::Arc<dyn Kms>) = match self.kind {
            KmsKind::Keyring => {
                let path = self.path.as_deref().ok_or_else(|| Error::Keyring {
                    path: "[kms]".into(),
                    reason: "a keyring KMS needs `path` (the keyring JSON file)".into(),
                })?;
                (
                    "keyring",
                    std::sync::Arc::new(KeyringKms::from_file(&resolve(path))?),
                )
            }
            KmsKind::Aws => ("aws", std::sync::Arc::new(crate::AwsKms::new(&self.aws())?)),
        };
        Ok(std::sync::Arc::new(MeteredKms { kind, inner: kms }))
    }
}

/// A configured KMS whose calls are counted and timed by kind and outcome
/// (`clearice_kms_requests_total`, `clearice_kms_request_duration_seconds`).
#[derive(Debug)]
struct MeteredKms {
    kind: &'static str,
    inner: std::sync::Arc<dyn Kms>,
}

#[async_trait::async_trait]
impl Kms for MeteredKms {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn wrap_key(&self, key: &[u8], master_key_id: &str) -> Result<String> {
        let start = std::time::Instant::now();
        let out = self.inner.wrap_key(key, master_key_id).await;
        clearice_metrics::kms_call(self.kind, "wrap", out.is_ok(), start.elapsed());
        out
    }

    async fn unwrap_key(&self, wrapped: &str, master_key_id: &str) -> Result<SecretKey> {
        let start = std::time::Instant::now();
        let out = self.inner.unwrap_key(wrapped, master_key_id).await;
        clearice_metrics::kms_call(self.kind, "unwrap", out.is_ok(), start.elapsed());
        out
    }

    fn has_master_key(&self, master_key_id: &str) -> Option<bool> {
        self.inner.has_master_key(master_key_id)
    }
}
