//! The remote crypto protocol: JSON over HTTP, modelled on the Data Batch Protection
//! Service (DBPS) REST API, carrying PME modules instead of single values.
//!
//! ```text
//! POST /decrypt   POST /encrypt          (Authorization: Bearer <JWT>)
//! {
//!   "column_reference": {"name": "ssn"},               // absent name: the footer
//!   "encryption": {"key_id": "pii_key", "key_metadata": "<base64 PKMT1 material or key id>"},
//!   "access": {"user_id": "alice"},
//!   "application_context": "{\"table\":\"lake.sales.customers\",\"file\":\"...\"}",
//!   "data_batch_encrypted" | "data_batch": {
//!       "value_format": {"format": "PARQUET_PME_MODULES", "algorithm": "AES_GCM_V1"},
//!       "value": "<base64 of modules, each u32 LE length || bytes>"},
//!   "modules": [{"type": 2, "row_group": 0, "column": 3, "page": 1, "aad": "<base64>",
//!                "nonce": "<base64, encrypt only, optional>"}],
//!   "debug": {"reference_id": "..."}
//! }
//! 200 {"access": {"user_id", "roles", "access_control": "granted"},
//!      "data_batch" (decrypt) | "data_batch_encrypted" (encrypt): {"value_format", "value"}}
//! 401 / 403 / 404 / 413 / 422 / 400: {"access"?: {...,"access_control": "denied"},
//!      "error": {"code": "unauthenticated" | "denied" | "unknown_key" | "too_large" |
//!                        "invalid_module" | "bad_request", "message": "...", "index"?: n,
//!                "reason"?: "authentication" | "truncated" | "key_length"}}
//!
//! POST /keys    {"encryption": {"key_id": "pii_key"}, "access": {"user_id"}, "is_footer_key": false}
//! 200 {"access": {...}, "key_metadata": "<base64 PKMT1 material; the data key stays>"}
//!
//! POST /access  {"access": {"user_id"}, "key_ids": ["pii_key", ...]}
//! 200 {"access": {...}, "keys": {"pii_key": "granted" | "denied" | "unknown"}}
//! GET /healthz  200 "ok"
//! ```
//! Decryption values are module bodies (`nonce || ciphertext [|| tag]`); encryption
//! values are plaintexts, and the answer holds bodies. Key bytes never cross the wire.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// `value_format.format` of a batch of PME modules.
pub const MODULES_FORMAT: &str = "PARQUET_PME_MODULES";

/// Request body of `/decrypt` and `/encrypt`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct BatchRequest {
    /// The column (path) the modules belong to; `name: None` for the footer.
    pub column_reference: ColumnReference,
    /// Key naming.
    pub encryption: EncryptionRef,
    /// Who asks.
    pub access: Access,
    /// JSON object text: table, namespace, file, schema id...
    #[serde(default)]
    pub application_context: String,
    /// Plaintexts (encrypt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_batch: Option<DataBatch>,
    /// Module bodies (decrypt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_batch_encrypted: Option<DataBatch>,
    /// One entry per module of the value, in order.
    pub modules: Vec<ModuleInfo>,
    /// Correlation.
    #[serde(default)]
    pub debug: Debug,
}

/// `column_reference`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ColumnReference {
    /// Column path; absent for the footer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `encryption`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct EncryptionRef {
    /// Master key id (as the client read it; the service decides on the material's own).
    pub key_id: String,
    /// base64 key metadata: PKMT1 key material (external material already resolved) or
    /// an explicit key id.
    pub key_metadata: String,
}

/// `access`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Access {
    /// The user the data is read for.
    #[serde(default)]
    pub user_id: String,
    /// Roles the service granted under (answers only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// `granted` or `denied` (answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_control: Option<String>,
}

/// A data batch: format and base64 payload.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct DataBatch {
    /// Format.
    pub value_format: ValueFormat,
    /// base64 of the framed modules.
    pub value: String,
}

/// `value_format`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ValueFormat {
    /// Always [`MODULES_FORMAT`].
    pub format: String,
    /// `AES_GCM_V1` or `AES_GCM_CTR_V1`.
    #[serde(default)]
    pub algorithm: String,
}

/// One module's context.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ModuleInfo {
    /// PME module type code (0 footer .. 9 bloom filter bitset).
    #[serde(rename = "type")]
    pub kind: u8,
    /// Row group ordinal.
    #[serde(default)]
    pub row_group: usize,
    /// Column ordinal.
    #[serde(default)]
    pub column: usize,
    /// Page ordinal.
    #[serde(default)]
    pub page: usize,
    /// base64 AAD.
    pub aad: String,
    /// base64 nonce to encrypt with (footer signatures); absent: a fresh one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

/// `debug`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Debug {
    /// Correlates client and service logs.
    #[serde(default)]
    pub reference_id: String,
}

