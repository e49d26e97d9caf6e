//! Where tables live: local disk and S3-compatible object storage, both through
//! `object_store`, for every reader and writer of ClearIce.
//!
//! ```text
//!  Iceberg metadata, manifests, ClearIce writes ─▶ LakeStorage (iceberg::io::Storage)
//!  DataFusion scans (decrypting reader)         ─▶ LakeRegistry (ObjectStoreRegistry)  ─┐
//!  external key material (side files)           ─▶ LakeStores::side_file_reader         ├─▶ LakeStores
//!                                                                                         │  local FS, or one
//!                                                                                         │  S3 client per bucket
//!                                                                                         ┘  and option set
//! ```
//!
//! S3 options come from `[storage.s3]`, then a catalog's `s3.*` properties (a REST
//! catalog's table config, vended credentials), then AWS's environment variables and
//! shared files. Every HTTP request to S3 is counted by method ([`LakeStores::requests`]).
//! Iceberg data files are read through [`CATALOG_S3_SCHEME`] URLs (`clearice-s3://bucket`),
//! which confined sessions cannot address; plain `s3://` is registered for the machine's
//! own sessions only (standalone files in the shell).
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::buffered::BufWriter;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, Certificate, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    RetryConfig,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use zeroize::Zeroize;

/// URL scheme under which Iceberg data files on S3 are read (`clearice-s3://BUCKET`).
pub const CATALOG_S3_SCHEME: &str = "clearice-s3";

/// A secret string (access key secret, session token): zeroized when dropped, never in
/// `Debug`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach S3-compatible storage (`[storage.s3]`). Unset fields come from a
/// catalog's `s3.*` properties, then AWS's environment and shared files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct S3Options {
    /// Endpoint URL (MinIO, moto, a VPC endpoint); default AWS's for the region.
    pub endpoint: Option<String>,
    /// Region; default from the environment, else `us-east-1`.
    pub region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`); default on with a custom endpoint.
    pub path_style: Option<bool>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key (never serialized: a serialized file IO carries no secret).
    #[serde(skip)]
    pub secret_access_key: Option<Secret>,
    /// Session token (temporary credentials; never serialized).
    #[serde(skip)]
    pub session_token: Option<Secret>,
    /// Shared-files profile for credentials and region.
    pub profile: Option<String>,
    /// Unsigned requests (public buckets).
    pub anonymous: bool,
    /// Per-request timeout.
    pub timeout: Option<Duration>,
    /// Retries of a failed request (default 2).
    pub retries: Option<usize>,
    /// PEM CA certificates of an endpoint with a private CA (added to the trusted roots).
    pub ca_pem: Option<Vec<u8>>,
}

impl S3Options {
    /// These options overridden by a catalog's `s3.*` properties (Iceberg's names, as a
    /// REST catalog returns them with vended credentials).
    pub fn with_catalog_props(&self, props: &HashMap<String, String>) -> Self {
        let mut o = self.clone();
        let get = |k: &str| props.get(k).filter(|v| !v.is_empty()).cloned();
        if let Some(v) = get("s3.endpoint") {
            o.endpoint = Some(v);
        }
        if let Some(v) = get("s3.region").or_else(|| get("client.region")) {
            o.region = Some(v);
        }
        if let Some(v) = get("s3.path-style-access") {
            o.path_style = Some(v.eq_ignore_ascii_case("true"));
        }
        if let (Some(id), Some(secret)) = (get("s3.access-key-id"), get("s3.secret-access-key")) {
            o.access_key_id = Some(id);
            o.secret_access_key = Some(Secret::new(secret));
            o.session_token = get("s3.session-token").map(Secret::new);
        }
        if get("s3.allow-anonymous").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            o.anonymous = true;
        }
        o
    }

    /// Fills unset endpoint, credentials and region from AWS's environment and shared
    /// files (blocking: reads files). The engine applies it once at startup, on a
    /// blocking thread; stores are built from the options as they are.
    pub fn with_environment(&self) -> Self {
        let mut o = self.clone();
        if o.endpoint.is_none() {
            o.endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .ok()
                .filter(|v| !v.is_empty());
        }
        if o.anonymous || (o.access_key_id.is_some() && o.region.is_some()) {
            return o;
        }
        let env = clearice_crypto::AwsEnvironment::load(o.profile.as_deref());
        if o.access_key_id.is_none()
            && let (Some(id), Some(secret)) = (env.access_key_id, env.secret_access_key)
        {
            o.access_key_id = Some(id);
            o.secret_access_key = Some(Secret::new(secret.as_str()));
            o.session_token = env.session_token.map(|t| Secret::new(t.as_str()));
        }
        if o.region.is_none() {
            o.region = env.region;
        }
        o
    }
}

/// A storage failure, naming the store and the object (never a credential).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The location is not on a store ClearIce reads.
    #[error("'{location}': {reason}")]
    Unsupported {
        /// The location.
        location: String,
        /// Why.
        reason: String,
    },
    /// The store could not be set up (bad endpoint, options).
    #[error("S3 bucket '{bucket}': {reason}")]
    Setup {
        /// Bucket.
        bucket: String,
        /// Why.
        reason: String,
    },
}

/// HTTP requests sent to object storage, by method.
#[derive(Debug, Default)]
pub struct RequestCounts {
    get: AtomicU64,
    head: AtomicU64,
    put: AtomicU64,
    other: AtomicU64,
}

/// A snapshot of [`RequestCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    /// GETs (reads, ranged reads, listings).
    pub get: u64,
    /// HEADs.
    pub head: u64,
    /// PUTs (writes, multipart parts).
    pub put: u64,
    /// Everything else (POST, DELETE).
    pub other: u64,
}

