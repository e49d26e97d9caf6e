//! Per-session access context: the principal, the policy, key resolution, and the
//! decisions made while planning the current query (for the audit log).

use std::sync::{Arc, Mutex};

use clearice_crypto::KeyResolver;
use clearice_policy::{AuditColumn, Policy};

/// One table as accessed by the current query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAccess {
    /// `catalog.namespace.table`.
    pub table: String,
    /// Columns used, with decisions.
    pub columns: Vec<AuditColumn>,
    /// Whether access was allowed.
    pub allowed: bool,
    /// Denial message.
    pub error: Option<String>,
}

/// What a session knows about who is asking.
#[derive(Debug)]
pub struct SessionAccess {
    principal: String,
    policy: Arc<Policy>,
    resolver: Arc<KeyResolver>,
    accesses: Mutex<Vec<TableAccess>>,
    scans: Mutex<Vec<crate::tamper::ScanRecord>>,
}

impl SessionAccess {
    /// Access context for `principal`.
    pub fn new(
        principal: impl Into<String>,
        policy: Arc<Policy>,
        resolver: Arc<KeyResolver>,
    ) -> Self {
        Self {
            principal: principal.into(),
            policy,
            resolver,
            accesses: Mutex::default(),
            scans: Mutex::default(),
        }
    }

    /// The principal.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Key resolution.
    pub fn resolver(&self) -> &Arc<KeyResolver> {
        &self.resolver
    }

    /// Records what a scan of the current query reads (for naming a decryption failure).
    pub fn record_scan(&self, scan: crate::tamper::ScanRecord) {
        self.scans.lock().expect("scans").push(scan);
    }

    /// Takes the scans recorded since the last call.
    pub fn take_scans(&self) -> Vec<crate::tamper::ScanRecord> {
        std::mem::take(&mut *self.scans.lock().expect("scans"))
    }

    /// Records a table access of the current query (merged per table).
    pub fn record(&self, access: TableAccess) {
        let mut all = self.accesses.lock().expect("accesses");
        if let Some(prev) = all.iter_mut().find(|a| a.table == access.table) {
            for c in access.columns {
                if !prev.columns.iter().any(|p| p.name == c.name) {
                    prev.columns.push(c);
                }
            }
            prev.allowed &= access.allowed;
            if prev.error.is_none() {
                prev.error = access.error;
            }
        } else {
            all.push(access);
        }
    }

    /// Takes the accesses recorded since the last call (one query's worth).
    pub fn take(&self) -> Vec<TableAccess> {
        std::mem::take(&mut *self.accesses.lock().expect("accesses"))
    }
}
