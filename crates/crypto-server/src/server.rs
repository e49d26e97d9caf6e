//! The HTTP service: routes, per-request decisions, audit, TLS and graceful shutdown.
// Request steps fail with the HTTP answer itself (built once per failed request).
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use bytes::{Bytes, BytesMut};
use clearice_crypto::protocol::{
    self, Access, AccessRequest, AccessResponse, BatchRequest, BatchResponse, DataBatch, ErrorBody,
    ErrorResponse, ValueFormat,
};
use clearice_crypto::{
    Algorithm, CallContext, CryptoProvider, KeyResolver, KmsKind, LocalProvider, Module,
    ModuleBatch, ModulePosition, ModuleType, ProviderError,
};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::Error;
use crate::auth::{Caller, Verifier, is_table_key, may_use_module_key, may_use_table_key};
use crate::config::Config;

/// The service's state.
pub struct Service {
    config: Config,
    verifier: Verifier,
    provider: LocalProvider,
    audit: Option<tokio::sync::Mutex<tokio::fs::File>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("verifier", &self.verifier)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Builds the service: KMS, verifier, audit file (blocking: startup).
    #[expect(clippy::disallowed_methods, reason = "startup, before serving")]
    pub fn new(config: Config) -> Result<Self, Error> {
        if config.kms.kind == KmsKind::Keyring && config.kms.path.is_none() {
            return Err(Error::Config {
                path: "kms.path".into(),
                reason: "a keyring KMS needs `path`".into(),
            });
        }
        let kms = config.kms.open(|p| config.resolve(p))?;
        let ttl = config.kms.cache_ttl();
        let resolver = Arc::new(KeyResolver::new(Some(kms), Default::default(), ttl));
        let audit = match &config.audit {
            Some(p) => {
                let p = config.resolve(p);
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|e| Error::Config {
                        path: p.display().to_string(),
                        reason: e.to_string(),
                    })?;
                Some(tokio::sync::Mutex::new(tokio::fs::File::from_std(f)))
            }
            None => None,
        };
        Ok(Self {
            verifier: Verifier::new(&config)?,
            provider: LocalProvider::new(resolver, None),
            config,
            audit,
        })
    }

    /// The routes.
    pub fn router(self: Arc<Self>) -> Router {
        let limit = self.config.max_request_mb.unwrap_or(64) << 20;
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/access", post(access))
            .route("/decrypt", post(decrypt))
            .route("/encrypt", post(encrypt))
            .route("/keys", post(new_key))
            .route("/wrap", post(wrap))
            .route("/unwrap", post(unwrap))
            .layer(DefaultBodyLimit::max(limit))
            .layer(axum::middleware::from_fn(metered))
            .with_state(self)
    }

    async fn audit(&self, record: AuditRecord<'_>) {
        let Some(file) = &self.audit else { return };
        let mut line = serde_json::to_vec(&record).expect("audit record serializes");
        line.push(b'\n');
        let mut f = file.lock().await;
        if let Err(e) = f.write_all(&line).await {
            tracing::error!("crypto-server audit write failed: {e}");
        }
        let _ = f.flush().await;
    }
}

/// Counts and times every request by operation and outcome
/// (`clearice_crypto_server_requests_total`); the audit says who asked for which key.
async fn metered(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let operation = protocol::operation_of(request.uri().path());
    let start = std::time::Instant::now();
    let response = next.run(request).await;
    let outcome = match response.status().as_u16() {
        200..=299 => "ok",
        401 => "unauthenticated",
        403 => "denied",
        400..=499 => "bad_request",
        _ => "error",
    };
    clearice_metrics::crypto_server_request(operation, outcome, start.elapsed());
    response
}

/// One audit line: who, which key, which column, what was decided (never key bytes).
#[derive(Serialize)]
struct AuditRecord<'a> {
    time: String,
    operation: &'a str,
    user: &'a str,
    subject: &'a str,
    roles: Vec<&'a str>,
    key_id: &'a str,
    column: Option<&'a str>,
    table: Option<String>,
    file: Option<String>,
    granted: bool,
    modules: usize,
    reference_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    error_body(
        status,
        None,
        ErrorBody {
            code: code.into(),
            message: message.into(),
            ..Default::default()
        },
    )
}

