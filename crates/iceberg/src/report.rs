//! What a write did, reported back to the audit log after the statement ends.

use std::sync::{Arc, Mutex};

/// What a write did, filled in when it commits: the audit record is written after the
/// statement ends, so it carries the rows written and the snapshot committed.
#[derive(Debug, Clone)]
pub struct WriteAudit(Arc<Mutex<WriteReport>>);

/// The outcome of one write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteReport {
    /// Audit action: `insert`, `insert_overwrite`, `delete`, `update`, `create_table`,
    /// `create_table_as`, `drop_table`, `create_schema`, `drop_schema`, `alter_table`.
    pub action: String,
    /// The snapshot the write committed (`None` until it commits, or when it wrote none).
    pub snapshot_id: Option<i64>,
    /// Rows written (or removed, for `delete`).
    pub rows: Option<u64>,
}

impl WriteAudit {
    /// A write of kind `action`, not committed yet.
    pub fn new(action: &str) -> Self {
        Self(Arc::new(Mutex::new(WriteReport {
            action: action.to_owned(),
            ..Default::default()
        })))
    }

    /// Records the commit.
    pub fn committed(&self, snapshot_id: Option<i64>, rows: u64) {
        let mut r = self.0.lock().expect("write report");
        r.snapshot_id = snapshot_id;
        r.rows = Some(rows);
    }

    /// The report so far.
    pub fn report(&self) -> WriteReport {
        self.0.lock().expect("write report").clone()
    }
}

impl PartialEq for WriteAudit {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for WriteAudit {}
