//! Caller authentication: bearer JWTs (HS256 shared secret, RS256/ES256 public keys),
//! with expiry, audience and (optionally) issuer checked.

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
    /// The user decisions are made for: the subject, or, for a trusted service, the
    /// user it names.
    pub user: String,
    /// Roles: the token's `roles` claim (users' own tokens) and the configured roles.
    pub roles: BTreeSet<String>,
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    roles: Vec<String>,
}

/// Verifies tokens.
pub struct Verifier {
    keys: Vec<(Algorithm, DecodingKey)>,
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
                &self.keys.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
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
        let mut keys = Vec::new();
        if let Some(p) = &a.hs256_secret_file {
            let secret = read(p)?;
            let secret = secret.trim_ascii();
            if secret.len() < 32 {
                return Err(Error::Config {
                    path: p.display().to_string(),
                    reason: "an HS256 secret needs at least 32 bytes".into(),
                });
            }
            keys.push((Algorithm::HS256, DecodingKey::from_secret(secret)));
        }
        if let Some(p) = &a.rs256_public_key {
            let k = DecodingKey::from_rsa_pem(&read(p)?).map_err(|e| bad("rs256_public_key", e))?;
            keys.push((Algorithm::RS256, k));
        }
        if let Some(p) = &a.es256_public_key {
            let k = DecodingKey::from_ec_pem(&read(p)?).map_err(|e| bad("es256_public_key", e))?;
            keys.push((Algorithm::ES256, k));
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
        let (alg, key) = self
            .keys
            .iter()
            .find(|(a, _)| *a == header.alg)
            .ok_or_else(|| format!("token algorithm {:?} is not accepted", header.alg))?;
        let mut v = Validation::new(*alg);
        v.set_audience(&[&self.audience]);
        v.leeway = self.leeway;
        v.set_required_spec_claims(&["exp", "sub", "aud"]);
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "token expired".to_owned(),
                ErrorKind::InvalidAudience => "token audience is not this service".to_owned(),
                ErrorKind::InvalidIssuer => "token issuer is not accepted".to_owned(),
                ErrorKind::InvalidSignature => "token signature does not verify".to_owned(),
                ErrorKind::ImmatureSignature => "token not valid yet".to_owned(),
                ErrorKind::MissingRequiredClaim(c) => format!("token lacks claim '{c}'"),
                _ => "invalid token".to_owned(),
            }
        })?;
        let subject = data.claims.sub;
        let (user, mut roles): (String, BTreeSet<String>) = if self.trusted.contains(&subject) {
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
        })
    }
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

    fn config(dir: &std::path::Path) -> Config {
        std::fs::write(dir.join("jwt.secret"), SECRET).unwrap();
        std::fs::write(dir.join("keyring.json"), "{}").unwrap();
        std::fs::write(
            dir.join("c.toml"),
            "[kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n\
             [auth]\naudience = \"crypto\"\nhs256_secret_file = \"jwt.secret\"\ntrusted_services = [\"clearice\"]\n\
             [users.ann]\nroles = [\"pii_reader\"]\n\
             [keys.pii]\nroles = [\"pii_reader\"]\n[keys.open]\nusers = [\"*\"]\n",
        )
        .unwrap();
        Config::load(&dir.join("c.toml")).unwrap()
    }

    fn token(claims: serde_json::Value) -> String {
        format!(
            "Bearer {}",
            encode(
                &Header::default(),
                &claims,
                &EncodingKey::from_secret(SECRET.as_bytes())
            )
            .unwrap()
        )
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
}
