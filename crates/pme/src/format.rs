//! `STORED AS PARQUET` and files by path through the decrypting reader: DataFusion's
//! [`ParquetFormat`] with every file read through [`DecryptingReaderFactory`].
//!
//! Schema and statistics inference stay DataFusion's: before delegating, each file's
//! plaintext-view metadata is put into the session's (private) file metadata cache,
//! where DataFusion's inference finds it. Scans get the decrypting reader factory.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::{GetExt, Result, Statistics, internal_datafusion_err};
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::parquet::{ParquetFormat, ParquetFormatFactory};
use datafusion::datasource::file_format::{FileFormat, FileFormatFactory};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::metadata::CachedParquetMetaData;
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSinkConfig, FileSource, ParquetFileReaderFactory,
    ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::execution::cache::cache_manager::CachedFileMetadataEntry;
use datafusion::physical_expr::LexRequirement;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use object_store::{ObjectMeta, ObjectStore};

use clearice_crypto::SecretKey;

use super::{DecryptingReaderFactory, GivenKeys, ScanKeys};
use clearice_storage::LakeStores;

/// Files whose metadata is primed and inferred together (bounded so that the session's
/// metadata cache keeps them between priming and inference).
const INFER_CHUNK: usize = 64;

/// Creates [`DecryptingParquetFormat`]s (registered for `parquet` in ClearIce sessions).
#[derive(Debug)]
pub struct DecryptingParquetFormatFactory {
    inner: ParquetFormatFactory,
    keys: ScanKeys,
    stores: LakeStores,
}

impl DecryptingParquetFormatFactory {
    /// Formats reading with `keys` (the AAD prefix comes from each table's options).
    pub fn new(keys: ScanKeys) -> Self {
        Self {
            inner: ParquetFormatFactory::new(),
            keys,
            stores: LakeStores::default(),
        }
    }

    /// Names files on `stores`' S3 buckets `s3://BUCKET/KEY` (side files are found next
    /// to them; messages name them).
    pub fn with_stores(mut self, stores: LakeStores) -> Self {
        self.stores = stores;
        self
    }
}

impl GetExt for DecryptingParquetFormatFactory {
    fn get_ext(&self) -> String {
        self.inner.get_ext()
    }
}

impl FileFormatFactory for DecryptingParquetFormatFactory {
    fn create(
        &self,
        state: &dyn Session,
        format_options: &HashMap<String, String>,
    ) -> Result<Arc<dyn FileFormat>> {
        let inner = self.inner.create(state, format_options)?;
        let options = inner
            .as_any()
            .downcast_ref::<ParquetFormat>()
            .ok_or_else(|| internal_datafusion_err!("expected ParquetFormat"))?
            .options()
            .clone();
        Ok(Arc::new(
            DecryptingParquetFormat::new(
                ParquetFormat::default().with_options(options),
                self.keys.clone(),
            )?
            .with_stores(self.stores.clone()),
        ))
    }

