//! A REST catalog's read restrictions (`read-restrictions` in the `loadTable` answer):
//! iceberg-rust 0.10.1's parser drops the field, so ClearIce asks `loadTable` itself,
//! as the principal the restrictions are for, and hands the raw object to the access
//! layer (which alone reads policy) with the field ids and names of the table's current
//! schema in that same answer.
//!
//! ```text
//!  PolicyTableProvider::try_new (access) ─▶ IcebergTableProvider::read_restrictions
//!     ─▶ RestRestrictions::load(principal, table)
//!          GET {uri}/v1/{prefix}/namespaces/{ns}/tables/{table}
//!          Authorization: Bearer <the principal's token, or ClearIce's own credential>
//!     ◀─ LoadedRestrictions { restrictions (JSON), fields (id, name) }
//! ```
//!
//! Whose restrictions: the spec applies them to the principal the request authenticated.
//! With `principal_tokens` the catalog is asked with each principal's own token, and a
//! principal without one is refused the catalog's tables (it cannot be asked for); with
//! none, ClearIce asks with its own credential and what the catalog requires of ClearIce
//! applies to every principal. Answers are bounded ([`MAX_ANSWER_BYTES`]) and timed out;
//! tokens are never logged or formatted.

use std::collections::BTreeMap;
use std::time::Duration;

use clearice_crypto::AccessToken as Token;
use serde_json::Value;

use crate::error::{Error, Result};

/// Largest `loadTable` answer read (table metadata with its snapshot log), in bytes.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Time allowed for one call to the catalog.
const TIMEOUT: Duration = Duration::from_secs(30);

/// How ClearIce authenticates itself to the catalog.
#[derive(Debug, Clone)]
pub enum EngineCredential {
    /// No `Authorization` header.
    None,
    /// A bearer token (`token_file`).
    Token(Token),
    /// OAuth2 client credentials (`credential_file`), exchanged at `server` for a token.
    ClientCredentials {
        /// `client_id`.
        id: String,
        /// `client_secret`.
        secret: Token,
        /// The token endpoint.
        server: String,
        /// The scope asked for.
        scope: String,
    },
}

/// Asks a REST catalog's `loadTable` for read restrictions.
pub struct RestRestrictions {
    catalog: String,
    /// `http://host:port` (no `/v1`).
    uri: String,
    warehouse: Option<String>,
    headers: Vec<(String, String)>,
    engine: EngineCredential,
    /// The `prefix` property (the server's `overrides` win over it, it over `defaults`).
    prefix_property: Option<String>,
    /// Per principal, its own token; `None`: ClearIce's credential for everyone.
    principals: Option<BTreeMap<String, Token>>,
    client: reqwest::Client,
    /// The catalog's `prefix` (from `/v1/config`), asked once.
    prefix: tokio::sync::OnceCell<String>,
    /// ClearIce's OAuth2 token, fetched on first use.
    engine_token: tokio::sync::Mutex<Option<Token>>,
}

impl std::fmt::Debug for RestRestrictions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestRestrictions")
            .field("catalog", &self.catalog)
            .field("uri", &self.uri)
            .field(
                "principals",
                &self
                    .principals
                    .as_ref()
                    .map(|p| p.keys().collect::<Vec<_>>()),
            )
            .finish_non_exhaustive()
    }
}

/// A `loadTable` answer's read restrictions.
#[derive(Debug, Clone)]
pub struct LoadedRestrictions {
    /// The `read-restrictions` object (`Null` when absent).
    pub restrictions: Value,
    /// The current schema's top-level fields in that answer: (field id, name).
    pub fields: Vec<(i32, String)>,
    /// The answer's `table-uuid`.
    pub table_uuid: Option<String>,
}

/// The parts of a `loadTable` answer read (the rest, snapshots and logs, is skipped
/// without being built).
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(rename = "read-restrictions", default)]
    restrictions: Value,
    metadata: AnswerMetadata,
}

#[derive(serde::Deserialize)]
struct AnswerMetadata {
    #[serde(rename = "table-uuid", default)]
    table_uuid: Option<String>,
    #[serde(rename = "current-schema-id", default)]
    current_schema_id: Option<i64>,
    #[serde(default)]
    schemas: Vec<AnswerSchema>,
}

#[derive(serde::Deserialize)]
struct AnswerSchema {
    #[serde(rename = "schema-id", default)]
    schema_id: Option<i64>,
    #[serde(default)]
    fields: Vec<AnswerField>,
}

#[derive(serde::Deserialize)]
struct AnswerField {
    id: i64,
    name: String,
}

