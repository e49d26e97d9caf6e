//! The `remote` crypto provider: PME module cryptography done by a protection service
//! (the reference one is `clearice crypto-server`) over the JSON protocol of
//! [`crate::protocol`]. Keys never reach this process: modules go out encrypted and come
//! back decrypted, for the principal named in the call, and the service decides.
//!
//! Calls are batched (many modules per request, split at [`RemoteConfig::max_request_bytes`]),
//! concurrent up to [`RemoteConfig::max_concurrent`], bounded in time, and retried a few
//! times when idempotent (decrypt, access checks) and the failure is transient.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::prelude::{BASE64_STANDARD, BASE64_URL_SAFE_NO_PAD};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::modules::{ModuleError, ModulePosition};
use crate::protocol::{
    self, Access, AccessRequest, AccessResponse, BatchRequest, ColumnReference, DataBatch,
    EncryptionRef, ErrorResponse, ModuleInfo, ValueFormat, WireBody,
};
use crate::provider::{
    AccessToken, CallContext, CryptoProvider, KeyAccess, KeyRef, ModuleBatch, NewDataKey,
    ProviderError,
};
use crate::resolver::{KeyResolver, RetrieverCache, SideFileReader};
use crate::secret::SecretKey;

/// How the provider authenticates to the service when the caller brings no token.
#[derive(Clone)]
pub enum RemoteCredential {
    /// No `Authorization` header (a service that authenticates otherwise).
    None,
    /// A fixed bearer token (e.g. issued by the organisation's identity provider).
    Bearer(AccessToken),
    /// Short-lived HS256 JWTs minted per call from a shared secret.
    Hs256 {
        /// The shared secret.
        secret: SecretKey,
        /// `sub` claim: this ClearIce instance's identity at the service.
        subject: String,
        /// `aud` claim.
        audience: String,
    },
}

impl std::fmt::Debug for RemoteCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Self::Hs256 {
                subject, audience, ..
            } => f
                .debug_struct("Hs256")
                .field("subject", subject)
                .field("audience", audience)
                .finish_non_exhaustive(),
        }
    }
}

/// Settings of a remote provider (`[providers.NAME]` with `type = "remote"`).
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Name in errors, the audit log and the policy's `provider = "NAME"`.
    pub name: String,
    /// Base URL, e.g. `https://127.0.0.1:8443`.
    pub url: String,
    /// PEM CA bundle for a service with a private CA (then only it is trusted).
    pub ca_pem: Option<Vec<u8>>,
    /// Credentials when the caller brings none.
    pub credential: RemoteCredential,
    /// Longest one request may take (connect, send, answer).
    pub timeout: Duration,
    /// Requests in flight at once, over all queries.
    pub max_concurrent: usize,
    /// Retries of an idempotent request after a transient failure.
    pub retries: u32,
    /// Largest module payload per request, bytes (bigger batches are split).
    pub max_request_bytes: usize,
}

impl RemoteConfig {
    /// Defaults for `name` at `url`.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            ca_pem: None,
            credential: RemoteCredential::None,
            timeout: Duration::from_secs(10),
            max_concurrent: 16,
            retries: 2,
            max_request_bytes: 8 << 20,
        }
    }
}

/// A large batch is sent as up to this many concurrent requests.
const PARALLEL_PIECES: usize = 4;

/// Smallest piece a batch is split into for concurrency (smaller batches go whole).
const MIN_PIECE_BYTES: usize = 256 << 10;

/// Remote provider: see the module docs.
pub struct RemoteProvider {
    config: RemoteConfig,
    base: String,
    client: reqwest::Client,
    permits: Arc<tokio::sync::Semaphore>,
    /// Key metadata parsing and external key material (no KMS here).
    retrievers: RetrieverCache,
    minted: Mutex<Option<(AccessToken, Instant)>>,
    requests: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RemoteProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteProvider")
            .field("name", &self.config.name)
            .field("url", &self.base)
            .field("credential", &self.config.credential)
            .finish_non_exhaustive()
    }
}

/// Lifetime of a minted token.
const MINTED_TTL: Duration = Duration::from_secs(300);