/// Answer of `/decrypt` and `/encrypt` (200).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct BatchResponse {
    /// Who the service decided for.
    pub access: Access,
    /// Plaintexts (decrypt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_batch: Option<DataBatch>,
    /// Bodies (encrypt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_batch_encrypted: Option<DataBatch>,
    /// Correlation.
    #[serde(default)]
    pub debug: Debug,
}

/// Error answer (any non-200).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ErrorResponse {
    /// Present on denials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Access>,
    /// What failed.
    pub error: ErrorBody,
}

/// `error`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ErrorBody {
    /// Machine-readable code.
    pub code: String,
    /// One line for people (never key bytes).
    pub message: String,
    /// The failing module's index (`invalid_module`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// Why it failed (`invalid_module`): `authentication`, `truncated` or `key_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /access` request.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct AccessRequest {
    /// Who asks.
    pub access: Access,
    /// Master key ids to check.
    pub key_ids: Vec<String>,
}

/// `POST /access` answer.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct AccessResponse {
    /// Who the service decided for.
    pub access: Access,
    /// `granted`, `denied` or `unknown` per key id.
    pub keys: BTreeMap<String, String>,
}

/// `POST /keys` request: a new data key for a file being written.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NewKeyRequest {
    /// The master key to wrap it under.
    pub encryption: EncryptionRef,
    /// Who asks.
    pub access: Access,
    /// Whether it is the file's footer key.
    #[serde(default)]
    pub is_footer_key: bool,
    /// JSON object text (table, file...).
    #[serde(default)]
    pub application_context: String,
}

/// `POST /keys` answer: the key material (the data key itself stays in the service).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NewKeyResponse {
    /// Who the service decided for.
    pub access: Access,
    /// base64 PKMT1 key material.
    pub key_metadata: String,
}

/// `POST /wrap` and `POST /unwrap` request: a key encryption key of a table Iceberg
/// encrypts itself, wrapped or unwrapped under the table key the service keeps (Iceberg's
/// `KeyManagementClient`).
#[derive(Clone, Serialize, Deserialize, Default)]
pub struct WrapRequest {
    /// The table key (`encryption.key-id`).
    pub key_id: String,
    /// Who asks.
    pub access: Access,
    /// base64: the key to wrap (`/wrap`) or the wrapped key (`/unwrap`).
    pub key: String,
    /// JSON object text (table, namespace...).
    #[serde(default)]
    pub application_context: String,
}

/// `POST /wrap` and `POST /unwrap` answer.
#[derive(Clone, Serialize, Deserialize, Default)]
pub struct WrapResponse {
    /// Who the service decided for.
    pub access: Access,
    /// base64: the wrapped key (`/wrap`) or the key (`/unwrap`).
    pub key: String,
}

// Their `key` is key bytes (wrapped or not): never shown.
impl std::fmt::Debug for WrapRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrapRequest")
            .field("key_id", &self.key_id)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WrapResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrapResponse")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// The operation a request path names, one word for metrics (`decrypt` for
/// `/decrypt`; `other` for a path the protocol does not have).
pub fn operation_of(path: &str) -> &'static str {
    match path {
        "/healthz" => "healthz",
        "/access" => "access",
        "/decrypt" => "decrypt",
        "/encrypt" => "encrypt",
        "/keys" => "keys",
        "/wrap" => "wrap",
        "/unwrap" => "unwrap",
        _ => "other",
    }
}

/// Content type of the binary transport of `/decrypt` and `/encrypt`: the same JSON
/// envelope with an empty `value`, followed by the framed modules as raw bytes (no base64,
/// no JSON string scanning). Layout: `"CIM1"`, `u32 LE` envelope length, envelope JSON,
/// modules (`u32 LE length || bytes` each). Answers use the request's transport.
pub const BINARY_CONTENT_TYPE: &str = "application/vnd.clearice.pme-modules";

const BINARY_MAGIC: &[u8; 4] = b"CIM1";

/// A binary-transport body: `envelope` and the framed `modules`. The modules are not
/// copied into one buffer: the body is sent as a list of buffers (one with the magic, the
/// envelope and every module's length, sliced; each module as it is).
pub fn encode_binary<T: Serialize>(
    envelope: &T,
    modules: impl IntoIterator<Item = Bytes>,
) -> WireBody {
    let json = serde_json::to_vec(envelope).expect("protocol types serialize");
    let modules: Vec<Bytes> = modules.into_iter().collect();
    let mut head = Vec::with_capacity(8 + json.len() + 4 * modules.len());
    head.extend_from_slice(BINARY_MAGIC);
    head.extend_from_slice(&(json.len() as u32).to_le_bytes());
    head.extend_from_slice(&json);
    for m in &modules {
        head.extend_from_slice(&(m.len() as u32).to_le_bytes());
    }
    let head = Bytes::from(head);
    let lengths = 8 + json.len();
    let mut parts = VecDeque::with_capacity(1 + 2 * modules.len());
    parts.push_back(head.slice(..lengths));
    for (i, m) in modules.into_iter().enumerate() {
        let at = lengths + 4 * i;
        parts.push_back(head.slice(at..at + 4));
        if !m.is_empty() {
            parts.push_back(m);
        }
    }
    WireBody::from_parts(parts)
}