impl RequestCounts {
    fn snapshot(&self) -> Requests {
        Requests {
            get: self.get.load(Ordering::Relaxed),
            head: self.head.load(Ordering::Relaxed),
            put: self.put.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }
}

/// Counts each request, then sends it with object_store's reqwest client.
#[derive(Debug)]
struct CountingConnector(Arc<RequestCounts>);

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counts: Arc<RequestCounts>,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(CountingService {
            inner: ReqwestConnector::default().connect(options)?,
            counts: Arc::clone(&self.0),
        }))
    }
}

#[async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let c = match req.method().as_str() {
            "GET" => &self.counts.get,
            "HEAD" => &self.counts.head,
            "PUT" => &self.counts.put,
            _ => &self.counts.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
        // Method, object and range only: the signature headers are never logged.
        tracing::debug!(
            target: "clearice::s3",
            method = %req.method(),
            path = %req.uri().path(),
            range = ?req.headers().get("range"),
            "S3 request"
        );
        self.inner.execute(req).await
    }
}

type S3Cache = HashMap<(String, S3Options), Arc<dyn ObjectStore>>;

/// S3 clients kept per engine before superseded option sets are dropped.
const MAX_S3_CLIENTS: usize = 64;

/// The stores of one engine: the local filesystem, and S3 clients built on first use
/// per bucket and option set (cloning shares them).
#[derive(Clone)]
pub struct LakeStores {
    options: S3Options,
    local: Arc<LocalFileSystem>,
    s3: Arc<parking_lot::Mutex<S3Cache>>,
    counts: Arc<RequestCounts>,
}

impl std::fmt::Debug for LakeStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeStores")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Default for LakeStores {
    fn default() -> Self {
        Self::new(S3Options::default())
    }
}

/// Where a location lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local file (absolute path).
    Local(String),
    /// An object in an S3 bucket.
    S3 {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
    },
}