impl RemoteProvider {
    /// A provider for `config`; `side_files` reads external key material (its content is
    /// sent to the service, which alone can unwrap it).
    pub fn new(config: RemoteConfig, side_files: Option<SideFileReader>) -> Result<Self, Error> {
        let bad = |reason: String| Error::Provider {
            provider: config.name.clone(),
            reason,
        };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(config.max_concurrent);
        if let Some(pem) = &config.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| bad(format!("CA bundle: {e}")))?;
            builder = builder.tls_built_in_root_certs(false);
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let client = builder
            .build()
            .map_err(|e| bad(format!("HTTP client: {e}")))?;
        let base = config.url.trim_end_matches('/').to_owned();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(bad(format!("url '{base}' is not http(s)://")));
        }
        Ok(Self {
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent.max(1))),
            retrievers: RetrieverCache::new(
                Arc::new(KeyResolver::new(
                    None,
                    Default::default(),
                    crate::DEFAULT_KEY_CACHE_TTL,
                )),
                side_files,
            ),
            config,
            base,
            client,
            minted: Mutex::default(),
            requests: Default::default(),
        })
    }

    /// Requests sent so far (benchmarks, tests).
    pub fn request_count(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The service's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    fn unavailable(&self, reason: impl Into<String>) -> ProviderError {
        ProviderError::Unavailable {
            provider: self.config.name.clone(),
            reason: reason.into(),
        }
    }

    fn bearer(&self, ctx: &CallContext) -> Option<AccessToken> {
        if let Some(t) = &ctx.credential {
            return Some(t.clone());
        }
        match &self.config.credential {
            RemoteCredential::None => None,
            RemoteCredential::Bearer(t) => Some(t.clone()),
            RemoteCredential::Hs256 {
                secret,
                subject,
                audience,
            } => {
                let mut minted = self.minted.lock().expect("minted token");
                if let Some((t, at)) = &*minted
                    && at.elapsed() < MINTED_TTL / 2
                {
                    return Some(t.clone());
                }
                let t = mint_hs256(secret, subject, audience, MINTED_TTL);
                *minted = Some((t.clone(), Instant::now()));
                Some(t)
            }
        }
    }

    /// POSTs a `/wrap` or `/unwrap` request (`key`: base64, zeroed once sent) and returns
    /// the answer's key, decoded.
    async fn wrap_call(
        &self,
        ctx: &CallContext,
        path: &str,
        key_id: &str,
        key: String,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, ProviderError> {
        use zeroize::Zeroize;
        let mut req = protocol::WrapRequest {
            key_id: key_id.to_owned(),
            access: Access {
                user_id: ctx.principal.clone(),
                ..Default::default()
            },
            key,
            application_context: serde_json::to_string(&ctx.application).expect("string map"),
        };
        // An unwrap is idempotent; a wrap draws a fresh nonce, so it is sent once.
        let answer = self
            .post::<_, protocol::WrapResponse>(ctx, path, &req, path == "/unwrap", key_id)
            .await;
        req.key.zeroize();
        let resp = zeroize::Zeroizing::new(answer?.key);
        BASE64_STANDARD
            .decode(resp.as_bytes())
            .map(zeroize::Zeroizing::new)
            .map_err(|_| self.unavailable(format!("{path}: key is not base64")))
    }

    /// POSTs JSON `body` to `path` and parses the JSON answer.
    async fn post<T: Serialize, R: DeserializeOwned>(
        &self,
        ctx: &CallContext,
        path: &str,
        body: &T,
        idempotent: bool,
        key_id: &str,
    ) -> Result<R, ProviderError> {
        let body = WireBody::from(Bytes::from(
            serde_json::to_vec(body).map_err(|e| self.unavailable(format!("request: {e}")))?,
        ));
        let answer = self
            .post_raw(ctx, path, "application/json", body, idempotent, key_id)
            .await?;
        serde_json::from_slice(&answer).map_err(|e| {
            self.unavailable(format!(
                "{}{path}: answer is not the protocol's JSON: {e}",
                self.base
            ))
        })
    }

    /// POSTs `body` (of `content_type`) to `path`; retries transient failures when
    /// `idempotent`; returns the body of a 200 answer, and maps the others to errors.
    /// Counted and timed per provider and operation (retries included).
    async fn post_raw(
        &self,
        ctx: &CallContext,
        path: &str,
        content_type: &str,
        body: WireBody,
        idempotent: bool,
        key_id: &str,
    ) -> Result<Bytes, ProviderError> {
        let start = Instant::now();
        let out = self
            .send(ctx, path, content_type, body, idempotent, key_id)
            .await;
        let operation = protocol::operation_of(path);
        clearice_metrics::provider_call(&self.config.name, operation, out.is_ok(), start.elapsed());
        out
    }

    async fn send(
        &self,
        ctx: &CallContext,
        path: &str,
        content_type: &str,
        body: WireBody,
        idempotent: bool,
        key_id: &str,
    ) -> Result<Bytes, ProviderError> {
        let bearer = self.bearer(ctx);
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| self.unavailable("provider closed"))?;
        let url = format!("{}{path}", self.base);
        let attempts = if idempotent {
            self.config.retries + 1
        } else {
            1
        };
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
            }
            self.requests
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut req = self
                .client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(reqwest::Body::wrap(body.clone()));
            if let Some(t) = &bearer {
                req = req.bearer_auth(t.expose());
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    last = describe_send_error(&e, self.config.timeout);
                    continue;
                }
            };
            let status = resp.status();
            let bytes = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    last = describe_send_error(&e, self.config.timeout);
                    continue;
                }
            };
            if status.is_success() {
                return Ok(bytes);
            }
            let err: ErrorResponse =
                serde_json::from_slice(&bytes).unwrap_or_else(|_| ErrorResponse {
                    access: None,
                    error: protocol::ErrorBody {
                        message: String::from_utf8_lossy(&bytes).chars().take(200).collect(),
                        ..Default::default()
                    },
                });
            let message = err.error.message.clone();
            match (status.as_u16(), err.error.code.as_str()) {
                (401, _) => {
                    return Err(ProviderError::Unauthenticated {
                        provider: self.config.name.clone(),
                        reason: message,
                    });
                }
                (403, _) => {
                    return Err(ProviderError::Denied {
                        provider: self.config.name.clone(),
                        key_id: key_id.to_owned(),
                        principal: err
                            .access
                            .map(|a| a.user_id)
                            .filter(|u| !u.is_empty())
                            .unwrap_or_else(|| ctx.principal.clone()),
                        reason: message,
                    });
                }
                (404, "unknown_key") => {
                    return Err(ProviderError::Key(Error::UnknownMasterKey {
                        kms: self.config.name.clone(),
                        key_id: key_id.to_owned(),
                    }));
                }
                (422, "invalid_module") => {
                    return Err(ProviderError::Invalid {
                        index: err.error.index.unwrap_or(0),
                        position: ModulePosition::footer(),
                        error: ModuleError::from_code(
                            err.error.reason.as_deref().unwrap_or_default(),
                        ),
                    });
                }
                (502..=504, _) => {
                    last = format!("HTTP {status}: {message}");
                    continue;
                }
                _ => return Err(self.unavailable(format!("{url}: HTTP {status}: {message}"))),
            }
        }
        Err(self.unavailable(format!(
            "{url}: {last}{}",
            if attempts > 1 {
                format!(" (after {attempts} attempts)")
            } else {
                String::new()
            }
        )))
    }

    fn request(
        &self,
        ctx: &CallContext,
        batch: &ModuleBatch,
        range: std::ops::Range<usize>,
        encrypt: bool,
    ) -> BatchRequest {
        let modules = &batch.modules[range];
        let data = DataBatch {
            value_format: ValueFormat {
                format: protocol::MODULES_FORMAT.into(),
                algorithm: batch.algorithm.name().into(),
            },
            // The modules travel after the envelope (binary transport).
            value: String::new(),
        };
        let mut app = ctx.application.clone();
        app.insert("file".into(), ctx.file.clone());
        BatchRequest {
            column_reference: ColumnReference {
                name: batch.column.clone(),
            },
            encryption: EncryptionRef {
                key_id: batch.key.key_id.clone(),
                key_metadata: BASE64_STANDARD.encode(&batch.key.key_metadata),
            },
            access: Access {
                user_id: ctx.principal.clone(),
                ..Default::default()
            },
            application_context: serde_json::to_string(&app).expect("string map"),
            data_batch: encrypt.then(|| data.clone()),
            data_batch_encrypted: (!encrypt).then_some(data),
            modules: modules
                .iter()
                .map(|m| ModuleInfo {
                    kind: m.position.kind as u8,
                    row_group: m.position.row_group,
                    column: m.position.column,
                    page: m.position.page,
                    aad: BASE64_STANDARD.encode(&m.aad),
                    nonce: m.nonce.map(|n| BASE64_STANDARD.encode(n)),
                })
                .collect(),
            debug: protocol::Debug {
                reference_id: format!("{:016x}", rand::random::<u64>()),
            },
        }
    }

    /// Splits the batch into pieces (at most [`RemoteConfig::max_request_bytes`] each, and
    /// a large batch into up to [`PARALLEL_PIECES`] pieces of at least
    /// [`MIN_PIECE_BYTES`]) and runs them concurrently: the service decrypts the pieces
    /// of one column chunk on several cores while the answers of the others travel.
    async fn run(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
        encrypt: bool,
    ) -> Result<Vec<Bytes>, ProviderError> {
        let total: usize = batch.modules.iter().map(|m| m.data.len() + 4).sum();
        let piece = total
            .div_ceil(PARALLEL_PIECES)
            .max(MIN_PIECE_BYTES)
            .min(self.config.max_request_bytes);
        let mut ranges = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, m) in batch.modules.iter().enumerate() {
            if i > start && bytes + m.data.len() > piece {
                ranges.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += m.data.len() + 4;
        }
        if start < batch.modules.len() || ranges.is_empty() {
            ranges.push(start..batch.modules.len());
        }
        let path = if encrypt { "/encrypt" } else { "/decrypt" };
        let calls = ranges.into_iter().map(|range| {
            let req = self.request(ctx, &batch, range.clone(), encrypt);
            let batch = &batch;
            async move {
                let body = protocol::encode_binary(
                    &req,
                    batch.modules[range.clone()].iter().map(|m| m.data.clone()),
                );
                let answer = self
                    .post_raw(
                        ctx,
                        path,
                        protocol::BINARY_CONTENT_TYPE,
                        body,
                        !encrypt,
                        &batch.key.key_id,
                    )
                    .await
                    .map_err(|e| match e {
                        ProviderError::Invalid { index, error, .. } => {
                            let index = range.start + index.min(range.len().saturating_sub(1));
                            ProviderError::Invalid {
                                index,
                                position: batch.modules[index].position,
                                error,
                            }
                        }
                        e => e,
                    })?;
                let (_, payload) = protocol::decode_binary(&answer)
                    .map_err(|e| self.unavailable(format!("answer: {e}")))?;
                let parts = protocol::unframe_raw(&payload, range.len())
                    .map_err(|e| self.unavailable(format!("answer: {e}")))?;
                Ok::<_, ProviderError>(parts)
            }
        });
        let parts = futures::future::try_join_all(calls).await?;
        Ok(parts.into_iter().flatten().collect())
    }
}