    fn default(&self) -> Arc<dyn FileFormat> {
        Arc::new(
            DecryptingParquetFormat::new(ParquetFormat::default(), self.keys.clone())
                .expect("default options have no AAD prefix")
                .with_stores(self.stores.clone()),
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// [`ParquetFormat`] reading through the decrypting reader.
#[derive(Debug)]
pub struct DecryptingParquetFormat {
    inner: ParquetFormat,
    keys: ScanKeys,
    stores: LakeStores,
}

impl DecryptingParquetFormat {
    /// Wraps `inner`. Its `crypto.file_decryption` options are DataFusion's: the AAD
    /// prefix becomes the supplied prefix, and keys given there (footer key, column keys
    /// by name) decrypt as given; other keys come from the session's provider.
    pub fn new(inner: ParquetFormat, mut keys: ScanKeys) -> Result<Self> {
        let mut options = inner.options().clone();
        if let Some(d) = options.crypto.file_decryption.take() {
            let hex = |name: &str, v: &str| {
                hex::decode(v).map_err(|_| {
                    // Never the value: it may be a key.
                    datafusion::error::DataFusionError::Configuration(format!(
                        "format.crypto.file_decryption.{name}: not a hex string"
                    ))
                })
            };
            if !d.aad_prefix_as_hex.is_empty() {
                keys.grant.aad_prefix = Some(hex("aad_prefix_as_hex", &d.aad_prefix_as_hex)?);
            }
            let mut given = GivenKeys {
                verify_signature: d.footer_signature_verification,
                ..Default::default()
            };
            if !d.footer_key_as_hex.is_empty() {
                given.footer = Some(SecretKey::from_bytes(hex(
                    "footer_key_as_hex",
                    &d.footer_key_as_hex,
                )?));
            }
            for (column, p) in &d.column_decryption_properties {
                if !p.column_key_as_hex.is_empty() {
                    let name = format!("column_decryption_properties.{column}.column_key_as_hex");
                    given.columns.insert(
                        column.clone(),
                        SecretKey::from_bytes(hex(&name, &p.column_key_as_hex)?),
                    );
                }
            }
            if given.footer.is_some() || !given.columns.is_empty() {
                keys.given = Some(Arc::new(given));
            }
        }
        options.crypto.factory_id = None;
        options.crypto.factory_options = Default::default();
        Ok(Self {
            inner: inner.with_options(options),
            keys,
            stores: LakeStores::default(),
        })
    }

    /// See [`DecryptingParquetFormatFactory::with_stores`].
    pub fn with_stores(mut self, stores: LakeStores) -> Self {
        self.stores = stores;
        self
    }

    fn factory(&self, store: Arc<dyn ObjectStore>) -> DecryptingReaderFactory {
        let prefix = self.stores.prefix_of(&store).unwrap_or_else(|| "/".into());
        DecryptingReaderFactory::new(store, self.keys.clone()).with_file_prefix(prefix)
    }

    /// Puts the plaintext-view metadata of `objects` into the session's metadata cache.
    async fn prime(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        objects: &[ObjectMeta],
    ) -> Result<()> {
        let cache = state.runtime_env().cache_manager.get_file_metadata_cache();
        let factory = self.factory(Arc::clone(store));
        for object in objects {
            if cache
                .get(&object.location)
                .is_some_and(|c| c.is_valid_for(object))
            {
                continue;
            }
            let file = PartitionedFile::from(object.clone());
            let mut reader = factory.create_reader(
                0,
                file,
                self.inner.metadata_size_hint(),
                &ExecutionPlanMetricsSet::new(),
            )?;
            let metadata = reader.get_metadata(None).await?;
            cache.put(
                &object.location,
                CachedFileMetadataEntry::new(
                    object.clone(),
                    Arc::new(CachedParquetMetaData::new(metadata)),
                ),
            );
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl FileFormat for DecryptingParquetFormat {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn get_ext(&self) -> String {
        self.inner.get_ext()
    }

    fn get_ext_with_compression(&self, c: &FileCompressionType) -> Result<String> {
        self.inner.get_ext_with_compression(c)
    }

    fn compression_type(&self) -> Option<FileCompressionType> {
        self.inner.compression_type()
    }

    async fn infer_schema(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        objects: &[ObjectMeta],
    ) -> Result<SchemaRef> {
        let mut objects = objects.to_vec();
        objects.sort_unstable_by(|a, b| a.location.cmp(&b.location));
        let mut schemas = Vec::new();
        for chunk in objects.chunks(INFER_CHUNK) {
            self.prime(state, store, chunk).await?;
            schemas.push(
                self.inner
                    .infer_schema(state, store, chunk)
                    .await?
                    .as_ref()
                    .clone(),
            );
        }
        Ok(Arc::new(Schema::try_merge(schemas)?))
    }

    async fn infer_stats(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> Result<Statistics> {
        self.prime(state, store, std::slice::from_ref(object))
            .await?;
        self.inner
            .infer_stats(state, store, table_schema, object)
            .await
    }

    async fn infer_ordering(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> Result<Option<datafusion::physical_expr::LexOrdering>> {
        self.prime(state, store, std::slice::from_ref(object))
            .await?;
        self.inner
            .infer_ordering(state, store, table_schema, object)
            .await
    }

    async fn infer_stats_and_ordering(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> Result<datafusion::datasource::file_format::FileMeta> {
        self.prime(state, store, std::slice::from_ref(object))
            .await?;
        self.inner
            .infer_stats_and_ordering(state, store, table_schema, object)
            .await
    }

    async fn create_physical_plan(
        &self,
        state: &dyn Session,
        conf: FileScanConfig,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // As ParquetFormat does, with the decrypting reader and no encryption factory.
        let mut source = conf
            .file_source()
            .as_any()
            .downcast_ref::<ParquetSource>()
            .cloned()
            .ok_or_else(|| internal_datafusion_err!("expected ParquetSource"))?
            .with_table_parquet_options(self.inner.options().clone());
        let store = state
            .runtime_env()
            .object_store(conf.object_store_url.clone())?;
        source = source.with_parquet_file_reader_factory(Arc::new(self.factory(store)));
        if let Some(hint) = self.inner.metadata_size_hint() {
            source = source.with_metadata_size_hint(hint);
        }
        let conf = FileScanConfigBuilder::from(conf)
            .with_source(Arc::new(source))
            .build();
        Ok(DataSourceExec::from_data_source(conf))
    }

    async fn create_writer_physical_plan(
        &self,
        input: Arc<dyn ExecutionPlan>,
        state: &dyn Session,
        conf: FileSinkConfig,
        order_requirements: Option<LexRequirement>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // COPY TO / INSERT into listing tables write plaintext, as without ClearIce;
        // encrypted writes go through the Iceberg write path with the policy's keys.
        self.inner
            .create_writer_physical_plan(input, state, conf, order_requirements)
            .await
    }

    fn file_source(&self, table_schema: TableSchema) -> Arc<dyn FileSource> {
        self.inner.file_source(table_schema)
    }
}
