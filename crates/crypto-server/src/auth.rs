//! Caller authentication: bearer JWTs (HS256 shared secrets, RS256/ES256 public keys),
//! with expiry, audience and (optionally) issuer checked.
//!
//! A caller may name the user it acts for (`access.user_id`) only if its token is signed
//! with a services' secret and its subject is in `trusted_services`: the key that
//! verified the token decides, not the subject alone, because an identity provider may
//! well issue a user the subject `clearice`. Such a user token acts for its own subject.
//!
//! | verified by | subject in `trusted_services` | subject not in it |
//! |---|---|---|
//! | `service_secret_file` | service: names the user | refused |
//! | `hs256_secret_file`, no `service_secret_file` (older configs) | service: names the user | the subject |
//! | identity-provider keys; `hs256_secret_file` next to `service_secret_file` | the subject | the subject |

use std::collections::BTreeSet;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::Error;
use crate::config::Config;

/// Who a verified token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's subject.
    pub subject: String,
    /// The user decisions are made for: the subject, or, for a trusted service (subject
    /// in `trusted_services` and token signed with the services' secret), the user it
    /// names.
    pub user: String,
    /// Roles: the token's `roles` claim (users' own tokens) and the configured roles.
    pub roles: BTreeSet<String>,
    /// A trusted service acting for [`Caller::user`] (not a user's own token).
    pub service: bool,
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    roles: Vec<String>,
}

/// Who holds the key that verified a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signer {
    /// `service_secret_file`: the trusted services only.
    Services,
    /// `hs256_secret_file` without a `service_secret_file`: the services' shared secret of
    /// older configs, also used for users' HS256 tokens.
    SharedSecret,
    /// Identity-provider keys, and `hs256_secret_file` next to a `service_secret_file`.
    Users,
}

/// Verifies tokens.
pub struct Verifier {
    /// Tried in order among those of the token's algorithm (the services' secret first).
    keys: Vec<(Algorithm, DecodingKey, Signer)>,
    audience: String,
    issuer: Option<String>,
    leeway: u64,
    trusted: BTreeSet<String>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field(
                "algorithms",
                &self
                    .keys
                    .iter()
                    .map(|(a, _, s)| (*a, *s))
                    .collect::<Vec<_>>(),
            )
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Loads the configured keys (blocking: startup).
    #[expect(clippy::disallowed_methods, reason = "startup, before serving")]
    pub fn new(config: &Config) -> Result<Self, Error> {
        let read = |p: &std::path::Path| {
            let p = config.resolve(p);
            std::fs::read(&p).map_err(|e| Error::Config {
                path: p.display().to_string(),
                reason: e.to_string(),
            })
        };
        let bad = |what: &str, e: jsonwebtoken::errors::Error| Error::Config {
            path: what.into(),
            reason: format!("not a usable key: {e}"),
        };
        let a = &config.auth;
        let secret = |p: &std::path::Path| {
            let secret = read(p)?.trim_ascii().to_vec();
            if secret.len() < 32 {
                return Err(Error::Config {
                    path: p.display().to_string(),
                    reason: "an HS256 secret needs at least 32 bytes".into(),
                });
            }
            Ok(secret)
        };
        let mut keys = Vec::new();
        let service_secret = match &a.service_secret_file {
            Some(p) => {
                let s = secret(p)?;
                keys.push((
                    Algorithm::HS256,
                    DecodingKey::from_secret(&s),
                    Signer::Services,
                ));
                Some(s)
            }
            None => None,
        };
        if let Some(p) = &a.hs256_secret_file {
            let s = secret(p)?;
            if service_secret.as_ref() == Some(&s) {
                return Err(Error::Config {
                    path: p.display().to_string(),
                    reason: "hs256_secret_file holds the same secret as service_secret_file: \
                             the services' secret must be one users' tokens are never signed with"
                        .into(),
                });
            }
            let signer = if service_secret.is_some() {
                Signer::Users
            } else {
                Signer::SharedSecret
            };
            keys.push((Algorithm::HS256, DecodingKey::from_secret(&s), signer));
        }
        if let Some(p) = &a.rs256_public_key {
            let k = DecodingKey::from_rsa_pem(&read(p)?).map_err(|e| bad("rs256_public_key", e))?;
            keys.push((Algorithm::RS256, k, Signer::Users));
        }
        if let Some(p) = &a.es256_public_key {
            let k = DecodingKey::from_ec_pem(&read(p)?).map_err(|e| bad("es256_public_key", e))?;
            keys.push((Algorithm::ES256, k, Signer::Users));
        }
        Ok(Self {
            keys,
            audience: a.audience.clone(),
            issuer: a.issuer.clone(),
            leeway: a.leeway_s.unwrap_or(30),
            trusted: a.trusted_services.iter().cloned().collect(),
        })
    }

