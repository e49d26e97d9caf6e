//! Prepared statements: stored per handle with their owner, SQL and bound parameters. A
//! handle is usable only by the user who prepared it; statements a client never closed
//! are forgotten after a token lifetime.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use tonic::Status;

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
    /// Stores `sql` for `user`; returns its new handle. Statements idle for `ttl` go.
    pub(crate) fn insert(&self, user: &str, sql: String, ttl: Duration) -> String {
        let handle = hex::encode(rand::random::<[u8; 16]>());
        let mut all = self.by_handle.lock().expect("prepared");
        all.retain(|_, p| p.used.elapsed() < ttl);
        all.insert(
            handle.clone(),
            Prepared {
                user: user.to_owned(),
                sql,
                params: None,
                used: Instant::now(),
            },
        );
        handle
    }

    /// Binds parameters (the first non-empty batch; none clears them).
    pub(crate) fn bind(
        &self,
        handle: &str,
        user: &str,
        batches: Vec<RecordBatch>,
    ) -> Result<(), Status> {
        let mut all = self.by_handle.lock().expect("prepared");
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
        let mut all = self.by_handle.lock().expect("prepared");
        let p = all
            .get_mut(handle)
            .filter(|p| p.user == user)
            .ok_or_else(|| not_found(handle))?;
        p.used = Instant::now();
        Ok((p.sql.clone(), p.params.clone()))
    }

    /// Forgets the statement if `user` owns it.
    pub(crate) fn close(&self, handle: &str, user: &str) {
        let mut all = self.by_handle.lock().expect("prepared");
        if all.get(handle).is_some_and(|p| p.user == user) {
            all.remove(handle);
        }
    }
}