fn denied(user: &str, key_id: &str, access: Access) -> Response {
    error_body(
        StatusCode::FORBIDDEN,
        Some(access),
        ErrorBody {
            code: "denied".into(),
            message: format!("user '{user}' may not use key '{key_id}'"),
            ..Default::default()
        },
    )
}

fn error_body(status: StatusCode, access: Option<Access>, error: ErrorBody) -> Response {
    (status, axum::Json(ErrorResponse { access, error })).into_response()
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("not the protocol's JSON: {e}"),
        )
    })
}

fn authenticate(
    service: &Service,
    headers: &HeaderMap,
    named_user: &str,
) -> Result<Caller, Response> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    service
        .verifier
        .verify(header, named_user, &service.config)
        .map_err(|m| error(StatusCode::UNAUTHORIZED, "unauthenticated", m))
}

async fn access(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: AccessRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let caller = match authenticate(&service, &headers, &req.access.user_id) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let mut keys = BTreeMap::new();
    for k in &req.key_ids {
        let known = service.provider.resolver().has_master_key(k) != Some(false);
        let answer = if !known {
            "unknown"
        } else if if is_table_key(&service.config, k) {
            may_use_table_key(&service.config, &caller, k)
        } else {
            may_use_module_key(&service.config, &caller, k)
        } {
            "granted"
        } else {
            "denied"
        };
        keys.insert(k.clone(), answer.to_owned());
    }
    axum::Json(AccessResponse {
        access: Access {
            user_id: caller.user.clone(),
            roles: caller.roles.iter().cloned().collect(),
            access_control: None,
        },
        keys,
    })
    .into_response()
}

/// A new data key for a file being written: wrapped under the master key (double
/// wrapping, as PyArrow writes), returned as key material only.
async fn new_key(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: protocol::NewKeyRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let caller = match authenticate(&service, &headers, &req.access.user_id) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let key_id = req.encryption.key_id.clone();
    let app: BTreeMap<String, String> =
        serde_json::from_str(&req.application_context).unwrap_or_default();
    let granted = may_use_module_key(&service.config, &caller, &key_id);
    service
        .audit(AuditRecord {
            time: now(),
            operation: "new_key",
            user: &caller.user,
            subject: &caller.subject,
            roles: caller.roles.iter().map(String::as_str).collect(),
            key_id: &key_id,
            column: None,
            table: app.get("table").cloned(),
            file: app.get("file").cloned(),
            granted,
            modules: 0,
            reference_id: "",
            error: None,
        })
        .await;
    let access = Access {
        user_id: caller.user.clone(),
        roles: caller.roles.iter().cloned().collect(),
        access_control: Some(if granted { "granted" } else { "denied" }.into()),
    };
    if !granted {
        return denied(&caller.user, &key_id, access);
    }
    let Some(kms) = service.provider.resolver().kms().cloned() else {
        return error(StatusCode::NOT_FOUND, "unknown_key", "no KMS");
    };
    let is_footer = req.is_footer_key;
    let id = key_id.clone();
    let made = clearice_crypto::KeyMaterialWriter::new(kms.as_ref())
        .data_key(&id, is_footer)
        .await;
    match made {
        Ok((_dek, material)) => axum::Json(protocol::NewKeyResponse {
            access,
            key_metadata: BASE64_STANDARD.encode(material),
        })
        .into_response(),
        Err(clearice_crypto::Error::UnknownMasterKey { .. }) => error(
            StatusCode::NOT_FOUND,
            "unknown_key",
            format!("no master key '{key_id}'"),
        ),
        Err(e) => error(StatusCode::BAD_GATEWAY, "kms_unavailable", e.to_string()),
    }
}

async fn wrap(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    wrap_call(&service, &headers, &body, true).await
}

async fn unwrap(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    wrap_call(&service, &headers, &body, false).await
}

