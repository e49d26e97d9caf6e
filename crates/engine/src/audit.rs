//! The audit log: JSON lines appended to a file, flushed per record.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clearice_policy::AuditRecord;

/// Append-only JSON-lines audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

/// The audit log could not be written.
#[derive(Debug, thiserror::Error)]
#[error("audit log '{path}': {source}")]
pub struct AuditError {
    path: String,
    #[source]
    source: std::io::Error,
}

impl AuditLog {
    /// Opens (creating) the log for appending.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| AuditError {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends one record and flushes it.
    pub fn write(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(record).expect("audit record serializes");
        line.push(b'\n');
        let mut f = self.file.lock().expect("audit file");
        f.write_all(&line)
            .and_then(|()| f.flush())
            .map_err(|source| AuditError {
                path: self.path.display().to_string(),
                source,
            })
    }
}
