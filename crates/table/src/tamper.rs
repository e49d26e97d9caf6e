//! Naming what failed when decryption fails.
//!
//! parquet-rs reports a failed AES-GCM authentication as `ring::error::Unspecified`, with
//! no file, column or module. Scans record what they read ([`ScanRecord`]); when a query
//! fails with a decryption error, [`diagnose`] re-reads those columns of those files
//! (synchronously, on a blocking thread, with the same key scope: no other key is asked
//! for) one row group and one column at a time, and returns [`Error::Tampered`] naming the
//! file, the column, the row group and the module that failed. This costs nothing until
//! something fails.

use std::sync::Arc;

use clearice_crypto::{KeyResolver, KeyScope};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::encryption::decrypt::FileDecryptionProperties;

use crate::encryption::local_side_file_reader;
use crate::error::Error;
use crate::provider::IcebergTableProvider;

/// What one scan of a query read: enough to re-read it for a diagnosis.
#[derive(Debug, Clone)]
pub struct ScanRecord {
    /// The table as scanned.
    pub provider: IcebergTableProvider,
    /// Top-level columns read (decrypted) by the scan.
    pub columns: Vec<String>,
    /// Keys the scan was allowed.
    pub scope: KeyScope,
}

/// Whether an error (its text) is a failed decryption or authentication.
pub fn is_decryption_failure(message: &str) -> bool {
    message.contains("ring::error::Unspecified")
        || message.contains("Error decrypting")
        || message.contains("decryption failed")
        || message.contains("unable to decrypt")
}

/// Re-reads what `scans` read and names the first module that fails authentication.
/// `None` when every module reads (the failure was elsewhere, or is not reproducible).
pub async fn diagnose(scans: Vec<ScanRecord>) -> Option<Error> {
    for scan in scans {
        let files = match scan.provider.local_data_files().await {
            Ok(f) => f,
            Err(_) => continue,
        };
        let resolver = Arc::clone(scan.provider.resolver());
        let table = scan.provider.name().to_owned();
        let (columns, scope) = (scan.columns.clone(), scan.scope.clone());
        let found = datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            files
                .iter()
                .find_map(|f| diagnose_file(&table, f, &columns, &resolver, &scope))
        })
        .join()
        .await
        .ok()
        .flatten();
        if found.is_some() {
            return found;
        }
    }
    None
}

fn props(
    resolver: &Arc<KeyResolver>,
    file: &str,
    scope: &KeyScope,
) -> Option<Arc<FileDecryptionProperties>> {
    let retriever = resolver.scoped_retriever(
        file.to_owned(),
        Some(local_side_file_reader()),
        scope.clone(),
    );
    FileDecryptionProperties::with_key_retriever(retriever)
        .build()
        .ok()
}

#[expect(
    clippy::disallowed_methods,
    reason = "runs on a blocking thread (diagnose spawns it there)"
)]
fn diagnose_file(
    table: &str,
    file: &str,
    columns: &[String],
    resolver: &Arc<KeyResolver>,
    scope: &KeyScope,
) -> Option<Error> {
    let tampered = |column: Option<String>, row_group: Option<usize>, module: &str| {
        Some(Error::Tampered {
            table: table.to_owned(),
            file: file.to_owned(),
            column,
            row_group,
            module: module.to_owned(),
        })
    };
    let options = || {
        props(resolver, file, scope)
            .map(|p| ArrowReaderOptions::new().with_file_decryption_properties(p))
    };
    let open = || std::fs::File::open(file).ok();
    let builder = match ParquetRecordBatchReaderBuilder::try_new_with_options(open()?, options()?) {
        Ok(b) => b,
        Err(e) if is_decryption_failure(&e.to_string()) => {
            return tampered(None, None, "footer or column metadata");
        }
        Err(_) => return None,
    };
    let metadata = Arc::clone(builder.metadata());
    let descr = metadata.file_metadata().schema_descr();
    for rg in 0..metadata.num_row_groups() {
        for (leaf, col) in descr.columns().iter().enumerate() {
            let top = col.path().parts().first().cloned().unwrap_or_default();
            if !columns.contains(&top) {
                continue;
            }
            let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(open()?, options()?)
                .and_then(|b| {
                    b.with_row_groups(vec![rg])
                        .with_projection(ProjectionMask::leaves(descr, [leaf]))
                        .build()
                });
            let failure = match reader {
                Err(e) => Some(e.to_string()),
                Ok(r) => r.into_iter().find_map(|b| b.err()).map(|e| e.to_string()),
            };
            if let Some(msg) = failure
                && is_decryption_failure(&msg)
            {
                let module = if msg.contains("page header") {
                    "page header"
                } else {
                    "data or dictionary page"
                };
                return tampered(Some(col.path().string()), Some(rg), module);
            }
        }
    }
    None
}