/// Longest base64 key a `/wrap` or `/unwrap` request may carry (a wrapped 256-bit key is
/// under 100 characters in the keyring's and AWS KMS's formats).
const MAX_WRAP_KEY_CHARS: usize = 4096;

/// Wraps (`wrap`) or unwraps a key encryption key of a table Iceberg encrypts itself under
/// the table key this service keeps, for a trusted service acting for a user the key's
/// rules allow ([`may_use_table_key`]). The table key never leaves the service; every call
/// is audited with its outcome (the `table` is the caller's claim).
async fn wrap_call(service: &Service, headers: &HeaderMap, body: &Bytes, wrap: bool) -> Response {
    let operation = if wrap { "wrap_key" } else { "unwrap_key" };
    let parsed: protocol::WrapRequest = match parse(body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let protocol::WrapRequest {
        key_id,
        access,
        key,
        application_context,
    } = parsed;
    let req = zeroize::Zeroizing::new(key);
    let app: BTreeMap<String, String> =
        serde_json::from_str(&application_context).unwrap_or_default();
    let table = app.get("table").map(String::as_str);
    let audit = WrapAudit {
        operation,
        named_user: &access.user_id,
        key_id: &key_id,
        table,
    };
    let caller = match authenticate(service, headers, &access.user_id) {
        Ok(c) => c,
        Err(e) => {
            service
                .audit(audit.record(None, false, Some("unauthenticated")))
                .await;
            return e;
        }
    };
    let granted = may_use_table_key(&service.config, &caller, &key_id);
    let answer_access = Access {
        user_id: caller.user.clone(),
        roles: caller.roles.iter().cloned().collect(),
        access_control: Some(if granted { "granted" } else { "denied" }.into()),
    };
    if !granted {
        let why = if !is_table_key(&service.config, &key_id) {
            "not a table key ([keys.K] table_key)"
        } else if !caller.service {
            "table keys are released to trusted services only"
        } else {
            "no rule names the user"
        };
        service
            .audit(audit.record(Some(&caller), false, Some(why)))
            .await;
        return denied(&caller.user, &key_id, answer_access);
    }
    let fail = |status: StatusCode, code: &str, message: String| (status, code.to_owned(), message);
    let outcome = if req.len() > MAX_WRAP_KEY_CHARS {
        Err(fail(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("key is over {MAX_WRAP_KEY_CHARS} characters"),
        ))
    } else if wrap {
        match BASE64_STANDARD
            .decode(req.as_bytes())
            .map(zeroize::Zeroizing::new)
        {
            Ok(plain) if [16, 24, 32].contains(&plain.len()) => {
                wrap_with(service, &plain, &key_id).await
            }
            Ok(_) => Err(fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "a key to wrap is a 128, 192 or 256-bit AES key".into(),
            )),
            Err(_) => Err(fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "key is not base64".into(),
            )),
        }
    } else {
        unwrap_with(service, &req, &key_id).await
    };
    match outcome {
        Ok(key) => {
            service.audit(audit.record(Some(&caller), true, None)).await;
            axum::Json(protocol::WrapResponse {
                access: answer_access,
                key: key.to_string(),
            })
            .into_response()
        }
        Err((status, code, message)) => {
            service
                .audit(audit.record(Some(&caller), true, Some(&message)))
                .await;
            error(status, &code, message)
        }
    }
}

/// What every audit line of one `/wrap` or `/unwrap` call shares.
struct WrapAudit<'a> {
    operation: &'a str,
    /// The user the request names (the line's user while the caller is unknown).
    named_user: &'a str,
    key_id: &'a str,
    table: Option<&'a str>,
}

impl<'a> WrapAudit<'a> {
    /// The line for `caller` (none: unauthenticated).
    fn record(
        &self,
        caller: Option<&'a Caller>,
        granted: bool,
        error: Option<&str>,
    ) -> AuditRecord<'a> {
        AuditRecord {
            time: now(),
            operation: self.operation,
            user: caller.map_or(self.named_user, |c| c.user.as_str()),
            subject: caller.map_or("", |c| c.subject.as_str()),
            roles: caller.map_or_else(Vec::new, |c| c.roles.iter().map(String::as_str).collect()),
            key_id: self.key_id,
            column: None,
            table: self.table.map(str::to_owned),
            file: None,
            granted,
            modules: 0,
            reference_id: "",
            error: error.map(str::to_owned),
        }
    }
}

