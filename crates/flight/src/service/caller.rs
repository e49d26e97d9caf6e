//! Who a call is: the bearer token or Basic login of a call, `Handshake`, and the engine
//! session a call runs in (its user, crypto-provider token and Flight session options).

use std::pin::Pin;

use arrow_flight::{HandshakeRequest, HandshakeResponse};
use clearice_engine::Session;
use futures::Stream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::AuthError;
use crate::error::{auth_status, status_of};
use crate::session::{CATALOG, SCHEMA, SessionOptions};

use super::ClearIceFlightSql;

/// Headers a client may use to pass its own token for the crypto providers.
const KMS_TOKEN_HEADERS: [&str; 2] = ["key_access_token", "kms_token"];

/// The client of a call, for audit records: its address.
fn client_of<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "flight".into())
}

/// The bearer token of a call, if it carries one.
pub(super) fn bearer<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

impl ClearIceFlightSql {
    /// The engine session of a call: its authenticated user, with the options of its
    /// Flight session (if it set any).
    pub(super) async fn session<T>(&self, request: &Request<T>) -> Result<Session, Status> {
        self.session_with(request, true).await
    }

    /// The status of a refused login or call; failed and throttled logins are audited.
    async fn auth_refused(&self, e: &AuthError, client: &str) -> Status {
        if matches!(e, AuthError::Invalid { .. } | AuthError::Throttled { .. }) {
            tracing::info!(user = e.user(), client, error = %e, "login refused");
            if let Err(a) = self
                .engine
                .audit_event("login", e.user(), client, "login", &e.to_string())
                .await
            {
                tracing::error!(error = %a, "audit record not written");
            }
        }
        auth_status(e)
    }

    /// [`Self::session`]; with `strict = false` session options that no longer apply (a
    /// namespace dropped since) are skipped instead of failing the call, so the session
    /// actions can still repair or close the session.
    pub(super) async fn session_with<T>(
        &self,
        request: &Request<T>,
        strict: bool,
    ) -> Result<Session, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let client = client_of(request);
        let user = match self
            .auth
            .authenticate(header, request.remote_addr().map(|a| a.ip()))
            .await
        {
            Ok(u) => u,
            Err(e) => return Err(self.auth_refused(&e, &client).await),
        };
        // A per-user token for the crypto providers (PyArrow's key_access_token; a JDBC
        // URL parameter arrives as a header): remote providers send it instead of their
        // own credentials, so the service decides for the token's holder. Without a
        // provider that takes tokens it would be silently ignored: refuse it instead.
        let mut credential = None;
        if let Some(name) = KMS_TOKEN_HEADERS
            .iter()
            .find(|h| request.metadata().contains_key(**h))
        {
            if !self.engine.takes_provider_tokens() {
                return Err(Status::invalid_argument(format!(
                    "'{name}' was sent, but no configured crypto provider takes per-user tokens (the KMS is {}; add a remote provider)",
                    self.engine
                        .key_resolver()
                        .kms()
                        .map_or("none", |k| k.name())
                )));
            }
            let token = request
                .metadata()
                .get(*name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    Status::invalid_argument(format!("'{name}' is empty or not ASCII"))
                })?;
            credential = Some(clearice_engine::AccessToken::new(token));
        }
        let session = self
            .engine
            .session_as(clearice_engine::Caller::network(user, client, credential));
        // `catalog` and `schema` headers (a JDBC URL's or a SQLAlchemy URL's parameters
        // arrive as headers) set the namespace of each call; the session's own options,
        // set later, win over them.
        let header_of = |name: &str| -> Result<Option<&str>, Status> {
            match request.metadata().get(name) {
                None => Ok(None),
                Some(v) => match v.to_str().map(str::trim) {
                    Ok("") => Ok(None),
                    Ok(v) => Ok(Some(v)),
                    Err(_) if strict => Err(Status::invalid_argument(format!(
                        "header '{name}' is not ASCII"
                    ))),
                    Err(_) => Ok(None),
                },
            }
        };
        let (catalog, schema) = (header_of(CATALOG)?, header_of(SCHEMA)?);
        if catalog.is_some() || schema.is_some() {
            // A namespace created since the last listing counts.
            session.refresh_catalogs().await;
            if let Err(e) = session.use_namespace(catalog, schema)
                && strict
            {
                return Err(Status::invalid_argument(format!(
                    "headers 'catalog'/'schema': {}",
                    clearice_engine::message_of(&e)
                )));
            }
        }
        if let Some(token) = bearer(request) {
            let options = self.sessions.get(token);
            if options != SessionOptions::default()
                && let Err(e) =
                    session.use_namespace(options.catalog.as_deref(), options.schema.as_deref())
                && strict
            {
                return Err(status_of(&e));
            }
            for (name, value) in &options.settings {
                if let Err(e) = session.set_option(name, value)
                    && strict
                {
                    return Err(status_of(&e));
                }
            }
        }
        Ok(session)
    }

    /// `Handshake`: a Basic login, or a bearer token kept as the session's; the token
    /// is the reply's payload and `authorization` header.
    pub(super) async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                clearice_metrics::login_failed(clearice_metrics::LoginFailure::Missing);
                Status::unauthenticated(
                    "Handshake needs 'authorization: Basic ...' credentials or a bearer token",
                )
            })?;
        let client = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "flight".into());
        // A client holding a token (the JDBC driver's `token=` property) handshakes with
        // `Bearer`: the token stays the session's, as long as it is valid.
        let (user, token) = match header.strip_prefix("Bearer ") {
            Some(t) => {
                let t = t.trim();
                let user = match self.auth.authenticate(Some(header), None).await {
                    Ok(u) => u,
                    Err(e) => return Err(self.auth_refused(&e, &client).await),
                };
                (user, t.to_owned())
            }
            None => match self
                .auth
                .login(header, request.remote_addr().map(|a| a.ip()))
                .await
            {
                Ok(found) => found,
                Err(e) => return Err(self.auth_refused(&e, &client).await),
            },
        };
        self.auth.prune();
        self.sessions.retain(|t| self.auth.token_valid(t));
        tracing::info!(user, client = ?request.remote_addr(), "login");
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(futures::stream::iter(vec![Ok(reply)])));
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("token header"))?;
        response.metadata_mut().insert("authorization", value);
        Ok(response)
    }
}