fn describe_send_error(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        format!("no answer within {:.1} s", timeout.as_secs_f64())
    } else if e.is_connect() {
        let mut source: Option<&dyn std::error::Error> = Some(e);
        let mut last = e.to_string();
        while let Some(s) = source {
            last = s.to_string();
            source = s.source();
        }
        format!("cannot connect: {last}")
    } else {
        e.to_string()
    }
}

/// An HS256 JWT: `sub`, `aud`, `iat`, `exp`.
pub fn mint_hs256(secret: &SecretKey, subject: &str, audience: &str, ttl: Duration) -> AccessToken {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let header = BASE64_URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "sub": subject,
        "aud": audience,
        "iat": now,
        "exp": now + ttl.as_secs(),
    });
    let payload = BASE64_URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.expose());
    let sig = ring::hmac::sign(&key, signing_input.as_bytes());
    AccessToken::new(format!(
        "{signing_input}.{}",
        BASE64_URL_SAFE_NO_PAD.encode(sig.as_ref())
    ))
}

#[async_trait::async_trait]
impl CryptoProvider for RemoteProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    async fn describe_key(
        &self,
        ctx: &CallContext,
        key_metadata: Bytes,
    ) -> Result<KeyRef, ProviderError> {
        let retriever = self.retrievers.get(&ctx.file);
        let in_place = !retriever.may_block(&key_metadata);
        let describe = move || -> Result<KeyRef, ProviderError> {
            let info = retriever.describe(&key_metadata)?;
            // The service cannot read side files: external material goes inline.
            let metadata = match &info.material {
                Some(m) if !m.internal_storage => {
                    let mut m = m.clone();
                    m.internal_storage = true;
                    m.key_reference = None;
                    Bytes::from(serde_json::to_vec(&m).expect("material serializes"))
                }
                _ => key_metadata,
            };
            Ok(KeyRef {
                key_metadata: metadata,
                master_key: info.material.is_some(),
                key_id: info.key_id,
                is_footer_key: info.is_footer_key,
            })
        };
        if in_place {
            return describe();
        }
        tokio::task::spawn_blocking(describe)
            .await
            .map_err(|e| self.unavailable(format!("key task failed: {e}")))?
    }

    async fn decrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Bytes>, ProviderError> {
        self.run(ctx, batch, false).await
    }

    async fn encrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Vec<u8>>, ProviderError> {
        let bodies = self.run(ctx, batch, true).await?;
        Ok(bodies.into_iter().map(Vec::from).collect())
    }

    async fn new_data_key(
        &self,
        ctx: &CallContext,
        master_key_id: &str,
        is_footer_key: bool,
    ) -> Result<NewDataKey, ProviderError> {
        let mut app = ctx.application.clone();
        app.insert("file".into(), ctx.file.clone());
        let req = protocol::NewKeyRequest {
            encryption: EncryptionRef {
                key_id: master_key_id.to_owned(),
                key_metadata: String::new(),
            },
            access: Access {
                user_id: ctx.principal.clone(),
                ..Default::default()
            },
            is_footer_key,
            application_context: serde_json::to_string(&app).expect("string map"),
        };
        // Not retried: each call makes a new key.
        let resp: protocol::NewKeyResponse =
            self.post(ctx, "/keys", &req, false, master_key_id).await?;
        let key_metadata = BASE64_STANDARD
            .decode(&resp.key_metadata)
            .map_err(|_| self.unavailable("/keys: key_metadata is not base64"))?;
        Ok(NewDataKey {
            key_metadata: Bytes::from(key_metadata),
            key: None,
        })
    }

    async fn wrap_key(
        &self,
        ctx: &CallContext,
        key: &[u8],
        wrapping_key_id: &str,
    ) -> Result<Vec<u8>, ProviderError> {
        let key = BASE64_STANDARD.encode(key);
        let wrapped = self.wrap_call(ctx, "/wrap", wrapping_key_id, key).await?;
        Ok(wrapped.to_vec())
    }

    async fn unwrap_key(
        &self,
        ctx: &CallContext,
        wrapped: &[u8],
        wrapping_key_id: &str,
    ) -> Result<SecretKey, ProviderError> {
        let wrapped = BASE64_STANDARD.encode(wrapped);
        let key = self
            .wrap_call(ctx, "/unwrap", wrapping_key_id, wrapped)
            .await?;
        if ![16, 24, 32].contains(&key.len()) {
            return Err(self.unavailable(format!(
                "/unwrap: the key unwrapped under '{wrapping_key_id}' is not an AES key"
            )));
        }
        Ok(SecretKey::from_bytes(key.to_vec()))
    }

    async fn check_access(
        &self,
        ctx: &CallContext,
        key_ids: &[String],
    ) -> Result<BTreeMap<String, KeyAccess>, ProviderError> {
        if key_ids.is_empty() {
            return Ok(BTreeMap::new());
        }
        let req = AccessRequest {
            access: Access {
                user_id: ctx.principal.clone(),
                ..Default::default()
            },
            key_ids: key_ids.to_vec(),
        };
        let resp: AccessResponse = self
            .post(ctx, "/access", &req, true, &key_ids.join(","))
            .await?;
        Ok(key_ids
            .iter()
            .map(|k| {
                let a = match resp.keys.get(k).map(String::as_str) {
                    Some("granted") => KeyAccess::Granted,
                    Some("unknown") => KeyAccess::Unknown,
                    _ => KeyAccess::Denied,
                };
                (k.clone(), a)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_token_verifies_with_the_secret() {
        let secret = SecretKey::from_bytes(b"0123456789abcdef0123456789abcdef".to_vec());
        let t = mint_hs256(&secret, "clearice", "crypto", Duration::from_secs(60));
        let (input, sig) = t.expose().rsplit_once('.').unwrap();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.expose());
        ring::hmac::verify(
            &key,
            input.as_bytes(),
            &BASE64_URL_SAFE_NO_PAD.decode(sig).unwrap(),
        )
        .unwrap();
        let claims: serde_json::Value = serde_json::from_slice(
            &BASE64_URL_SAFE_NO_PAD
                .decode(input.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["sub"], "clearice");
        assert_eq!(claims["aud"], "crypto");
        assert!(format!("{t:?}").contains("redacted"));
    }
}