/// A failed wrap or unwrap: HTTP status, error code, message (no key bytes).
type WrapFailure = (StatusCode, String, String);

/// `key` wrapped under `key_id` by the service's KMS, in the KMS's text form (the base64
/// of its bytes: the keyring, AWS).
async fn wrap_with(
    service: &Service,
    key: &[u8],
    key_id: &str,
) -> Result<zeroize::Zeroizing<String>, WrapFailure> {
    let kms = service_kms(service)?;
    kms.wrap_key(key, key_id)
        .await
        .map(zeroize::Zeroizing::new)
        .map_err(|e| kms_failure(e, key_id))
}

/// The key `wrapped` (the KMS's text form) holds under `key_id`, as base64.
async fn unwrap_with(
    service: &Service,
    wrapped: &str,
    key_id: &str,
) -> Result<zeroize::Zeroizing<String>, WrapFailure> {
    let kms = service_kms(service)?;
    kms.unwrap_key(wrapped, key_id)
        .await
        .map(|k| zeroize::Zeroizing::new(BASE64_STANDARD.encode(k.expose())))
        .map_err(|e| kms_failure(e, key_id))
}

fn service_kms(service: &Service) -> Result<Arc<dyn clearice_crypto::Kms>, WrapFailure> {
    service.provider.resolver().kms().cloned().ok_or((
        StatusCode::NOT_FOUND,
        "unknown_key".to_owned(),
        "no KMS".to_owned(),
    ))
}

fn kms_failure(e: clearice_crypto::Error, key_id: &str) -> WrapFailure {
    match e {
        clearice_crypto::Error::UnknownMasterKey { .. } => (
            StatusCode::NOT_FOUND,
            "unknown_key".into(),
            format!("no master key '{key_id}'"),
        ),
        // A wrapped key that does not unwrap (tampered, or under another key): the
        // caller's input, named without its bytes.
        clearice_crypto::Error::Unwrap { .. } => (
            StatusCode::BAD_REQUEST,
            "invalid_key".into(),
            format!("the wrapped key does not unwrap under '{key_id}'"),
        ),
        e => (
            StatusCode::BAD_GATEWAY,
            "kms_unavailable".into(),
            e.to_string(),
        ),
    }
}

async fn decrypt(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    batch(&service, &headers, body, false).await
}

async fn encrypt(State(service): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    batch(&service, &headers, body, true).await
}