impl Location {
    /// Parses `s3://bucket/key` (also `s3a://`, `s3n://`), `file:///path` or `/path`.
    pub fn parse(location: &str) -> Result<Self, StorageError> {
        let unsupported = |reason: String| StorageError::Unsupported {
            location: location.to_owned(),
            reason,
        };
        if location.starts_with('/') {
            return Ok(Self::Local(location.to_owned()));
        }
        // Hadoop's spelling of a local path (Spark's Hadoop catalog writes it).
        if let Some(path) = location.strip_prefix("file:")
            && path.starts_with('/')
            && !path.starts_with("//")
        {
            return Ok(Self::Local(path.to_owned()));
        }
        let (scheme, rest) = location
            .split_once("://")
            .ok_or_else(|| unsupported("not a URI or an absolute path".into()))?;
        match scheme {
            "file" => url::Url::parse(location)
                .map_err(|e| unsupported(e.to_string()))?
                .to_file_path()
                .map(|p| Self::Local(p.to_string_lossy().into_owned()))
                .map_err(|()| unsupported("not a local path".into())),
            // The key is taken as written (Iceberg locations are not percent-encoded).
            "s3" | "s3a" | "s3n" | CATALOG_S3_SCHEME => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(unsupported("no bucket".into()));
                }
                Ok(Self::S3 {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                })
            }
            other => Err(unsupported(format!(
                "storage scheme '{other}' is not supported (file:// and s3:// are)"
            ))),
        }
    }

    /// The object store path.
    pub fn object_path(&self) -> ObjectPath {
        match self {
            Self::Local(p) => ObjectPath::from(p.trim_start_matches('/')),
            Self::S3 { key, .. } => ObjectPath::from(key.as_str()),
        }
    }
}

impl LakeStores {
    /// Stores reaching S3 with `options`.
    pub fn new(options: S3Options) -> Self {
        Self {
            options,
            local: Arc::new(LocalFileSystem::new()),
            s3: Arc::default(),
            counts: Arc::default(),
        }
    }

    /// The configured S3 options.
    pub fn options(&self) -> &S3Options {
        &self.options
    }

    /// Requests sent to S3 so far.
    pub fn requests(&self) -> Requests {
        self.counts.snapshot()
    }

