//! Users (argon2 password hashes) and bearer tokens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordVerifier};
use base64::Engine as _;
use base64::prelude::{BASE64_STANDARD, BASE64_STANDARD_NO_PAD};
use clearice_engine::ServerConfig;
use tonic::Status;

/// Verifies passwords and issues/validates bearer tokens.
pub struct Auth {
    users: HashMap<String, String>,
    tokens: Mutex<HashMap<String, (String, Instant)>>,
    ttl: Duration,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Auth {
    /// From `[server]`.
    pub fn new(config: &ServerConfig) -> Self {
        Self {
            users: config
                .users
                .iter()
                .map(|(u, c)| (u.clone(), c.password_hash.clone()))
                .collect(),
            tokens: Mutex::default(),
            ttl: Duration::from_secs(config.token_ttl_s.unwrap_or(3600)),
        }
    }

    fn verify_password(&self, user: &str, password: &str) -> bool {
        let Some(hash) = self.users.get(user) else {
            return false;
        };
        let Ok(parsed) = PasswordHash::new(hash) else {
            return false;
        };
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    }

    fn token_user(&self, token: &str) -> Option<String> {
        let mut tokens = self.tokens.lock().expect("tokens");
        match tokens.get(token) {
            Some((user, expires)) if *expires > Instant::now() => Some(user.clone()),
            Some(_) => {
                tokens.remove(token);
                None
            }
            None => None,
        }
    }

    /// Lifetime of a bearer token.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether a bearer token is known and not expired.
    pub fn token_valid(&self, token: &str) -> bool {
        self.token_user(token).is_some()
    }

    /// Checks `Basic` credentials (a valid token is accepted as the password, with any
    /// user name) and issues a bearer token. Returns (user, token).
    pub fn login(&self, header: &str) -> Result<(String, String), Status> {
        let encoded = header.strip_prefix("Basic ").ok_or_else(|| {
            Status::unauthenticated("expected 'authorization: Basic ...' credentials")
        })?;
        // Clients differ in padding (Go's Flight client sends unpadded base64).
        let encoded = encoded.trim();
        let decoded = BASE64_STANDARD
            .decode(encoded)
            .or_else(|_| BASE64_STANDARD_NO_PAD.decode(encoded.trim_end_matches('=')))
            .map_err(|_| Status::unauthenticated("malformed Basic credentials"))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| Status::unauthenticated("malformed Basic credentials"))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| Status::unauthenticated("malformed Basic credentials"))?;
        if password.is_empty() {
            return Err(Status::unauthenticated(format!(
                "empty password for user '{user}'"
            )));
        }
        let user = if let Some(u) = self.token_user(password) {
            u
        } else if self.verify_password(user, password) {
            user.to_owned()
        } else {
            return Err(Status::unauthenticated(format!(
                "invalid user name or password for '{user}'"
            )));
        };
        let token = hex::encode(rand::random::<[u8; 32]>());
        self.tokens
            .lock()
            .expect("tokens")
            .insert(token.clone(), (user.clone(), Instant::now() + self.ttl));
        Ok((user, token))
    }

    /// The principal of a call: `Bearer` token (or `Basic` credentials) in `authorization`.
    pub fn authenticate(&self, header: Option<&str>) -> Result<String, Status> {
        let header = header.ok_or_else(|| {
            Status::unauthenticated("missing 'authorization' header: log in with Handshake (Basic) and send the bearer token")
        })?;
        if let Some(token) = header.strip_prefix("Bearer ") {
            return self.token_user(token.trim()).ok_or_else(|| {
                Status::unauthenticated("bearer token is invalid or expired; log in again")
            });
        }
        self.login(header).map(|(u, _)| u)
    }
}