async fn batch(service: &Service, headers: &HeaderMap, body: Bytes, encrypt: bool) -> Response {
    let operation = if encrypt { "encrypt" } else { "decrypt" };
    // Binary transport (envelope + raw modules) or JSON with base64 values.
    let binary = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == protocol::BINARY_CONTENT_TYPE.as_bytes());
    let (envelope, payload) = if binary {
        match protocol::decode_binary(&body) {
            Ok((json, payload)) => (json, Some(payload)),
            Err(m) => return error(StatusCode::BAD_REQUEST, "bad_request", m),
        }
    } else {
        (body.clone(), None)
    };
    let req: BatchRequest = match parse(&envelope) {
        Ok(r) => r,
        Err(e) => return e,
    };
    // The payload is then the body's only handle: decrypted where it lies.
    drop((body, envelope));
    let caller = match authenticate(service, headers, &req.access.user_id) {
        Ok(c) => c,
        Err(e) => {
            service
                .audit(AuditRecord {
                    time: now(),
                    operation,
                    user: &req.access.user_id,
                    subject: "",
                    roles: vec![],
                    key_id: &req.encryption.key_id,
                    column: req.column_reference.name.as_deref(),
                    table: None,
                    file: None,
                    granted: false,
                    modules: req.modules.len(),
                    reference_id: &req.debug.reference_id,
                    error: Some("unauthenticated".into()),
                })
                .await;
            return e;
        }
    };
    let app: BTreeMap<String, String> =
        serde_json::from_str(&req.application_context).unwrap_or_default();
    let ctx = CallContext {
        principal: caller.user.clone(),
        file: app.get("file").cloned().unwrap_or_default(),
        application: app.clone(),
        credential: None,
    };
    // The key is the one the material names, not the one the caller claims.
    let metadata = match BASE64_STANDARD.decode(&req.encryption.key_metadata) {
        Ok(m) => Bytes::from(m),
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "encryption.key_metadata is not base64",
            );
        }
    };
    let key = match service.provider.describe_key(&ctx, metadata).await {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_key_material", e.to_string()),
    };
    let granted = may_use_module_key(&service.config, &caller, &key.key_id);
    let key_id = key.key_id.clone();
    let record = |error: Option<String>, granted: bool| AuditRecord {
        time: now(),
        operation,
        user: &caller.user,
        subject: &caller.subject,
        roles: caller.roles.iter().map(String::as_str).collect(),
        key_id: &key_id,
        column: req.column_reference.name.as_deref(),
        table: app.get("table").cloned(),
        file: app.get("file").cloned(),
        granted,
        modules: req.modules.len(),
        reference_id: &req.debug.reference_id,
        error,
    };
    let access = Access {
        user_id: caller.user.clone(),
        roles: caller.roles.iter().cloned().collect(),
        access_control: Some(if granted { "granted" } else { "denied" }.into()),
    };
    if !granted {
        service.audit(record(None, false)).await;
        return denied(&caller.user, &key_id, access);
    }
    let result = run(service, &ctx, &req, payload, key, encrypt).await;
    match result {
        Ok(parts) => {
            service.audit(record(None, true)).await;
            let data = DataBatch {
                value_format: ValueFormat {
                    format: protocol::MODULES_FORMAT.into(),
                    algorithm: String::new(),
                },
                value: if binary {
                    String::new()
                } else {
                    protocol::frame(parts.iter().map(|p| p.as_ref()))
                },
            };
            let answer = BatchResponse {
                access,
                data_batch: (!encrypt).then(|| data.clone()),
                data_batch_encrypted: encrypt.then_some(data),
                debug: req.debug.clone(),
            };
            if binary {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        protocol::BINARY_CONTENT_TYPE,
                    )],
                    axum::body::Body::new(protocol::encode_binary(&answer, parts)),
                )
                    .into_response()
            } else {
                axum::Json(answer).into_response()
            }
        }
        Err(resp) => {
            service
                .audit(record(Some(format!("HTTP {}", resp.status())), true))
                .await;
            resp
        }
    }
}