    /// The local filesystem store.
    pub fn local(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.local) as _
    }

    /// The store of `bucket` with the configured options.
    pub fn s3(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, StorageError> {
        self.s3_with(bucket, &self.options)
    }

    /// The store of `bucket` with `options` (a catalog's properties merged in).
    pub fn s3_with(
        &self,
        bucket: &str,
        options: &S3Options,
    ) -> Result<Arc<dyn ObjectStore>, StorageError> {
        let key = (bucket.to_owned(), options.clone());
        if let Some(s) = self.s3.lock().get(&key) {
            return Ok(Arc::clone(s));
        }
        let store = self.build_s3(bucket, options)?;
        let mut cache = self.s3.lock();
        // Vended credentials change over time: drop clients of superseded option sets
        // (their holders keep them) rather than grow without bound; clients with the
        // configured options stay.
        if cache.len() >= MAX_S3_CLIENTS {
            let base = &self.options;
            cache.retain(|(_, o), _| o == base);
        }
        Ok(Arc::clone(cache.entry(key).or_insert(store)))
    }

    fn build_s3(
        &self,
        bucket: &str,
        options: &S3Options,
    ) -> Result<Arc<dyn ObjectStore>, StorageError> {
        // Options are complete here: the engine applied the environment at startup (a
        // blocking read of AWS's shared files, not done on an async worker).
        let o = options;
        let setup = |reason: String| StorageError::Setup {
            bucket: bucket.to_owned(),
            reason,
        };
        let mut client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(o.timeout.unwrap_or(Duration::from_secs(60)));
        if let Some(pem) = &o.ca_pem {
            for cert in Certificate::from_pem_bundle(pem).map_err(|e| setup(e.to_string()))? {
                client = client.with_root_certificate(cert);
            }
        }
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(o.region.clone().unwrap_or_else(|| "us-east-1".into()))
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_http_connector(CountingConnector(Arc::clone(&self.counts)))
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: o.retries.unwrap_or(2),
                retry_timeout: Duration::from_secs(30),
            })
            .with_client_options(client);
        if let Some(endpoint) = &o.endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(setup(format!("endpoint '{endpoint}' is not http(s)://")));
            }
            b = b
                .with_endpoint(endpoint.trim_end_matches('/'))
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(!o.path_style.unwrap_or(true));
        } else {
            // AWS itself: virtual-hosted requests (`BUCKET.s3.REGION.amazonaws.com`), as
            // Iceberg's S3FileIO and PyArrow use, unless path style is asked for.
            b = b.with_virtual_hosted_style_request(!o.path_style.unwrap_or(false));
        }
        if o.anonymous {
            b = b.with_skip_signature(true);
        } else {
            match (&o.access_key_id, &o.secret_access_key) {
                (Some(id), Some(secret)) => {
                    b = b
                        .with_access_key_id(id)
                        .with_secret_access_key(secret.expose());
                    if let Some(t) = &o.session_token {
                        b = b.with_token(t.expose());
                    }
                }
                _ => {
                    return Err(setup(
                        "no S3 credentials: set access_key_id/secret_access_key_file in \
                         [storage.s3], AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile \
                         in ~/.aws/credentials (or anonymous = true)"
                            .into(),
                    ));
                }
            }
        }
        Ok(Arc::new(b.build().map_err(|e| setup(e.to_string()))?))
    }

    /// `s3://BUCKET/` when `store` is one of these stores' S3 clients.
    pub fn prefix_of(&self, store: &Arc<dyn ObjectStore>) -> Option<String> {
        let target = Arc::as_ptr(store).cast::<()>();
        self.s3
            .lock()
            .iter()
            .find(|(_, s)| Arc::as_ptr(s).cast::<()>() == target)
            .map(|((bucket, _), _)| format!("s3://{bucket}/"))
    }

    /// The store and path of `location` with `options`.
    pub fn resolve_with(
        &self,
        location: &str,
        options: &S3Options,
    ) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StorageError> {
        let loc = Location::parse(location)?;
        let path = loc.object_path();
        match loc {
            Location::Local(_) => Ok((self.local(), path)),
            Location::S3 { bucket, .. } => Ok((self.s3_with(&bucket, options)?, path)),
        }
    }

    /// Reads external key material (`_KEY_MATERIAL_FOR_*.json`) next to data files on
    /// any store: local paths and `s3://` URLs. Called on tokio's blocking pool (the
    /// crypto providers' key resolution), where it waits for the object store.
    pub fn side_file_reader(&self) -> clearice_crypto::SideFileReader {
        let stores = self.clone();
        Arc::new(move |path: &str| {
            let (store, object) = stores
                .resolve_with(path, &stores.options)
                .map_err(std::io::Error::other)?;
            let handle = tokio::runtime::Handle::try_current().map_err(|_| {
                std::io::Error::other("side files are read from within the engine's runtime")
            })?;
            handle.block_on(async move {
                match store.get(&object).await {
                    Ok(r) => Ok(Some(
                        r.bytes().await.map_err(std::io::Error::other)?.to_vec(),
                    )),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(std::io::Error::other(e)),
                }
            })
        })
    }
}

/// DataFusion's object store registry for ClearIce: registered stores first, then S3
/// buckets on first use: `clearice-s3://BUCKET` (catalog data) always, `s3://BUCKET`
/// only when `direct_s3` (the machine's own sessions).
#[derive(Debug)]
pub struct LakeRegistry {
    inner: DefaultObjectStoreRegistry,
    stores: LakeStores,
    direct_s3: bool,
}

impl LakeRegistry {
    /// A registry over `stores`; plain `s3://` URLs resolve only with `direct_s3`.
    pub fn new(stores: LakeStores, direct_s3: bool) -> Self {
        Self {
            inner: DefaultObjectStoreRegistry::new(),
            stores,
            direct_s3,
        }
    }
}

