//! The factory: [`DecryptingReaderFactory`], DataFusion's `ParquetFileReaderFactory` for
//! a scan, creating one [`DecryptingReader`] per file.

use std::sync::Arc;

use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use object_store::ObjectStore;
use parquet::arrow::async_reader::AsyncFileReader;

use crate::DecryptError;
use crate::keys::{FileKeys, ScanKeys};
use crate::reader::{Counters, DecryptingReader};
use crate::shared::Views;

/// Creates [`DecryptingReader`]s for a scan.
#[derive(Debug)]
pub struct DecryptingReaderFactory {
    inner: DefaultParquetFileReaderFactory,
    keys: Arc<ScanKeys>,
    file_prefix: String,
    /// Each file's own key (Iceberg-native encryption): every file of the scan has one.
    file_keys: Option<Arc<FileKeys>>,
    /// File views its readers share (they end with the factory, and the scan).
    views: Arc<Views>,
}

impl DecryptingReaderFactory {
    /// Readers of files in `store`, decrypting with `keys`.
    pub fn new(store: Arc<dyn ObjectStore>, keys: ScanKeys) -> Self {
        Self {
            inner: DefaultParquetFileReaderFactory::new(store),
            keys: Arc::new(keys),
            file_prefix: "/".into(),
            file_keys: None,
            views: Arc::new(Views::for_scan()),
        }
    }

    /// Files are decrypted with their own keys (by path in the store); a file without
    /// one is refused.
    pub fn with_file_keys(mut self, keys: Arc<FileKeys>) -> Self {
        self.file_keys = Some(keys);
        self
    }

    /// Files are named `PREFIX + path in the store` in messages, provider calls and
    /// side file lookups (default `/`, local paths; `s3://BUCKET/` on S3).
    pub fn with_file_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.file_prefix = prefix.into();
        self
    }
}

impl DecryptingReaderFactory {
    /// Each column of `file` (its first row group) with the master key id of its column
    /// key ([`EXPLICIT_KEY`](crate::EXPLICIT_KEY) for explicit keys), `None` for plaintext
    /// columns and columns under the footer key. Column keys are described, not requested,
    /// unless the scope allows them.
    pub async fn column_keys(
        &self,
        file: PartitionedFile,
    ) -> datafusion::error::Result<Vec<(String, Option<String>)>> {
        let mut reader = self.reader(0, file, None, &ExecutionPlanMetricsSet::new())?;
        Ok(reader.view().await?.column_keys.clone())
    }

    /// The footer metadata of `file` as this scan's keys decrypt it: columns whose keys
    /// the scope does not allow have stand-ins without statistics.
    pub async fn metadata(
        &self,
        file: PartitionedFile,
    ) -> datafusion::error::Result<Arc<parquet::file::metadata::ParquetMetaData>> {
        let mut reader = self.reader(0, file, None, &ExecutionPlanMetricsSet::new())?;
        Ok(Arc::clone(&reader.view().await?.metadata))
    }

    fn reader(
        &self,
        partition: usize,
        file: PartitionedFile,
        hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<DecryptingReader> {
        let path = format!("{}{}", self.file_prefix, file.object_meta.location);
        let size = file.object_meta.size;
        let keys = match &self.file_keys {
            None => Arc::clone(&self.keys),
            Some(all) => match all.get(file.object_meta.location.as_ref()) {
                Some(k) => Arc::new(self.keys.for_file(k)),
                None => {
                    return Err(datafusion::error::DataFusionError::External(Box::new(
                        DecryptError::Malformed {
                            file: path,
                            reason: "no key for this file in the table's manifests".into(),
                        },
                    )));
                }
            },
        };
        let inner = self.inner.create_reader(partition, file, hint, metrics)?;
        let counters = Counters::new(metrics, partition);
        Ok(
            DecryptingReader::new(inner, path, size, hint, keys, counters)
                .with_views(Arc::clone(&self.views)),
        )
    }
}

impl ParquetFileReaderFactory for DecryptingReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<Box<dyn AsyncFileReader + Send>> {
        Ok(Box::new(self.reader(
            partition_index,
            file,
            metadata_size_hint,
            metrics,
        )?))
    }
}
