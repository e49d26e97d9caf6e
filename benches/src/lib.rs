//! End-to-end benchmark fixtures: the demo lake, encrypted and as its plaintext twin.

use std::sync::Arc;

use clearice_demo as demo;
use clearice_engine::{Config, Engine, Session};

/// Two lakes with the same seeded data: PME-encrypted and plaintext.
pub struct Fixture {
    _dir: tempfile::TempDir,
    /// Session over the encrypted lake (queries are audited, as in the product).
    pub encrypted: Session,
    /// Session over the plaintext twin.
    pub plaintext: Session,
    /// Session over the encrypted lake as `analyst` (masks from the demo policy).
    pub masked: Session,
}

impl Fixture {
    /// Writes both lakes (seconds) and opens a session on each.
    pub async fn demo() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let enc = demo::init(&dir.path().join("enc"))
            .await
            .expect("encrypted lake");
        let plain = demo::init_plaintext(&dir.path().join("plain"))
            .await
            .expect("plaintext lake");
        let open = |p: std::path::PathBuf| async move {
            Arc::new(
                Engine::open(Config::load(&p).expect("config"))
                    .await
                    .expect("engine"),
            )
        };
        let (e, p) = (open(enc).await, open(plain).await);
        Fixture {
            encrypted: e.session("admin"),
            plaintext: p.session("admin"),
            masked: e.session("analyst"),
            _dir: dir,
        }
    }
}

/// Runs a query to completion; returns the row count.
pub async fn run(session: &Session, sql: &str) -> usize {
    session.sql(sql).await.expect("query").rows()
}