impl ObjectStoreRegistry for LakeRegistry {
    fn register_store(
        &self,
        url: &url::Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &url::Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &url::Url) -> DfResult<Arc<dyn ObjectStore>> {
        if let Ok(s) = self.inner.get_store(url) {
            return Ok(s);
        }
        let s3 = match url.scheme() {
            CATALOG_S3_SCHEME => true,
            "s3" | "s3a" => self.direct_s3,
            _ => false,
        };
        match url.host_str() {
            Some(bucket) if s3 => {
                let store = self
                    .stores
                    .s3(bucket)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let base = url::Url::parse(&format!("{}://{bucket}", url.scheme()))
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                self.inner.register_store(&base, Arc::clone(&store));
                Ok(store)
            }
            _ => self.inner.get_store(url),
        }
    }
}

/// Iceberg's file IO on [`LakeStores`]: metadata, manifests and ClearIce's data files on
/// local disk or S3. New files are written with create-only puts (a conditional put on
/// S3), so an existing file is never overwritten.
#[derive(Clone, Serialize, Deserialize)]
pub struct LakeStorage {
    options: S3Options,
    #[serde(skip)]
    stores: LakeStores,
}

impl std::fmt::Debug for LakeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeStorage")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Builds [`LakeStorage`] for Iceberg catalogs, merging each FileIO's `s3.*` properties
/// into the configured options.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LakeStorageFactory {
    #[serde(skip)]
    stores: LakeStores,
}

impl LakeStorageFactory {
    /// A factory over `stores`.
    pub fn new(stores: LakeStores) -> Self {
        Self { stores }
    }
}

#[typetag::serde]
impl StorageFactory for LakeStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(LakeStorage {
            options: self.stores.options.with_catalog_props(config.props()),
            stores: self.stores.clone(),
        }))
    }
}

fn ice_err(
    kind: iceberg::ErrorKind,
    what: &str,
    location: &str,
    e: impl std::fmt::Display,
) -> iceberg::Error {
    iceberg::Error::new(kind, format!("{what} '{location}': {e}"))
}

fn io_err(what: &str, location: &str, e: object_store::Error) -> iceberg::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => iceberg::ErrorKind::DataInvalid,
        _ => iceberg::ErrorKind::Unexpected,
    };
    ice_err(kind, what, location, e)
}

