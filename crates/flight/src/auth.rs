//! Users (argon2 password hashes), bearer tokens, and login throttling.
//!
//! - Passwords are checked with argon2 off the async workers; a user name that does not
//!   exist is checked against a real hash too, so timing and messages do not tell which
//!   names exist.
//! - Verified `Basic` credentials are remembered (by SHA-256 of user and password) for a
//!   token lifetime: a client sending `Basic` on every call costs one argon2 check per
//!   token lifetime, not one per call.
//! - Failed logins are counted per user name and per client address; after
//!   `login_free_failures` each further attempt must wait, the wait doubling from 250 ms up
//!   to `login_backoff_max_ms`. An attempt during the wait is refused without checking the
//!   password (so guessing is slowed whether or not the guess is right).
//! - Tokens are 256-bit random values, stored as SHA-256 digests, bound to the user who
//!   logged in and to an expiry.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordVerifier};
use base64::Engine as _;
use base64::prelude::{BASE64_STANDARD, BASE64_STANDARD_NO_PAD};
use clearice_engine::ServerConfig;
use datafusion::common::runtime::SpawnedTask;
use sha2::{Digest, Sha256};

/// Why a login or a call's credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `authorization` header.
    #[error(
        "missing 'authorization' header: log in with Handshake (Basic) and send the bearer token"
    )]
    Missing,
    /// Not `Basic` credentials where they were expected, or not decodable.
    #[error("malformed credentials: expected 'authorization: Basic base64(user:password)'")]
    Malformed,
    /// An empty password.
    #[error("empty password for user '{user}'")]
    EmptyPassword {
        /// The user name sent.
        user: String,
    },
    /// Wrong user name or password (the same for both, so names cannot be probed).
    #[error("invalid user name or password for '{user}'")]
    Invalid {
        /// The user name sent.
        user: String,
    },
    /// Too many failed logins for this user name or client address.
    #[error(
        "too many failed logins for user '{user}' or this client address: retry in {} ms",
        retry_after.as_millis()
    )]
    Throttled {
        /// The user name sent.
        user: String,
        /// How long until an attempt is considered again.
        retry_after: Duration,
    },
    /// Unknown or expired bearer token.
    #[error("bearer token is invalid or expired; log in again")]
    BadToken,
}

impl AuthError {
    /// The user name the client sent, if any (for the audit record).
    pub fn user(&self) -> &str {
        match self {
            AuthError::EmptyPassword { user }
            | AuthError::Invalid { user }
            | AuthError::Throttled { user, .. } => user,
            AuthError::Missing | AuthError::Malformed | AuthError::BadToken => "",
        }
    }
}

type Digest32 = [u8; 32];

fn digest(parts: &[&[u8]]) -> Digest32 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    until: Instant,
}

/// Verifies passwords and issues/validates bearer tokens.
pub struct Auth {
    users: Arc<HashMap<String, String>>,
    /// A real hash to check unknown user names against (same cost as a real check).
    dummy_hash: Option<String>,
    tokens: Mutex<HashMap<Digest32, (String, Instant)>>,
    verified: Mutex<HashMap<Digest32, (String, Instant)>>,
    failures: Mutex<HashMap<String, Failures>>,
    ttl: Duration,
    free_failures: u32,
    backoff_max: Duration,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Failure counters kept at most (user names and client addresses).
const MAX_TRACKED: usize = 100_000;

/// First wait after the free failures.
const BACKOFF_START: Duration = Duration::from_millis(250);

impl Auth {
    /// From `[server]`.
    pub fn new(config: &ServerConfig) -> Self {
        let users: HashMap<String, String> = config
            .users
            .iter()
            .map(|(u, c)| (u.clone(), c.password_hash.clone()))
            .collect();
        Self {
            dummy_hash: users.values().next().cloned(),
            users: Arc::new(users),
            tokens: Mutex::default(),
            verified: Mutex::default(),
            failures: Mutex::default(),
            ttl: Duration::from_secs(config.token_ttl_s.unwrap_or(3600)),
            free_failures: config.login_free_failures.unwrap_or(3),
            backoff_max: Duration::from_millis(config.login_backoff_max_ms.unwrap_or(30_000)),
        }
    }

