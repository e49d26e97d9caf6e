//! Prepared statements: stored per handle with their owner, SQL and bound parameters. A
//! handle is usable only by the user who prepared it; statements a client never closed
//! are forgotten after a token lifetime.
//!
//! What a statement holds stays in server memory until it is closed or idle for a token
//! lifetime, so both are bounded: at most [`MAX_PREPARED_PER_PRINCIPAL`] open statements
//! per principal, each with at most [`MAX_PARAMETER_BYTES`] of bound parameters (one
//! principal holds at most 64 MiB of parameters). Beyond, calls are refused with
//! `RESOURCE_EXHAUSTED`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use tonic::Status;

/// Most open prepared statements one principal may hold (across its connections and
/// tokens): 64. A JDBC or ADBC client closes its statements; one that never does hits
/// this, or sees its statements forgotten after a token lifetime.
pub(crate) const MAX_PREPARED_PER_PRINCIPAL: usize = 64;

/// Most bytes of Arrow memory one bound parameter set may hold: 1 MiB (values of one
/// statement's placeholders; far more than any parameter row needs).
pub(crate) const MAX_PARAMETER_BYTES: usize = 1 << 20;

struct Prepared {
    user: String,
    sql: String,
    params: Option<RecordBatch>,
    /// Last use.
    used: Instant,
}

/// The prepared statements of a server.
#[derive(Default)]
pub(crate) struct PreparedStatements {
    by_handle: Mutex<HashMap<String, Prepared>>,
}

fn not_found(handle: &str) -> Status {
    Status::not_found(format!("no prepared statement '{handle}'"))
}

impl PreparedStatements {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Prepared>> {
        // Every change under the lock is one insert, remove or field update: a panic
        // elsewhere leaves the map usable.
        self.by_handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `sql` for `user`; returns its new handle. Statements idle for `ttl` go.
    /// Refused when `user` already holds [`MAX_PREPARED_PER_PRINCIPAL`] statements.
    pub(crate) fn insert(&self, user: &str, sql: String, ttl: Duration) -> Result<String, Status> {
        let handle = hex::encode(rand::random::<[u8; 16]>());
        let mut all = self.lock();
        all.retain(|_, p| p.used.elapsed() < ttl);
        if all.values().filter(|p| p.user == user).count() >= MAX_PREPARED_PER_PRINCIPAL {
            return Err(Status::resource_exhausted(format!(
                "principal '{user}' has {MAX_PREPARED_PER_PRINCIPAL} open prepared statements, the most it may hold: close some (ClosePreparedStatement)"
            )));
        }
        all.insert(
            handle.clone(),
            Prepared {
                user: user.to_owned(),
                sql,
                params: None,
                used: Instant::now(),
            },
        );
        Ok(handle)
    }

    /// Binds parameters (the first non-empty batch; none clears them). The caller reads
    /// them with at most [`MAX_PARAMETER_BYTES`] buffered.
    pub(crate) fn bind(
        &self,
        handle: &str,
        user: &str,
        batches: Vec<RecordBatch>,
    ) -> Result<(), Status> {
        let mut all = self.lock();
        let p = all
            .get_mut(handle)
            .filter(|p| p.user == user)
            .ok_or_else(|| not_found(handle))?;
        p.params = batches.into_iter().find(|b| b.num_rows() > 0);
        p.used = Instant::now();
        Ok(())
    }

    /// The statement's SQL and bound parameters, for its owner.
    pub(crate) fn get(
        &self,
        handle: &str,
        user: &str,
    ) -> Result<(String, Option<RecordBatch>), Status> {
        let mut all = self.lock();
        let p = all
            .get_mut(handle)
            .filter(|p| p.user == user)
            .ok_or_else(|| not_found(handle))?;
        p.used = Instant::now();
        Ok((p.sql.clone(), p.params.clone()))
    }

    /// Forgets the statement if `user` owns it.
    pub(crate) fn close(&self, handle: &str, user: &str) {
        let mut all = self.lock();
        if all.get(handle).is_some_and(|p| p.user == user) {
            all.remove(handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_holds_at_most_the_cap_of_statements() {
        let p = PreparedStatements::default();
        let ttl = Duration::from_secs(60);
        let handles: Vec<String> = (0..MAX_PREPARED_PER_PRINCIPAL)
            .map(|i| p.insert("ann", format!("SELECT {i}"), ttl).unwrap())
            .collect();
        let e = p.insert("ann", "SELECT 1".into(), ttl).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert!(e.message().contains("64 open prepared statements"), "{e}");
        // another principal is not affected, and closing one makes room
        p.insert("bob", "SELECT 1".into(), ttl).unwrap();
        p.close(&handles[0], "ann");
        p.insert("ann", "SELECT 1".into(), ttl).unwrap();
    }
}
