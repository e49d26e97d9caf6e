//! Users (argon2 password hashes), bearer tokens, and login throttling.
//!
//! - Passwords are checked with argon2 off the async workers; a user name that does not
//!   exist is checked against a real hash too, so timing and messages do not tell which
//!   names exist.
//! - Verified `Basic` credentials are remembered (by SHA-256 of user and password) for a
//!   token lifetime: a client sending `Basic` on every call costs one argon2 check per
//!   token lifetime, not one per call.
//! - Failed logins are throttled so that guessing is slow but nobody can lock a real user
//!   out. Anyone can send a wrong password for `admin`, so failures for a user name alone
//!   never refuse a login; what refuses is what the client itself did:
//!   - per (user name, client address): after `login_free_failures` failures for that
//!     user from that address, each further attempt must wait, the wait doubling from
//!     250 ms up to `login_backoff_max_ms`;
//!   - per client address, across user names: the same count and wait, so one address
//!     guessing many users is slowed as much as one guessing one user.
//!
//!   An attempt during its wait is refused without checking the password (so guessing is
//!   slowed whether or not the guess is right). A success resets only its own (user,
//!   address) counter: an attacker logging in to its own account does not clear its
//!   address's count.
//! - A brake per user name across all addresses (many addresses guessing one user) only
//!   *delays* each attempt for that user, by the same doubling wait but never more than
//!   1 s (`USER_BRAKE_MAX`), and never refuses: a right password from an address without
//!   failures of its own succeeds, at worst 1 s late. An address that logged in as the
//!   user within the token lifetime is not braked for that user.
//!
//!   Distributed guessing is thus bounded per address, not per user: argon2 and strong
//!   passwords carry the rest.
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
    /// Too many failed logins from this client address, for this user name or across
    /// user names (failures from other addresses never refuse a login).
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
    /// The reason counted in `clearice_login_failures_total` (never the name sent).
    fn counted(&self) -> clearice_metrics::LoginFailure {
        use clearice_metrics::LoginFailure as F;
        match self {
            Self::Missing => F::Missing,
            Self::Malformed | Self::EmptyPassword { .. } => F::Malformed,
            Self::Invalid { .. } => F::InvalidCredentials,
            Self::Throttled { .. } => F::Throttled,
            Self::BadToken => F::InvalidToken,
        }
    }

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
    /// (user, address) pairs that logged in recently, until when: not braked.
    recent: Mutex<HashMap<String, Instant>>,
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

/// Counters kept at most, per map (failures by pair, address or user; recent logins).
const MAX_TRACKED: usize = 100_000;

/// First wait after the free failures.
const BACKOFF_START: Duration = Duration::from_millis(250);

/// Longest delay the per-user brake (failures from all addresses) adds to an attempt.
const USER_BRAKE_MAX: Duration = Duration::from_secs(1);

/// The throttling counters one login attempt touches.
#[derive(Debug)]
struct ThrottleKeys {
    /// (user, address): refuses during its wait.
    pair: String,
    /// The address across users: refuses during its wait (absent without an address).
    addr: Option<String>,
    /// The user across addresses: only delays, by at most [`USER_BRAKE_MAX`].
    user: String,
}

impl ThrottleKeys {
    fn new(user: &str, addr: Option<IpAddr>) -> Self {
        // Clients without a known address (in-process transports) share one.
        let a = addr.map_or_else(|| "-".to_owned(), |a| a.to_string());
        Self {
            pair: format!("pair:{a}:{user}"),
            addr: addr.map(|a| format!("addr:{a}")),
            user: format!("user:{user}"),
        }
    }