/// Why the catalog could not be asked (before any data is read).
#[derive(Debug, Clone)]
pub enum Refused {
    /// `principal_tokens` is set and names no token for the principal.
    NoToken {
        /// The principal.
        principal: String,
    },
    /// The catalog refuses the principal the table (401, 403) or does not have it (404).
    Status {
        /// The HTTP status.
        status: u16,
    },
}

impl RestRestrictions {
    /// A client for catalog `catalog` at `uri`; `headers` are the catalog's `header.*`
    /// properties (without `Authorization`: the config refuses it, as it would stand for
    /// every principal); `prefix` the `prefix` property; `principals`: each principal's own
    /// token, if the catalog is asked per principal.
    pub fn new(
        catalog: &str,
        uri: &str,
        warehouse: Option<&str>,
        headers: Vec<(String, String)>,
        prefix: Option<&str>,
        engine: EngineCredential,
        principals: Option<BTreeMap<String, Token>>,
    ) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::CatalogRestrictions {
                catalog: catalog.to_owned(),
                table: "*".into(),
                reason: format!("HTTP client: {e}"),
            })?;
        Ok(Self {
            catalog: catalog.to_owned(),
            uri: uri.trim_end_matches('/').to_owned(),
            warehouse: warehouse.map(str::to_owned),
            headers,
            engine,
            prefix_property: prefix.map(str::to_owned),
            principals,
            client,
            prefix: tokio::sync::OnceCell::new(),
            engine_token: tokio::sync::Mutex::new(None),
        })
    }

    fn fail(&self, table: &str, reason: String) -> Error {
        Error::CatalogRestrictions {
            catalog: self.catalog.clone(),
            table: table.to_owned(),
            reason,
        }
    }

    /// The restrictions the catalog returns for `principal` on `namespace.table`
    /// (`full`: the table's name in SQL, for errors). `Ok(Err(_))`: the catalog cannot be
    /// asked for this principal, or refuses it the table.
    pub async fn load(
        &self,
        principal: &str,
        namespace: &[String],
        table: &str,
        full: &str,
    ) -> Result<std::result::Result<LoadedRestrictions, Refused>> {
        let token = match &self.principals {
            Some(p) => match p.get(principal) {
                Some(t) => Some(t.clone()),
                None => {
                    return Ok(Err(Refused::NoToken {
                        principal: principal.to_owned(),
                    }));
                }
            },
            None => self.engine_token(full).await?,
        };
        let prefix = self
            .prefix
            .get_or_try_init(|| self.config_prefix(token.as_ref(), full))
            .await?;
        let ns = namespace
            .iter()
            .map(|p| encode(p))
            .collect::<Vec<_>>()
            .join("%1F");
        let url = format!(
            "{}/v1/{}namespaces/{ns}/tables/{}",
            self.uri,
            prefix,
            encode(table)
        );
        let mut got = self.get(&url, token.as_ref(), full).await?;
        // ClearIce's OAuth2 token may have expired: fetched again, once.
        if matches!(got, Got::Status(401))
            && self.principals.is_none()
            && matches!(self.engine, EngineCredential::ClientCredentials { .. })
        {
            *self.engine_token.lock().await = None;
            let token = self.engine_token(full).await?;
            got = self.get(&url, token.as_ref(), full).await?;
        }
        let body = match got {
            Got::Body(b) => b,
            Got::Status(status) => return Ok(Err(Refused::Status { status })),
        };
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            self.fail(
                full,
                format!("loadTable answer is not a LoadTableResult: {e}"),
            )
        })?;
        let fields = current_fields(&answer.metadata)
            .ok_or_else(|| self.fail(full, "loadTable answer has no current schema".into()))?;
        Ok(Ok(LoadedRestrictions {
            restrictions: answer.restrictions,
            fields,
            table_uuid: answer.metadata.table_uuid,
        }))
    }

    /// ClearIce's own bearer token, if it has a credential (OAuth2: fetched once).
    async fn engine_token(&self, full: &str) -> Result<Option<Token>> {
        match &self.engine {
            EngineCredential::None => Ok(None),
            EngineCredential::Token(t) => Ok(Some(t.clone())),
            EngineCredential::ClientCredentials {
                id,
                secret,
                server,
                scope,
            } => {
                let mut cached = self.engine_token.lock().await;
                if let Some(t) = &*cached {
                    return Ok(Some(t.clone()));
                }
                let form = [
                    ("grant_type", "client_credentials"),
                    ("client_id", id.as_str()),
                    ("client_secret", secret.expose()),
                    ("scope", scope.as_str()),
                ];
                let answer = self
                    .client
                    .post(server)
                    .form(&form)
                    .send()
                    .await
                    .map_err(|e| self.fail(full, format!("OAuth2 token: {}", without_url(e))))?;
                let status = answer.status();
                let body = bounded(answer, 1 << 20)
                    .await
                    .map_err(|e| self.fail(full, format!("OAuth2 token: {e}")))?;
                if !status.is_success() {
                    return Err(self.fail(full, format!("OAuth2 token: HTTP {status}")));
                }
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|_| self.fail(full, "OAuth2 token: answer is not JSON".into()))?;
                let t = v
                    .get("access_token")
                    .and_then(Value::as_str)
                    .map(|t| Token::new(t.trim()))
                    .ok_or_else(|| self.fail(full, "OAuth2 token: no access_token".into()))?;
                *cached = Some(t.clone());
                Ok(Some(t))
            }
        }
    }

    /// The catalog's path prefix (`overrides.prefix`, else `defaults.prefix`), with a
    /// trailing `/`, or empty.
    async fn config_prefix(&self, token: Option<&Token>, full: &str) -> Result<String> {
        let mut url = format!("{}/v1/config", self.uri);
        if let Some(w) = &self.warehouse {
            url.push_str("?warehouse=");
            url.push_str(&encode(w));
        }
        let body = match self.get(&url, token, full).await? {
            Got::Body(b) => b,
            Got::Status(status) => {
                return Err(self.fail(full, format!("/v1/config: HTTP {status}")));
            }
        };
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| self.fail(full, format!("/v1/config answer is not JSON: {e}")))?;
        let server = |k: &str| v.get(k)?.get("prefix")?.as_str().map(str::to_owned);
        let prefix = server("overrides")
            .or_else(|| self.prefix_property.clone())
            .or_else(|| server("defaults"))
            .unwrap_or_default();
        Ok(if prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", prefix.trim_matches('/'))
        })
    }

    /// GET `url`: its body, or a refusal's status (401, 403, 404).
    async fn get(&self, url: &str, token: Option<&Token>, full: &str) -> Result<Got> {
        let mut req = self.client.get(url);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t.expose());
        }
        let answer = req
            .send()
            .await
            .map_err(|e| self.fail(full, format!("loadTable: {}", without_url(e))))?;
        let status = answer.status();
        if matches!(status.as_u16(), 401 | 403 | 404) {
            return Ok(Got::Status(status.as_u16()));
        }
        if !status.is_success() {
            return Err(self.fail(full, format!("loadTable: HTTP {status}")));
        }
        bounded(answer, MAX_ANSWER_BYTES)
            .await
            .map(Got::Body)
            .map_err(|e| self.fail(full, format!("loadTable: {e}")))
    }
}