    /// Verifies an `Authorization` header value; `named_user` is the request's
    /// `access.user_id`. The error is one line for the caller.
    pub fn verify(
        &self,
        authorization: Option<&str>,
        named_user: &str,
        config: &Config,
    ) -> Result<Caller, String> {
        let token = authorization
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .ok_or("missing bearer token")?
            .trim();
        let header = jsonwebtoken::decode_header(token).map_err(|_| "malformed token")?;
        let mut v = Validation::new(header.alg);
        v.set_audience(&[&self.audience]);
        v.leeway = self.leeway;
        v.set_required_spec_claims(&["exp", "sub", "aud"]);
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        // The signature is checked before the claims: a key that does not verify the
        // signature gives way to the next key of the same algorithm.
        let mut outcome = None;
        for (_, key, signer) in self.keys.iter().filter(|(a, _, _)| *a == header.alg) {
            match jsonwebtoken::decode::<Claims>(token, key, &v) {
                Ok(data) => {
                    outcome = Some(Ok((data, *signer)));
                    break;
                }
                Err(e) => {
                    let next = *e.kind() == jsonwebtoken::errors::ErrorKind::InvalidSignature;
                    outcome = Some(Err(e));
                    if !next {
                        break;
                    }
                }
            }
        }
        let (data, signer) = match outcome {
            None => return Err(format!("token algorithm {:?} is not accepted", header.alg)),
            Some(Ok(verified)) => verified,
            Some(Err(e)) => {
                use jsonwebtoken::errors::ErrorKind;
                return Err(match e.kind() {
                    ErrorKind::ExpiredSignature => "token expired".to_owned(),
                    ErrorKind::InvalidAudience => "token audience is not this service".to_owned(),
                    ErrorKind::InvalidIssuer => "token issuer is not accepted".to_owned(),
                    ErrorKind::InvalidSignature => "token signature does not verify".to_owned(),
                    ErrorKind::ImmatureSignature => "token not valid yet".to_owned(),
                    ErrorKind::MissingRequiredClaim(c) => format!("token lacks claim '{c}'"),
                    _ => "invalid token".to_owned(),
                });
            }
        };
        let subject = data.claims.sub;
        let trusted = self.trusted.contains(&subject);
        let service = match signer {
            Signer::Services if !trusted => {
                return Err(format!(
                    "token signed with the services' secret, but subject '{subject}' is not in trusted_services"
                ));
            }
            Signer::Services => true,
            Signer::SharedSecret => trusted,
            Signer::Users => {
                if trusted {
                    tracing::warn!(
                        subject = %subject,
                        "a user token has a trusted service's subject; it acts for itself only"
                    );
                }
                false
            }
        };
        let (user, mut roles): (String, BTreeSet<String>) = if service {
            if named_user.is_empty() {
                return Err(format!(
                    "service '{subject}' must name the user (access.user_id)"
                ));
            }
            // A service's own claims say nothing about the user it acts for.
            (named_user.to_owned(), BTreeSet::new())
        } else {
            (subject.clone(), data.claims.roles.into_iter().collect())
        };
        if let Some(u) = config.users.get(&user) {
            roles.extend(u.roles.iter().cloned());
        }
        Ok(Caller {
            subject,
            user,
            roles,
            service,
        })
    }
}

/// Whether `key_id` is a table key (`[keys.K] table_key = true`): released as wrapped key
/// encryption keys only, never used for module cryptography.
pub fn is_table_key(config: &Config, key_id: &str) -> bool {
    config.keys.get(key_id).is_some_and(|r| r.table_key)
}

/// Whether `caller` may have key encryption keys wrapped or unwrapped under table key
/// `key_id`: a table key, its rules name the user, and a trusted service asks for it (the
/// released key goes to an engine that enforces its policy, not to a user's own client).
pub fn may_use_table_key(config: &Config, caller: &Caller, key_id: &str) -> bool {
    is_table_key(config, key_id) && caller.service && allowed(config, caller, key_id)
}

/// Whether `caller` may have modules en- or decrypted under master key `key_id` (never a
/// table key).
pub fn may_use_module_key(config: &Config, caller: &Caller, key_id: &str) -> bool {
    !is_table_key(config, key_id) && allowed(config, caller, key_id)
}