async fn run(
    service: &Service,
    ctx: &CallContext,
    req: &BatchRequest,
    payload: Option<Bytes>,
    key: clearice_crypto::KeyRef,
    encrypt: bool,
) -> Result<Vec<Bytes>, Response> {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "bad_request", m);
    let data = if encrypt {
        req.data_batch.as_ref()
    } else {
        req.data_batch_encrypted.as_ref()
    }
    .ok_or_else(|| bad("no data batch".into()))?;
    if data.value_format.format != protocol::MODULES_FORMAT {
        return Err(bad(format!(
            "value_format.format '{}' is not {}",
            data.value_format.format,
            protocol::MODULES_FORMAT
        )));
    }
    let algorithm = match data.value_format.algorithm.as_str() {
        "AES_GCM_V1" => Algorithm::AesGcmV1,
        "AES_GCM_CTR_V1" => Algorithm::AesGcmCtrV1,
        other => return Err(bad(format!("unknown algorithm '{other}'"))),
    };
    let n = req.modules.len();
    // A binary decrypt is decrypted in the request's own buffer (copied once only when
    // hyper handed the body over in a buffer it shares).
    let (bodies, mut in_place) = match payload {
        Some(p) if !encrypt => {
            let ranges = protocol::frame_ranges(&p, n).map_err(bad)?;
            let buf = p.try_into_mut().unwrap_or_else(|p| BytesMut::from(&p[..]));
            (vec![Bytes::new(); n], Some((buf, ranges)))
        }
        Some(p) => (protocol::unframe_raw(&p, n).map_err(bad)?, None),
        None => (
            protocol::unframe(&data.value, n)
                .map_err(bad)?
                .into_iter()
                .map(Bytes::from)
                .collect(),
            None,
        ),
    };
    let mut modules = Vec::with_capacity(bodies.len());
    for (i, (info, body)) in req.modules.iter().zip(bodies).enumerate() {
        let kind = ModuleType::from_code(info.kind)
            .ok_or_else(|| bad(format!("module {i}: unknown type {}", info.kind)))?;
        let aad = BASE64_STANDARD
            .decode(&info.aad)
            .map_err(|_| bad(format!("module {i}: aad is not base64")))?;
        let nonce = match &info.nonce {
            Some(n) => Some(
                BASE64_STANDARD
                    .decode(n)
                    .ok()
                    .and_then(|n| <[u8; 12]>::try_from(n).ok())
                    .ok_or_else(|| bad(format!("module {i}: nonce is not 12 bytes")))?,
            ),
            None => None,
        };
        modules.push(Module {
            position: ModulePosition::new(kind, info.row_group, info.column, info.page),
            aad,
            data: body,
            nonce,
        });
    }
    let batch = ModuleBatch {
        key,
        algorithm,
        column: req.column_reference.name.clone(),
        modules,
    };
    // AES over a whole batch is CPU work (and an unwrap may wait on the KMS): off the
    // async workers.
    let out = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(async {
            if let Some((buf, ranges)) = in_place.as_mut() {
                let plain = (service.provider)
                    .decrypt_in_place(ctx, &batch, buf, ranges)
                    .await?;
                let buf = std::mem::take(buf).freeze();
                Ok(plain.into_iter().map(|r| buf.slice(r)).collect())
            } else if encrypt {
                let bodies = service.provider.encrypt(ctx, batch).await?;
                Ok(bodies.into_iter().map(Bytes::from).collect())
            } else {
                service.provider.decrypt(ctx, batch).await
            }
        })
    });
    match out {
        Ok(parts) => Ok(parts),
        Err(ProviderError::Invalid { index, error, .. }) => Err(error_body(
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            ErrorBody {
                code: "invalid_module".into(),
                message: format!("module {index} did not decrypt: {error}"),
                index: Some(index),
                reason: Some(error.code().into()),
            },
        )),
        Err(ProviderError::Key(clearice_crypto::Error::UnknownMasterKey { key_id, .. })) => {
            Err(error(
                StatusCode::NOT_FOUND,
                "unknown_key",
                format!("no master key '{key_id}'"),
            ))
        }
        Err(ProviderError::Key(clearice_crypto::Error::KmsCall { reason, .. })) => {
            Err(error(StatusCode::BAD_GATEWAY, "kms_unavailable", reason))
        }
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            "bad_key_material",
            e.to_string(),
        )),
    }
}

/// Serves the API until `shutdown`; requests still running then get 10 s to end.
pub async fn serve(
    service: Arc<Service>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    clearice_metrics::http::serve(service.router(), listener, tls, shutdown).await?;
    Ok(())
}

/// Loads the TLS acceptor of `[tls]` (blocking: startup).
#[expect(clippy::disallowed_methods, reason = "startup, before serving")]
pub fn tls_acceptor(config: &Config) -> Result<Option<tokio_rustls::TlsAcceptor>, Error> {
    let Some(tls) = &config.tls else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        let p = config.resolve(p);
        std::fs::read(&p).map_err(|e| Error::Config {
            path: p.display().to_string(),
            reason: e.to_string(),
        })
    };
    let bad = |what: &str, reason: String| Error::Config {
        path: format!("tls.{what}"),
        reason,
    };
    clearice_metrics::http::tls_acceptor(&read(&tls.cert)?, &read(&tls.key)?)
        .map(Some)
        .map_err(|(which, reason)| bad(which, reason))
}
