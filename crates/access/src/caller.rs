//! Who is asking: built once at the front door (the shell, a Flight SQL login, a
//! sqllogictest run, an embedding program) and carried, shared, by everything that
//! decides or records for the caller: its session's access context, its confinement,
//! its crypto provider calls and its audit records.

use std::fmt;
use std::sync::Arc;

use clearice_crypto::{AccessToken, KeyScope, ScanGrant};

/// The front end a caller came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrontEnd {
    /// The machine's own user (shell, `-c`, `-f`, `slt`, an embedding program):
    /// unconfined unless `[shell] confine = true`.
    Local,
    /// A network principal (Flight SQL): always confined, with `[server.limits]`.
    FlightSql,
}

impl FrontEnd {
    /// How refusals name the front end ("… is not allowed over Flight SQL").
    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Local => "a confined shell",
            FrontEnd::FlightSql => "Flight SQL",
        }
    }
}

/// One caller: the principal the policy decides for, where it connected from (for the
/// audit log: `repl`, `cli`, `slt`, `embedded` or a network address), the front end, and
/// the principal's own token for crypto providers, if its client passed one. Cloning
/// shares it; nothing can change it after the front door built it.
#[derive(Clone)]
pub struct Caller(Arc<Inner>);

struct Inner {
    principal: String,
    client: String,
    front: FrontEnd,
    credential: Option<AccessToken>,
}

impl Caller {
    /// A local caller (the machine's own user) as `principal`.
    pub fn local(principal: impl Into<String>, client: impl Into<String>) -> Self {
        Self::new(principal, client, FrontEnd::Local, None)
    }

    /// A network caller (Flight SQL), with its own provider token if it passed one.
    pub fn network(
        principal: impl Into<String>,
        client: impl Into<String>,
        credential: Option<AccessToken>,
    ) -> Self {
        Self::new(principal, client, FrontEnd::FlightSql, credential)
    }

    /// A caller of any front end.
    pub fn new(
        principal: impl Into<String>,
        client: impl Into<String>,
        front: FrontEnd,
        credential: Option<AccessToken>,
    ) -> Self {
        Self(Arc::new(Inner {
            principal: principal.into(),
            client: client.into(),
            front,
            credential,
        }))
    }

    /// The principal.
    pub fn principal(&self) -> &str {
        &self.0.principal
    }

    /// Where it connected from.
    pub fn client(&self) -> &str {
        &self.0.client
    }

    /// The front end.
    pub fn front(&self) -> FrontEnd {
        self.0.front
    }

    /// The principal's own provider token, if its client passed one.
    pub fn credential(&self) -> Option<&AccessToken> {
        self.0.credential.as_ref()
    }

    /// A grant of `scope` to this caller (its principal and token), through the catalog's
    /// provider: what a scan of files outside the catalog may decrypt.
    pub fn grant(&self, scope: KeyScope) -> ScanGrant {
        ScanGrant {
            principal: self.0.principal.clone(),
            credential: self.0.credential.clone(),
            scope,
            ..ScanGrant::unrestricted()
        }
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: only whether there is one.
        f.debug_struct("Caller")
            .field("principal", &self.0.principal)
            .field("client", &self.0.client)
            .field("front", &self.0.front)
            .field(
                "credential",
                &self.0.credential.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_token() {
        let token = AccessToken::new("s3cr3t-token-value".to_owned());
        let c = Caller::network("analyst", "127.0.0.1:5", Some(token));
        let shown = format!("{c:?}");
        assert!(
            shown.contains("analyst") && shown.contains("FlightSql"),
            "{shown}"
        );
        assert!(!shown.contains("s3cr3t"), "{shown}");
        let grant = c.grant(KeyScope::All);
        assert_eq!(grant.principal, "analyst");
        assert!(grant.credential.is_some());
    }
}