impl LakeStorage {
    fn resolve(&self, location: &str) -> iceberg::Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        self.stores
            .resolve_with(location, &self.options)
            .map_err(|e| {
                let kind = match e {
                    StorageError::Unsupported { .. } => iceberg::ErrorKind::FeatureUnsupported,
                    StorageError::Setup { .. } => iceberg::ErrorKind::Unexpected,
                };
                iceberg::Error::new(kind, e.to_string())
            })
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for LakeStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        let (store, p) = self.resolve(path)?;
        match store.head(&p).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_err("checking", path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let (store, p) = self.resolve(path)?;
        let meta = store
            .head(&p)
            .await
            .map_err(|e| io_err("reading", path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let (store, p) = self.resolve(path)?;
        let r = store
            .get(&p)
            .await
            .map_err(|e| io_err("reading", path, e))?;
        r.bytes().await.map_err(|e| io_err("reading", path, e))
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        let (store, p) = self.resolve(path)?;
        Ok(Box::new(ObjectRead {
            store,
            path: p,
            location: path.to_owned(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        let (store, p) = self.resolve(path)?;
        store
            .put_opts(&p, bs.into(), PutOptions::from(PutMode::Create))
            .await
            .map_err(|e| io_err("writing", path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let (store, p) = self.resolve(path)?;
        Ok(Box::new(ObjectWrite {
            inner: Some(BufWriter::new(store, p)),
            location: path.to_owned(),
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let (store, p) = self.resolve(path)?;
        match store.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_err("deleting", path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let (store, p) = self.resolve(path)?;
        let locations = store.list(Some(&p)).map_ok(|m| m.location).boxed();
        store
            .delete_stream(locations)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| io_err("deleting under", path, e))?;
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

struct ObjectRead {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    location: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.store
            .get_range(&self.path, range)
            .await
            .map_err(|e| io_err("reading", &self.location, e))
    }
}

struct ObjectWrite {
    inner: Option<BufWriter>,
    location: String,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let w = self.inner.as_mut().ok_or_else(|| {
            ice_err(
                iceberg::ErrorKind::Unexpected,
                "writing",
                &self.location,
                "closed",
            )
        })?;
        w.put(bs)
            .await
            .map_err(|e| io_err("writing", &self.location, e))
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let mut w = self.inner.take().ok_or_else(|| {
            ice_err(
                iceberg::ErrorKind::Unexpected,
                "closing",
                &self.location,
                "already closed",
            )
        })?;
        w.shutdown()
            .await
            .map_err(|e| ice_err(iceberg::ErrorKind::Unexpected, "writing", &self.location, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(
            Location::parse("s3://b/wh/t/data/x y.parquet").unwrap(),
            Location::S3 {
                bucket: "b".into(),
                key: "wh/t/data/x y.parquet".into()
            }
        );
        assert_eq!(
            Location::parse("file:///tmp/a.parquet").unwrap(),
            Location::Local("/tmp/a.parquet".into())
        );
        assert_eq!(
            Location::parse("/tmp/a").unwrap(),
            Location::Local("/tmp/a".into())
        );
        let e = Location::parse("gs://b/k").unwrap_err().to_string();
        assert!(e.contains("'gs'") && e.contains("gs://b/k"), "{e}");
    }

    #[tokio::test]
    async fn iceberg_io_never_overwrites_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LakeStorage {
            options: S3Options::default(),
            stores: LakeStores::default(),
        };
        let file = format!("file://{}/t/metadata/v1.json", dir.path().display());
        assert!(!storage.exists(&file).await.unwrap());
        storage
            .write(&file, Bytes::from_static(b"one"))
            .await
            .unwrap();
        assert_eq!(
            storage.read(&file).await.unwrap(),
            Bytes::from_static(b"one")
        );
        assert_eq!(storage.metadata(&file).await.unwrap().size, 3);
        // Create-only: a second writer of the same name fails and the first stays.
        let e = storage
            .write(&file, Bytes::from_static(b"two"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("v1.json"), "{e}");
        assert_eq!(
            storage.read(&file).await.unwrap(),
            Bytes::from_static(b"one")
        );
        let reader = storage.reader(&file).await.unwrap();
        assert_eq!(reader.read(1..3).await.unwrap(), Bytes::from_static(b"ne"));
        storage
            .delete_prefix(&format!("file://{}/t", dir.path().display()))
            .await
            .unwrap();
        assert!(!storage.exists(&file).await.unwrap());
        let e = storage.read("gs://bucket/x").await.unwrap_err().to_string();
        assert!(e.contains("gs://bucket/x"), "{e}");
    }

    #[test]
    fn catalog_props_override_and_secrets_stay_out_of_debug() {
        let base = S3Options {
            endpoint: Some("http://a".into()),
            ..Default::default()
        };
        let props = HashMap::from([
            ("s3.endpoint".to_string(), "http://b".to_string()),
            ("s3.access-key-id".to_string(), "AKIDVENDED".to_string()),
            (
                "s3.secret-access-key".to_string(),
                "s3cr3t-vended".to_string(),
            ),
            ("s3.path-style-access".to_string(), "true".to_string()),
        ]);
        let o = base.with_catalog_props(&props);
        assert_eq!(o.endpoint.as_deref(), Some("http://b"));
        assert_eq!(o.access_key_id.as_deref(), Some("AKIDVENDED"));
        assert_eq!(o.path_style, Some(true));
        let shown = format!(
            "{o:?} {:?}",
            LakeStorage {
                options: o.clone(),
                stores: LakeStores::default()
            }
        );
        assert!(!shown.contains("s3cr3t"), "{shown}");
        let serialized = serde_json::to_string(&LakeStorage {
            options: o,
            stores: LakeStores::default(),
        })
        .unwrap();
        assert!(
            serialized.contains("AKIDVENDED") && !serialized.contains("s3cr3t"),
            "{serialized}"
        );
    }
}