/// An HTTP body held as a list of buffers, each sent as it is (hyper writes them with
/// vectored writes): a request or an answer of the remote protocol. Its length is known,
/// so it goes with `Content-Length`; cloning it clones the buffers' handles, not bytes.
#[derive(Clone, Default)]
pub struct WireBody {
    parts: VecDeque<Bytes>,
    remaining: u64,
}

impl WireBody {
    fn from_parts(parts: VecDeque<Bytes>) -> Self {
        let remaining = parts.iter().map(|p| p.len() as u64).sum();
        Self { parts, remaining }
    }

    /// Its bytes in one buffer, as they go on the wire.
    #[cfg(test)]
    fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.remaining as usize);
        for p in &self.parts {
            out.extend_from_slice(p);
        }
        Bytes::from(out)
    }
}

impl From<Bytes> for WireBody {
    fn from(b: Bytes) -> Self {
        Self::from_parts(std::iter::once(b).filter(|b| !b.is_empty()).collect())
    }
}

impl http_body::Body for WireBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.parts.pop_front();
        if let Some(p) = &next {
            self.remaining -= p.len() as u64;
        }
        Poll::Ready(next.map(|p| Ok(http_body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// Splits a binary-transport body into its envelope JSON and its module payload.
pub fn decode_binary(body: &Bytes) -> Result<(Bytes, Bytes), String> {
    if body.len() < 8 || &body[..4] != BINARY_MAGIC {
        return Err("not a CIM1 binary body".into());
    }
    let n = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes")) as usize;
    if body.len() < 8 + n {
        return Err("binary body: envelope is truncated".into());
    }
    Ok((body.slice(8..8 + n), body.slice(8 + n..)))
}

/// Splits a raw framed payload into `expected` modules (slices of `payload`, no copy).
pub fn unframe_raw(payload: &Bytes, expected: usize) -> Result<Vec<Bytes>, String> {
    Ok(frame_ranges(payload, expected)?
        .into_iter()
        .map(|r| payload.slice(r))
        .collect())
}

/// Where each of the `expected` modules of a raw framed payload lies in it.
pub fn frame_ranges(payload: &[u8], expected: usize) -> Result<Vec<Range<usize>>, String> {
    let mut out = Vec::with_capacity(expected);
    let mut pos = 0;
    while pos < payload.len() {
        let len = payload
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("truncated module length")?;
        if payload.len() - pos - 4 < len {
            return Err(format!("module {} is truncated", out.len()));
        }
        out.push(pos + 4..pos + 4 + len);
        pos += 4 + len;
    }
    if out.len() != expected {
        return Err(format!(
            "value holds {} modules, {expected} described",
            out.len()
        ));
    }
    Ok(out)
}

/// Frames modules as one payload: each `u32 LE length || bytes` (PME's own framing).
pub fn frame<'a>(modules: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut out = Vec::new();
    for m in modules {
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    BASE64_STANDARD.encode(out)
}

/// Splits a framed payload into its modules; `expected` of them, else an error line.
pub fn unframe(value: &str, expected: usize) -> Result<Vec<Vec<u8>>, String> {
    let bytes = BASE64_STANDARD
        .decode(value)
        .map_err(|_| "value is not base64".to_owned())?;
    Ok(frame_ranges(&bytes, expected)?
        .into_iter()
        .map(|r| bytes[r].to_vec())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_transport_round_trips() {
        let req = AccessRequest {
            key_ids: vec!["k".into()],
            ..Default::default()
        };
        let modules = [&b"ab"[..], b"", b"cde"].map(Bytes::from_static);
        let body = encode_binary(&req, modules).to_bytes();
        let (json, payload) = decode_binary(&body).unwrap();
        let back: AccessRequest = serde_json::from_slice(&json).unwrap();
        assert_eq!(back.key_ids, vec!["k".to_owned()]);
        let mods = unframe_raw(&payload, 3).unwrap();
        assert_eq!(mods, [&b"ab"[..], b"", b"cde"]);
        assert!(unframe_raw(&payload, 2).is_err());
        assert!(decode_binary(&Bytes::from_static(b"CIM1\xff\0\0\0")).is_err());
    }

    #[test]
    fn framing_round_trips_and_counts() {
        let v = frame([b"abc".as_slice(), b"".as_slice(), b"xyz0".as_slice()]);
        assert_eq!(
            unframe(&v, 3).unwrap(),
            vec![b"abc".to_vec(), vec![], b"xyz0".to_vec()]
        );
        assert!(unframe(&v, 2).unwrap_err().contains("3 modules"));
        let cut = BASE64_STANDARD.encode([5u8, 0, 0, 0, 1]);
        assert!(unframe(&cut, 1).unwrap_err().contains("truncated"));
    }
}