/// An answer: a body, or a status that refuses.
enum Got {
    Body(Vec<u8>),
    Status(u16),
}

/// The body, refused once it passes `max` bytes.
async fn bounded(
    mut answer: reqwest::Response,
    max: usize,
) -> std::result::Result<Vec<u8>, String> {
    if answer.content_length().is_some_and(|n| n > max as u64) {
        return Err(format!("answer larger than {max} bytes"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(without_url)? {
        if body.len() + chunk.len() > max {
            return Err(format!("answer larger than {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error and its causes on one line, without its URL (which names the table,
/// already in the message).
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut out = e.to_string();
    let mut cur = std::error::Error::source(&e);
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out.replace('\n', " ")
}

/// Percent-encodes a path segment or query value (RFC 3986 unreserved kept).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The top-level fields of the answer's current schema.
fn current_fields(meta: &AnswerMetadata) -> Option<Vec<(i32, String)>> {
    let id = meta.current_schema_id?;
    let schema = meta.schemas.iter().find(|s| s.schema_id == Some(id))?;
    schema
        .fields
        .iter()
        .map(|f| Some((i32::try_from(f.id).ok()?, f.name.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_never_formatted() {
        let t = Token::new("s3cr3t");
        assert!(!format!("{t:?}").contains("s3cr3t"));
        let c = EngineCredential::Token(t);
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(encode("a b/c\u{1f}"), "a%20b%2Fc%1F");
        assert_eq!(encode("sales_2024"), "sales_2024");
    }

    #[test]
    fn current_fields_come_from_the_current_schema() {
        let v = serde_json::json!({"metadata": {"current-schema-id": 1, "schemas": [
            {"schema-id": 0, "fields": [{"id": 1, "name": "old"}]},
            {"schema-id": 1, "fields": [{"id": 1, "name": "id"}, {"id": 2, "name": "region"}]}
        ]}});
        let a: Answer = serde_json::from_value(v).unwrap();
        assert_eq!(
            current_fields(&a.metadata).unwrap(),
            [(1, "id".to_owned()), (2, "region".to_owned())]
        );
        let a: Answer = serde_json::from_value(serde_json::json!({"metadata": {}})).unwrap();
        assert!(current_fields(&a.metadata).is_none());
    }
}