    /// The counters that refuse an attempt during their wait.
    fn refusing(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.pair).chain(&self.addr)
    }

    fn all(&self) -> impl Iterator<Item = &String> {
        self.refusing().chain(std::iter::once(&self.user))
    }
}

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
            recent: Mutex::default(),
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
                clearice_metrics::sessions(tokens.len());
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
        let mut tokens = self.tokens.lock().expect("tokens");
        tokens.retain(|_, (_, exp)| *exp > now);
        clearice_metrics::sessions(tokens.len());
        drop(tokens);
        self.verified
            .lock()
            .expect("verified")
            .retain(|_, (_, exp)| *exp > now);
        let stale = self.backoff_max * 2;
        self.failures
            .lock()
            .expect("failures")
            .retain(|_, f| now.duration_since(f.last) < stale);
        self.recent
            .lock()
            .expect("recent")
            .retain(|_, until| *until > now);
    }

    /// The wait after `count` failures (none within the free failures).
    fn backoff(&self, count: u32) -> Option<Duration> {
        let over = count.checked_sub(self.free_failures)?.checked_sub(1)?;
        Some((BACKOFF_START * 2u32.pow(over.min(16))).min(self.backoff_max))
    }

    /// How long this client must still wait: its own (user, address) counter and its
    /// address's counter. Failures of other addresses never count here.
    fn throttled(&self, keys: &ThrottleKeys) -> Option<Duration> {
        let now = Instant::now();
        let failures = self.failures.lock().expect("failures");
        keys.refusing()
            .filter_map(|k| failures.get(k))
            .filter(|f| f.until > now)
            .map(|f| f.until - now)
            .max()
    }

    /// The delay of the per-user brake: failures for the user from any address slow each
    /// attempt down, at most [`USER_BRAKE_MAX`]; an address that logged in as the user
    /// within the token lifetime is not braked.
    fn brake(&self, keys: &ThrottleKeys) -> Option<Duration> {
        let now = Instant::now();
        if self
            .recent
            .lock()
            .expect("recent")
            .get(&keys.pair)
            .is_some_and(|until| *until > now)
        {
            return None;
        }
        let stale = self.backoff_max * 2;
        let count = self
            .failures
            .lock()
            .expect("failures")
            .get(&keys.user)
            .filter(|f| now.duration_since(f.last) < stale)
            .map(|f| f.count)?;
        self.backoff(count).map(|d| d.min(USER_BRAKE_MAX))
    }

    fn record_success(&self, keys: &ThrottleKeys) {
        // Only this client's own counter: the address's count across users stays (an
        // attacker with an account of its own cannot clear it), and so does the user's
        // brake (a real user's login does not clear it for the attacker).
        self.failures.lock().expect("failures").remove(&keys.pair);
        let now = Instant::now();
        let mut recent = self.recent.lock().expect("recent");
        if recent.len() >= MAX_TRACKED {
            recent.retain(|_, until| *until > now);
        }
        // Beyond the cap the pair is simply not exempt from the brake.
        if recent.len() < MAX_TRACKED || recent.contains_key(&keys.pair) {
            recent.insert(keys.pair.clone(), now + self.ttl);
        }
    }

    fn record_failure(&self, keys: &ThrottleKeys) {
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
        for k in keys.all() {
            let f = failures.entry(k.clone()).or_insert(Failures {
                count: 0,
                last: now,
                until: now,
            });
            if now.duration_since(f.last) >= stale {
                f.count = 0;
            }
            f.count = f.count.saturating_add(1);
            f.last = now;
            if let Some(wait) = self.backoff(f.count) {
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
        let user = self
            .verify_basic(header, addr)
            .await
            .inspect_err(|e| clearice_metrics::login_failed(e.counted()))?;
        let token = hex::encode(rand::random::<[u8; 32]>());
        let mut tokens = self.tokens.lock().expect("tokens");
        tokens.insert(
            digest(&[token.as_bytes()]),
            (user.clone(), Instant::now() + self.ttl),
        );
        clearice_metrics::sessions(tokens.len());
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
        // Throttle first: remembered credentials must not answer a guess during a backoff
        // (nor before the brake's delay).
        let keys = ThrottleKeys::new(user, addr);
        let refuse = |retry_after| AuthError::Throttled {
            user: user.into(),
            retry_after,
        };
        if let Some(retry_after) = self.throttled(&keys) {
            return Err(refuse(retry_after));
        }
        if let Some(delay) = self.brake(&keys) {
            tokio::time::sleep(delay).await;
            // Failures of this client's other attempts meanwhile count.
            if let Some(retry_after) = self.throttled(&keys) {
                return Err(refuse(retry_after));
            }
        }
        let remembered = digest(&[user.as_bytes(), password.as_bytes()]);
        let known_good = self
            .verified
            .lock()
            .expect("verified")
            .get(&remembered)
            .filter(|(_, exp)| *exp > Instant::now())
            .map(|(u, _)| u.clone());
        if let Some(u) = known_good {
            self.record_success(&keys);
            return Ok(u);
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
        self.record_success(&keys);
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
        let user = match header {
            None => Err(AuthError::Missing),
            Some(h) => match h.strip_prefix("Bearer ") {
                Some(token) => self.token_user(token.trim()).ok_or(AuthError::BadToken),
                None => self.verify_basic(h, addr).await,
            },
        };
        user.inspect_err(|e| clearice_metrics::login_failed(e.counted()))
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

    fn auth_users(free: u32, max_ms: u64, users: &[(&str, &str)]) -> Auth {
        let mut toml = format!("login_free_failures = {free}\nlogin_backoff_max_ms = {max_ms}\n");
        for (u, pw) in users {
            toml.push_str(&format!("[users.{u}]\npassword_hash = \"{}\"\n", hash(pw)));
        }
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
        // Counters reset 2 × login_backoff_max_ms after the last failure: well beyond an
        // argon2 check in a debug build on a loaded machine (about a second).
        let a = auth(2, 5_000);
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

    #[tokio::test]
    async fn wrong_passwords_from_one_address_do_not_lock_out_another() {
        let a = auth_users(2, 60_000, &[("admin", "right")]);
        let outsider: IpAddr = "203.0.113.7".parse().unwrap();
        let admin_ip: IpAddr = "198.51.100.1".parse().unwrap();
        for _ in 0..3 {
            assert!(matches!(
                a.login(&basic("admin", "guess"), Some(outsider)).await,
                Err(AuthError::Invalid { .. })
            ));
        }
        assert!(matches!(
            a.login(&basic("admin", "guess"), Some(outsider)).await,
            Err(AuthError::Throttled { .. })
        ));
        // ...and it keeps guessing after each wait (as a failed login records it).
        for _ in 0..4 {
            a.record_failure(&ThrottleKeys::new("admin", Some(outsider)));
        }
        // The real admin, from an address without failures of its own, gets in.
        let (user, _) = a
            .login(&basic("admin", "right"), Some(admin_ip))
            .await
            .unwrap();
        assert_eq!(user, "admin");
        // The outsider stays throttled, even with the right password, and the admin's
        // success does not clear that.
        assert!(matches!(
            a.login(&basic("admin", "right"), Some(outsider)).await,
            Err(AuthError::Throttled { .. })
        ));
    }

    #[tokio::test]
    async fn one_address_guessing_many_users_is_throttled() {
        let a = auth_users(2, 60_000, &[("ann", "secret")]);
        let guesser: IpAddr = "203.0.113.8".parse().unwrap();
        for u in ["u1", "u2", "u3"] {
            assert!(matches!(
                a.login(&basic(u, "guess"), Some(guesser)).await,
                Err(AuthError::Invalid { .. })
            ));
        }
        // One failure per user name, but three from the address: a fourth name waits.
        assert!(matches!(
            a.login(&basic("ann", "secret"), Some(guesser)).await,
            Err(AuthError::Throttled { .. })
        ));
        // Another address is not affected.
        let other: IpAddr = "198.51.100.2".parse().unwrap();
        a.login(&basic("ann", "secret"), Some(other)).await.unwrap();
    }

    #[tokio::test]
    async fn failures_from_many_addresses_only_delay_the_user_a_bounded_time() {
        let a = auth_users(1, 60_000, &[("admin", "right")]);
        // One failure each from 8 addresses (as a failed login records it).
        for i in 0..8u8 {
            a.record_failure(&ThrottleKeys::new(
                "admin",
                Some(IpAddr::from([203, 0, 113, i])),
            ));
        }
        // 8 failures for admin: the doubling wait would be 16 s, the brake stays at 1 s.
        let fresh: IpAddr = "198.51.100.3".parse().unwrap();
        let keys = ThrottleKeys::new("admin", Some(fresh));
        assert_eq!(a.throttled(&keys), None);
        assert_eq!(a.brake(&keys), Some(USER_BRAKE_MAX));
        let t = Instant::now();
        a.login(&basic("admin", "right"), Some(fresh))
            .await
            .unwrap();
        assert!(t.elapsed() >= USER_BRAKE_MAX);
        // An address that just logged in as admin is not braked for admin.
        assert_eq!(a.brake(&keys), None);
    }
}
