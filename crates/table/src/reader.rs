//! Parquet reader factory that names the data file in every read error, so a corrupt,
//! truncated or undecryptable file is identified in the one-line error the user sees.
//!
//! It deliberately does not use DataFusion's metadata cache: decrypted footers hold
//! the file's decryptor, and they must not outlive the query that was allowed to
//! decrypt them.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ParquetMetaData;

/// Wraps the default reader factory; errors carry the file path.
#[derive(Debug)]
pub struct NamedFileReaderFactory {
    inner: DefaultParquetFileReaderFactory,
}

impl NamedFileReaderFactory {
    /// A factory reading from `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner: DefaultParquetFileReaderFactory::new(store),
        }
    }
}

impl ParquetFileReaderFactory for NamedFileReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<Box<dyn AsyncFileReader + Send>> {
        let path = format!("/{}", file.object_meta.location);
        let inner = self
            .inner
            .create_reader(partition_index, file, metadata_size_hint, metrics)?;
        Ok(Box::new(NamedReader { inner, path }))
    }
}

struct NamedReader {
    inner: Box<dyn AsyncFileReader + Send>,
    path: String,
}

fn named(path: &str, e: ParquetError) -> ParquetError {
    let msg = e.to_string();
    if msg.contains(path) {
        e
    } else {
        ParquetError::General(format!("file '{path}': {msg}"))
    }
}

impl AsyncFileReader for NamedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        async move {
            self.inner
                .get_bytes(range)
                .await
                .map_err(|e| named(&self.path, e))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move {
            self.inner
                .get_byte_ranges(ranges)
                .await
                .map_err(|e| named(&self.path, e))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            self.inner
                .get_metadata(options)
                .await
                .map_err(|e| named(&self.path, e))
        }
        .boxed()
    }
}