/// Whether `caller` may use master key `key_id` under the configured rules.
pub fn allowed(config: &Config, caller: &Caller, key_id: &str) -> bool {
    let Some(rule) = config.keys.get(key_id) else {
        return false;
    };
    rule.users.iter().any(|u| u == "*" || *u == caller.user)
        || rule
            .roles
            .iter()
            .any(|r| r == "*" || caller.roles.contains(r))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    const SERVICE_SECRET: &str = "service-secret-service-secret-00";
    // A P-256 key pair made for these tests only (an identity provider's signing key).
    const IDP_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg43AmnNho/ZLDI7Cm
nyS/vrLGHpf3JZi15qHeMw3xXhWhRANCAARuEG6oaoa8sUkACB8v3MBDIl1HaNDp
y/+yky6y4yHqQzMReytsjyx2g8xeIpKt+3uhEKNMahKOGLXaooZycMg8
-----END PRIVATE KEY-----
";
    const IDP_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEbhBuqGqGvLFJAAgfL9zAQyJdR2jQ
6cv/spMusuMh6kMzEXsrbI8sdoPMXiKSrft7oRCjTGoSjhi12qKGcnDIPA==
-----END PUBLIC KEY-----
";

    /// A config whose `[auth]` has `auth` after the audience.
    fn config_with(dir: &std::path::Path, auth: &str) -> Result<Config, Error> {
        std::fs::write(dir.join("jwt.secret"), SECRET).unwrap();
        std::fs::write(dir.join("service.secret"), SERVICE_SECRET).unwrap();
        std::fs::write(dir.join("idp.pub"), IDP_PUB).unwrap();
        std::fs::write(dir.join("keyring.json"), "{}").unwrap();
        std::fs::write(
            dir.join("c.toml"),
            format!(
                "[kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n\
                 [auth]\naudience = \"crypto\"\n{auth}\n\
                 [users.ann]\nroles = [\"pii_reader\"]\n\
                 [keys.pii]\nroles = [\"pii_reader\"]\n[keys.open]\nusers = [\"*\"]\n"
            ),
        )
        .unwrap();
        Config::load(&dir.join("c.toml"))
    }

    fn config(dir: &std::path::Path) -> Config {
        config_with(
            dir,
            "hs256_secret_file = \"jwt.secret\"\ntrusted_services = [\"clearice\"]",
        )
        .unwrap()
    }

    fn signed(claims: serde_json::Value, header: Header, key: &EncodingKey) -> String {
        format!("Bearer {}", encode(&header, &claims, key).unwrap())
    }

    fn claims(sub: &str) -> serde_json::Value {
        serde_json::json!({"sub": sub, "aud": "crypto", "exp": now() + 60})
    }

    fn token(claims: serde_json::Value) -> String {
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        signed(claims, Header::default(), &key)
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn users_tokens_and_trusted_services_decide_who_is_asking() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let v = Verifier::new(&c).unwrap();
        // a user's own token: its subject, its roles plus the configured ones
        let t = token(
            serde_json::json!({"sub": "bob", "aud": "crypto", "exp": now() + 60, "roles": ["x"]}),
        );
        let caller = v.verify(Some(&t), "someone-else", &c).unwrap();
        assert_eq!(caller.user, "bob");
        assert!(caller.roles.contains("x"));
        assert!(!allowed(&c, &caller, "pii") && allowed(&c, &caller, "open"));
        // a trusted service names the user; the user's configured roles apply
        let t = token(
            serde_json::json!({"sub": "clearice", "aud": "crypto", "exp": now() + 60, "roles": ["pii_reader"]}),
        );
        let caller = v.verify(Some(&t), "ann", &c).unwrap();
        assert_eq!(
            (caller.user.as_str(), caller.subject.as_str()),
            ("ann", "clearice")
        );
        assert!(allowed(&c, &caller, "pii"));
        // ...but its own claims do not carry over to a user without roles
        let caller = v.verify(Some(&t), "carl", &c).unwrap();
        assert!(!allowed(&c, &caller, "pii"));
        assert!(!allowed(&c, &caller, "no_rule_key"));
        assert!(
            v.verify(Some(&t), "", &c)
                .unwrap_err()
                .contains("must name the user")
        );
    }

    #[test]
    fn expired_foreign_and_malformed_tokens_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let v = Verifier::new(&c).unwrap();
        let expired =
            token(serde_json::json!({"sub": "bob", "aud": "crypto", "exp": now() - 3600}));
        assert_eq!(
            v.verify(Some(&expired), "", &c).unwrap_err(),
            "token expired"
        );
        let other_aud = token(serde_json::json!({"sub": "bob", "aud": "other", "exp": now() + 60}));
        assert!(
            v.verify(Some(&other_aud), "", &c)
                .unwrap_err()
                .contains("audience")
        );
        let no_exp = token(serde_json::json!({"sub": "bob", "aud": "crypto"}));
        assert!(v.verify(Some(&no_exp), "", &c).unwrap_err().contains("exp"));
        let forged = encode(
            &Header::default(),
            &serde_json::json!({"sub": "bob", "aud": "crypto", "exp": now() + 60}),
            &EncodingKey::from_secret(b"another-secret-another-secret-00"),
        )
        .unwrap();
        assert!(
            v.verify(Some(&format!("Bearer {forged}")), "", &c)
                .unwrap_err()
                .contains("signature")
        );
        assert_eq!(v.verify(None, "", &c).unwrap_err(), "missing bearer token");
        assert_eq!(
            v.verify(Some("Bearer x.y"), "", &c).unwrap_err(),
            "malformed token"
        );
        // an algorithm not configured is refused before any key is tried
        let mut header = Header::new(Algorithm::HS384);
        header.typ = Some("JWT".into());
        let hs384 = encode(
            &header,
            &serde_json::json!({"sub": "bob", "aud": "crypto", "exp": now() + 60}),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        assert!(
            v.verify(Some(&format!("Bearer {hs384}")), "", &c)
                .unwrap_err()
                .contains("not accepted")
        );
    }

    #[test]
    fn idp_token_with_a_service_subject_acts_only_for_itself() {
        let dir = tempfile::tempdir().unwrap();
        let c = config_with(
            dir.path(),
            "hs256_secret_file = \"jwt.secret\"\nes256_public_key = \"idp.pub\"\n\
             trusted_services = [\"clearice\"]",
        )
        .unwrap();
        let v = Verifier::new(&c).unwrap();
        // A user whose identity-provider subject is literally "clearice".
        let idp = EncodingKey::from_ec_pem(IDP_KEY.as_bytes()).unwrap();
        let t = signed(claims("clearice"), Header::new(Algorithm::ES256), &idp);
        let caller = v.verify(Some(&t), "ann", &c).unwrap();
        assert_eq!(caller.user, "clearice");
        assert!(!allowed(&c, &caller, "pii"));
        // ...needs no user named, as any user's token.
        assert_eq!(v.verify(Some(&t), "", &c).unwrap().user, "clearice");
        // The services' secret still names the user.
        let t = token(claims("clearice"));
        assert_eq!(v.verify(Some(&t), "ann", &c).unwrap().user, "ann");
    }

    #[test]
    fn with_a_service_secret_only_its_tokens_name_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let c = config_with(
            dir.path(),
            "service_secret_file = \"service.secret\"\nhs256_secret_file = \"jwt.secret\"\n\
             trusted_services = [\"clearice\"]",
        )
        .unwrap();
        let v = Verifier::new(&c).unwrap();
        let service = EncodingKey::from_secret(SERVICE_SECRET.as_bytes());
        let t = signed(claims("clearice"), Header::default(), &service);
        let caller = v.verify(Some(&t), "ann", &c).unwrap();
        assert_eq!(
            (caller.user.as_str(), caller.subject.as_str()),
            ("ann", "clearice")
        );
        assert!(allowed(&c, &caller, "pii"));
        // hs256_secret_file now signs users' tokens: "clearice" there is just a user.
        let t = token(claims("clearice"));
        let caller = v.verify(Some(&t), "ann", &c).unwrap();
        assert_eq!(caller.user, "clearice");
        assert!(!allowed(&c, &caller, "pii"));
        assert_eq!(
            v.verify(Some(&token(claims("bob"))), "", &c).unwrap().user,
            "bob"
        );
        // The services' secret with a subject that is not a trusted service is refused.
        let t = signed(claims("bob"), Header::default(), &service);
        assert!(
            v.verify(Some(&t), "ann", &c)
                .unwrap_err()
                .contains("not in trusted_services")
        );
    }

    #[test]
    fn trusted_services_without_a_services_secret_fail_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let e = config_with(
            dir.path(),
            "es256_public_key = \"idp.pub\"\ntrusted_services = [\"clearice\"]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("trusted_services needs service_secret_file"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = config_with(dir.path(), "service_secret_file = \"service.secret\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs trusted_services"), "{e}");
        // One secret for both services and users would make the distinction void.
        let c = config_with(
            dir.path(),
            "service_secret_file = \"jwt.secret\"\nhs256_secret_file = \"jwt.secret\"\n\
             trusted_services = [\"clearice\"]",
        )
        .unwrap();
        let e = Verifier::new(&c).unwrap_err().to_string();
        assert!(e.contains("same secret"), "{e}");
    }
}