    /// Lifetime of a bearer token.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn token_user(&self, token: &str) -> Option<String> {
        let key = digest(&[token.as_bytes()]);
        let mut tokens = self.tokens.lock().expect("tokens");
        match tokens.get(&key) {
            Some((user, expires)) if *expires > Instant::now() => Some(user.clone()),
            Some(_) => {
                tokens.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Whether a bearer token is known and not expired.
    pub fn token_valid(&self, token: &str) -> bool {
        self.token_user(token).is_some()
    }

    /// Forgets expired tokens and remembered credentials.
    pub fn prune(&self) {
        let now = Instant::now();
        self.tokens
            .lock()
            .expect("tokens")
            .retain(|_, (_, exp)| *exp > now);
        self.verified
            .lock()
            .expect("verified")
            .retain(|_, (_, exp)| *exp > now);
        let stale = self.backoff_max * 2;
        self.failures
            .lock()
            .expect("failures")
            .retain(|_, f| now.duration_since(f.last) < stale);
    }

    fn throttle_keys(user: &str, addr: Option<IpAddr>) -> Vec<String> {
        let mut keys = vec![format!("user:{user}")];
        if let Some(a) = addr {
            keys.push(format!("addr:{a}"));
        }
        keys
    }

    fn throttled(&self, keys: &[String]) -> Option<Duration> {
        let now = Instant::now();
        let failures = self.failures.lock().expect("failures");
        keys.iter()
            .filter_map(|k| failures.get(k))
            .filter(|f| f.until > now)
            .map(|f| f.until - now)
            .max()
    }

    fn record_failure(&self, keys: &[String]) {
        let now = Instant::now();
        let stale = self.backoff_max * 2;
        let mut failures = self.failures.lock().expect("failures");
        // Bounded: a client sending many different user names must not grow this without
        // limit. Stale counters go first; beyond the cap, counters still within their free
        // failures (not throttling anyone) go too.
        if failures.len() >= MAX_TRACKED {
            failures.retain(|_, f| now.duration_since(f.last) < stale);
        }
        if failures.len() >= MAX_TRACKED {
            let free = self.free_failures;
            failures.retain(|_, f| f.count > free);
        }
        for k in keys {
            let f = failures.entry(k.clone()).or_insert(Failures {
                count: 0,
                last: now,
                until: now,
            });
            if now.duration_since(f.last) >= stale {
                f.count = 0;
            }
            f.count += 1;
            f.last = now;
            if f.count > self.free_failures {
                let exp = (f.count - self.free_failures - 1).min(16);
                let wait = (BACKOFF_START * 2u32.pow(exp)).min(self.backoff_max);
                f.until = now + wait;
            }
        }
    }

    /// Checks `Basic` credentials (a valid token is accepted as the password, with any
    /// user name) and issues a bearer token. Returns (user, token).
    pub async fn login(
        &self,
        header: &str,
        addr: Option<IpAddr>,
    ) -> Result<(String, String), AuthError> {
        let user = self.verify_basic(header, addr).await?;
        let token = hex::encode(rand::random::<[u8; 32]>());
        self.tokens.lock().expect("tokens").insert(
            digest(&[token.as_bytes()]),
            (user.clone(), Instant::now() + self.ttl),
        );
        Ok((user, token))
    }

    async fn verify_basic(&self, header: &str, addr: Option<IpAddr>) -> Result<String, AuthError> {
        let encoded = header
            .strip_prefix("Basic ")
            .ok_or(AuthError::Malformed)?
            .trim();
        // Clients differ in padding (Go's Flight client sends unpadded base64).
        let decoded = BASE64_STANDARD
            .decode(encoded)
            .or_else(|_| BASE64_STANDARD_NO_PAD.decode(encoded.trim_end_matches('=')))
            .map_err(|_| AuthError::Malformed)?;
        let decoded = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
        let (user, password) = decoded.split_once(':').ok_or(AuthError::Malformed)?;
        if password.is_empty() {
            return Err(AuthError::EmptyPassword { user: user.into() });
        }
        if let Some(u) = self.token_user(password) {
            return Ok(u);
        }
        // Throttle first: remembered credentials must not answer a guess during a backoff.
        let keys = Self::throttle_keys(user, addr);
        if let Some(retry_after) = self.throttled(&keys) {
            return Err(AuthError::Throttled {
                user: user.into(),
                retry_after,
            });
        }
        let remembered = digest(&[user.as_bytes(), password.as_bytes()]);
        if let Some((u, exp)) = self.verified.lock().expect("verified").get(&remembered)
            && *exp > Instant::now()
        {
            return Ok(u.clone());
        }
        let hash = self
            .users
            .get(user)
            .cloned()
            .or_else(|| self.dummy_hash.clone());
        let known = self.users.contains_key(user);
        let pw = password.to_owned();
        // argon2 costs tens of milliseconds of CPU: not on an async worker.
        let ok = SpawnedTask::spawn_blocking(move || {
            hash.is_some_and(|h| {
                PasswordHash::new(&h)
                    .is_ok_and(|p| Argon2::default().verify_password(pw.as_bytes(), &p).is_ok())
            })
        })
        .join()
        .await
        .unwrap_or(false)
            && known;
        if !ok {
            self.record_failure(&keys);
            return Err(AuthError::Invalid { user: user.into() });
        }
        self.failures
            .lock()
            .expect("failures")
            .remove(&format!("user:{user}"));
        self.verified
            .lock()
            .expect("verified")
            .insert(remembered, (user.to_owned(), Instant::now() + self.ttl));
        Ok(user.to_owned())
    }

    /// The principal of a call: `Bearer` token (or `Basic` credentials) in `authorization`.
    pub async fn authenticate(
        &self,
        header: Option<&str>,
        addr: Option<IpAddr>,
    ) -> Result<String, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        if let Some(token) = header.strip_prefix("Bearer ") {
            return self.token_user(token.trim()).ok_or(AuthError::BadToken);
        }
        self.verify_basic(header, addr).await
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    fn auth(free: u32, max_ms: u64) -> Auth {
        let toml = format!(
            "login_free_failures = {free}\nlogin_backoff_max_ms = {max_ms}\n[users.ann]\npassword_hash = \"{}\"\n",
            hash("secret")
        );
        let config: ServerConfig = toml::from_str(&toml).unwrap();
        Auth::new(&config)
    }

    fn hash(pw: &str) -> String {
        use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
        Argon2::default()
            .hash_password(pw.as_bytes(), &SaltString::generate(&mut OsRng))
            .unwrap()
            .to_string()
    }

    fn basic(user: &str, pw: &str) -> String {
        format!("Basic {}", BASE64_STANDARD.encode(format!("{user}:{pw}")))
    }

    #[tokio::test]
    async fn unknown_user_and_wrong_password_read_alike() {
        let a = auth(10, 1000);
        let e1 = a.login(&basic("ann", "nope"), None).await.unwrap_err();
        let e2 = a.login(&basic("bob", "nope"), None).await.unwrap_err();
        assert_eq!(
            e1.to_string().replace("'ann'", "U"),
            e2.to_string().replace("'bob'", "U")
        );
    }

    #[tokio::test]
    async fn failures_beyond_the_free_ones_are_throttled_then_the_right_password_works() {
        let a = auth(2, 400);
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        for _ in 0..2 {
            assert!(matches!(
                a.login(&basic("ann", "x"), Some(ip)).await,
                Err(AuthError::Invalid { .. })
            ));
        }
        // The third failure starts a backoff: even the right password waits.
        assert!(a.login(&basic("ann", "x"), Some(ip)).await.is_err());
        assert!(matches!(
            a.login(&basic("ann", "secret"), Some(ip)).await,
            Err(AuthError::Throttled { .. })
        ));
        tokio::time::sleep(Duration::from_millis(450)).await;
        let (user, token) = a.login(&basic("ann", "secret"), Some(ip)).await.unwrap();
        assert_eq!(user, "ann");
        assert_eq!(
            a.authenticate(Some(&format!("Bearer {token}")), None)
                .await
                .unwrap(),
            "ann"
        );
    }

    #[tokio::test]
    async fn remembered_credentials_do_not_answer_during_a_backoff() {
        let a = auth(1, 60_000);
        a.login(&basic("ann", "secret"), None).await.unwrap();
        for _ in 0..2 {
            let _ = a.login(&basic("ann", "guess"), None).await;
        }
        assert!(matches!(
            a.login(&basic("ann", "secret"), None).await,
            Err(AuthError::Throttled { .. })
        ));
    }

    #[tokio::test]
    async fn basic_on_every_call_is_verified_once() {
        let a = auth(3, 1000);
        let h = basic("ann", "secret");
        a.authenticate(Some(&h), None).await.unwrap();
        let t = Instant::now();
        for _ in 0..50 {
            a.authenticate(Some(&h), None).await.unwrap();
        }
        // 50 argon2 checks take seconds; remembered credentials take microseconds.
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // Nothing is issued per call.
        assert!(a.tokens.lock().unwrap().is_empty());
    }
}
