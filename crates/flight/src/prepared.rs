//! Prepared statements: stored per handle with their owner, SQL and bound parameters. A
//! handle is usable only by the user who prepared it; statements a client never closed
//! are forgotten after a token lifetime.
//!
//! What a statement holds stays in server memory until it is closed or idle for a token
//! lifetime, so both are bounded: at most [`MAX_PREPARED_PER_PRINCIPAL`] open statements
//! per principal (a new one beyond forgets the principal's least recently used one if it
//! has been idle [`IDLE_BEFORE_FORGOTTEN`], else it is refused), each with at most
//! [`MAX_PARAMETER_BYTES`] of bound parameters (one principal holds at most 64 MiB of
//! parameters). Refusals are `RESOURCE_EXHAUSTED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use tonic::Status;

/// Most open prepared statements one principal may hold (across its connections and
/// tokens): 64. A JDBC or ADBC client closes its statements, but one that dies (a killed
/// notebook or BI worker) leaves its statement open, and refusing the 65th locked the
/// principal out of every ADBC query for a token lifetime. So the 65th forgets the
/// principal's least recently used statement if that one has been idle for
/// [`IDLE_BEFORE_FORGOTTEN`] (a client still holding it gets `NOT_FOUND` naming it, never
/// another statement's rows), and is refused only while all 64 were used more recently:
/// one session preparing in a loop cannot take the statements other sessions are using.
pub(crate) const MAX_PREPARED_PER_PRINCIPAL: usize = 64;

/// How long a statement must have been unused before a new one beyond the cap may take its
/// place: 10 s.
pub(crate) const IDLE_BEFORE_FORGOTTEN: Duration = Duration::from_secs(10);

/// Most bytes of Arrow memory one bound parameter set may hold: 1 MiB (values of one
/// statement's placeholders; far more than any parameter row needs).
pub(crate) const MAX_PARAMETER_BYTES: usize = 1 << 20;

struct Prepared {
    user: String,
    sql: String,
    params: Option<RecordBatch>,
    /// Last use.
    used: Instant,
    /// Order of last use (which one a new statement beyond the cap forgets).
    seq: u64,
}

/// The prepared statements of a server.
#[derive(Default)]
pub(crate) struct PreparedStatements {
    by_handle: Mutex<HashMap<String, Prepared>>,
    /// Counts uses, for [`Prepared::seq`].
    uses: AtomicU64,
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

    fn tick(&self) -> u64 {
        self.uses.fetch_add(1, Ordering::Relaxed)
    }

    /// Stores `sql` for `user`; returns its new handle. Statements idle for `ttl` go; when
    /// `user` already holds [`MAX_PREPARED_PER_PRINCIPAL`], its least recently used goes if
    /// idle for [`IDLE_BEFORE_FORGOTTEN`], else the call is refused.
    pub(crate) fn insert(&self, user: &str, sql: String, ttl: Duration) -> Result<String, Status> {
        let handle = hex::encode(rand::random::<[u8; 16]>());
        let mut all = self.lock();
        all.retain(|_, p| p.used.elapsed() < ttl);
        clearice_metrics::prepared_statements(all.len());
        if all.values().filter(|p| p.user == user).count() >= MAX_PREPARED_PER_PRINCIPAL {
            let oldest = all
                .iter()
                .filter(|(_, p)| p.user == user)
                .min_by_key(|(_, p)| p.seq)
                .filter(|(_, p)| p.used.elapsed() >= IDLE_BEFORE_FORGOTTEN)
                .map(|(h, _)| h.clone());
            let Some(oldest) = oldest else {
                return Err(Status::resource_exhausted(format!(
                    "principal '{user}' has {MAX_PREPARED_PER_PRINCIPAL} open prepared statements, all used in the last {} s, the most it may hold: close some (ClosePreparedStatement)",
                    IDLE_BEFORE_FORGOTTEN.as_secs()
                )));
            };
            all.remove(&oldest);
            tracing::info!(
                principal = user,
                "{MAX_PREPARED_PER_PRINCIPAL} open prepared statements: the least recently used one is forgotten"
            );
        }
        all.insert(
            handle.clone(),
            Prepared {
                user: user.to_owned(),
                sql,
                params: None,
                used: Instant::now(),
                seq: self.tick(),
            },
        );
        clearice_metrics::prepared_statements(all.len());
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
        p.seq = self.tick();
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
        p.seq = self.tick();
        Ok((p.sql.clone(), p.params.clone()))
    }

    /// Forgets the statement if `user` owns it.
    pub(crate) fn close(&self, handle: &str, user: &str) {
        let mut all = self.lock();
        if all.get(handle).is_some_and(|p| p.user == user) {
            all.remove(handle);
            clearice_metrics::prepared_statements(all.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes every statement of `user` look unused for longer than
    /// [`IDLE_BEFORE_FORGOTTEN`] (their order of use stays).
    fn age(p: &PreparedStatements, user: &str) {
        let long_ago = Instant::now()
            .checked_sub(IDLE_BEFORE_FORGOTTEN + Duration::from_secs(1))
            .unwrap();
        for s in p.lock().values_mut().filter(|s| s.user == user) {
            s.used = long_ago;
        }
    }

    #[test]
    fn beyond_the_cap_the_least_recently_used_idle_statement_goes_and_else_it_is_refused() {
        let p = PreparedStatements::default();
        let ttl = Duration::from_secs(60);
        let handles: Vec<String> = (0..MAX_PREPARED_PER_PRINCIPAL)
            .map(|i| p.insert("ann", format!("SELECT {i}"), ttl).unwrap())
            .collect();
        // All 64 used just now: refused, nothing forgotten.
        let e = p.insert("ann", "SELECT 1".into(), ttl).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert!(e.message().contains("64 open prepared statements"), "{e}");
        assert!(handles.iter().all(|h| p.get(h, "ann").is_ok()));
        // Idle (a crashed client's): the least recently used goes. The first was used
        // again last, so the second is the one.
        age(&p, "ann");
        assert_eq!(p.get(&handles[0], "ann").unwrap().0, "SELECT 0");
        let newest = p.insert("ann", "SELECT new".into(), ttl).unwrap();
        let e = p.get(&handles[1], "ann").unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        assert!(e.message().contains(&handles[1]), "{e}");
        assert_eq!(p.get(&handles[0], "ann").unwrap().0, "SELECT 0");
        assert_eq!(p.get(&newest, "ann").unwrap().0, "SELECT new");
        let held = p.lock().values().filter(|s| s.user == "ann").count();
        assert_eq!(held, MAX_PREPARED_PER_PRINCIPAL);
        // Another principal's statements are neither counted nor forgotten.
        let bob = p.insert("bob", "SELECT 1".into(), ttl).unwrap();
        age(&p, "bob");
        for i in 0..MAX_PREPARED_PER_PRINCIPAL {
            age(&p, "ann");
            p.insert("ann", format!("SELECT again {i}"), ttl).unwrap();
        }
        assert_eq!(p.get(&bob, "bob").unwrap().0, "SELECT 1");
        assert!(p.get(&bob, "ann").is_err(), "a handle is its owner's only");
        // Closing one makes room at once.
        p.close(&newest, "ann");
        assert!(p.get(&newest, "ann").is_err());
        p.insert("ann", "SELECT after close".into(), ttl).unwrap();
    }
}
