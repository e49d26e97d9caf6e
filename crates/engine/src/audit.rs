//! The audit log: JSON lines appended to a file by a writer thread, fed through a
//! bounded channel. Queries never do file IO on an async worker: they hand their records
//! to the writer and wait for it to confirm the write (a failed audit write fails the
//! query). A full channel makes them wait (back-pressure); records are never dropped.

use std::io::Write;
use std::path::Path;

use clearice_policy::AuditRecord;
use tokio::sync::{mpsc, oneshot};

/// Records waiting for the writer, at most (batches of one query's records).
const CHANNEL_CAPACITY: usize = 1024;

/// Batches the writer appends with one flush, at most.
const GROUP_COMMIT: usize = 256;

/// Append-only JSON-lines audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: String,
    tx: mpsc::Sender<Batch>,
}

#[derive(Debug)]
struct Batch {
    lines: Vec<u8>,
    /// Told the outcome of the write; `None` for records of a query nobody waits for
    /// (a result stream dropped by its client).
    ack: Option<oneshot::Sender<std::io::Result<()>>>,
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
    /// Opens (creating) the log for appending and starts its writer thread.
    #[expect(
        clippy::disallowed_methods,
        reason = "startup; Engine::open calls it on a blocking thread"
    )]
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let error = |source| AuditError {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(error)?;
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        std::thread::Builder::new()
            .name("clearice-audit".into())
            .spawn(move || writer(file, rx))
            .map_err(error)?;
        Ok(Self {
            path: path.display().to_string(),
            tx,
        })
    }

    fn batch(records: &[AuditRecord]) -> Vec<u8> {
        let mut lines = Vec::new();
        for r in records {
            // Plain strings, numbers and booleans: serialization cannot fail.
            if serde_json::to_writer(&mut lines, r).is_ok() {
                lines.push(b'\n');
            }
        }
        lines
    }

    fn stopped(&self) -> AuditError {
        AuditError {
            path: self.path.clone(),
            source: std::io::Error::other("the audit writer stopped"),
        }
    }

    /// Appends records (one query's) and waits until they are written and flushed.
    pub async fn write_all(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        if records.is_empty() {
            return Ok(());
        }
        let (ack, done) = oneshot::channel();
        let batch = Batch {
            lines: Self::batch(records),
            ack: Some(ack),
        };
        self.tx.send(batch).await.map_err(|_| self.stopped())?;
        match done.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(AuditError {
                path: self.path.clone(),
                source,
            }),
            Err(_) => Err(self.stopped()),
        }
    }

    /// Appends one record and waits until it is written.
    pub async fn write(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.write_all(std::slice::from_ref(record)).await
    }

    /// Hands records to the writer without waiting (for code that cannot wait: a result
    /// stream dropped by its client). Never drops them: if the channel is full, a task
    /// (or, outside a runtime, a thread) waits for room.
    pub fn write_detached(&self, records: &[AuditRecord]) {
        if records.is_empty() {
            return;
        }
        let batch = Batch {
            lines: Self::batch(records),
            ack: None,
        };
        match self.tx.try_send(batch) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(batch)) => {
                let tx = self.tx.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            let _ = tx.send(batch).await;
                        });
                    }
                    Err(_) => {
                        std::thread::spawn(move || {
                            let _ = tx.blocking_send(batch);
                        });
                    }
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!(path = %self.path, "audit writer stopped: records lost");
            }
        }
    }
}

/// The writer thread: appends what arrives, a group of batches per flush, and tells each
/// waiting query the outcome. Ends when the log is dropped.
fn writer(mut file: std::fs::File, mut rx: mpsc::Receiver<Batch>) {
    while let Some(first) = rx.blocking_recv() {
        let mut group = vec![first];
        while group.len() < GROUP_COMMIT {
            match rx.try_recv() {
                Ok(b) => group.push(b),
                Err(_) => break,
            }
        }
        let mut buf = Vec::with_capacity(group.iter().map(|b| b.lines.len()).sum());
        for b in &group {
            buf.extend_from_slice(&b.lines);
        }
        let result = file.write_all(&buf).and_then(|()| file.flush());
        if let Err(e) = &result {
            tracing::error!(error = %e, "audit records not written");
        }
        for b in group {
            if let Some(ack) = b.ack {
                let outcome = match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                };
                let _ = ack.send(outcome);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn record(user: &str, i: usize) -> AuditRecord {
        AuditRecord {
            row_filter: None,
            time: "2026-12-01T00:00:00.000Z".into(),
            user: user.into(),
            client: "test".into(),
            action: "query".into(),
            query_id: format!("q-{i}"),
            sql_sha256: String::new(),
            table: "lake.sales.customers".into(),
            snapshot_id: None,
            columns: vec![],
            allowed: true,
            rows: Some(i as u64),
            error: None,
            retries: vec![],
        }
    }

    /// Many writers at once, more than the channel holds: every record is written, whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers_lose_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = Arc::new(AuditLog::open(&path).unwrap());
        let mut tasks = Vec::new();
        for t in 0..64 {
            let log = Arc::clone(&log);
            tasks.push(tokio::spawn(async move {
                for i in 0..50 {
                    if i % 10 == 0 {
                        log.write_detached(&[record(&format!("u{t}"), i)]);
                    } else {
                        log.write(&record(&format!("u{t}"), i)).await.unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // The channel is FIFO: once this confirmed write is done, the detached records
        // handed over before it are written too (none waited for room here).
        log.write(&record("last", 0)).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 64 * 50 + 1);
        for t in 0..64 {
            let n = lines
                .iter()
                .filter(|r| r["user"] == format!("u{t}"))
                .count();
            assert_eq!(n, 50, "user u{t}");
        }
    }

    /// A write that fails is reported to the query that waits for it, naming the log.
    #[tokio::test]
    async fn a_failed_write_is_an_error_naming_the_log() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let log = AuditLog::open(full).unwrap();
        let e = log.write(&record("u", 1)).await.unwrap_err().to_string();
        assert!(e.starts_with("audit log '/dev/full': "), "{e}");
    }
}
