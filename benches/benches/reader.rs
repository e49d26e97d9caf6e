//! The decrypting reader with the local provider and with the remote provider (the
//! reference crypto service, in process, over HTTP on loopback) vs parquet-rs's native PME
//! decryption vs the plaintext twin, on the same data, in one run: a full scan and a 1 %
//! row range read with the page index (page-range decryption).
//!
//! `cargo bench -p clearice-benches --bench reader`
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented pub fn"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clearice_crypto::{
    DEFAULT_KEY_CACHE_TTL, KeyMaterialWriter, KeyResolver, KeyScope, KeyringKms, LocalProvider,
    ProviderRef, RemoteConfig, RemoteCredential, RemoteProvider, ScanGrant, SecretKey,
};
use clearice_pme::{DecryptingReaderFactory, ScanKeys};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetFileReaderFactory;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderOptions, RowSelection, RowSelector};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::encryption::decrypt::FileDecryptionProperties;
use datafusion::parquet::encryption::encrypt::FileEncryptionProperties;
use datafusion::parquet::file::metadata::PageIndexPolicy;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::TryStreamExt;

/// The heap the `clearice` binary (and its crypto service) runs with: with glibc's malloc
/// every read mapped and faulted in its column-chunk buffers anew (a third of the time in
/// the kernel).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
/// Master keys (PKMT1 key material, double wrapping, as PyArrow writes).
const KEYRING: &str = r#"{"kf": "MDEyMzQ1Njc4OTAxMjM0NQ==", "kc1": "MTIzNDU2Nzg5MDEyMzQ1MA==", "kc2": "MTIzNDU2Nzg5MDEyMzQ1MQ=="}"#;
const JWT_SECRET: &str = "bench-secret-bench-secret-bench-secret!!";

fn keyring() -> KeyringKms {
    KeyringKms::from_json(KEYRING).expect("keyring")
}

fn batch(start: usize, n: usize) -> RecordBatch {
    let ids: Vec<i64> = (start..start + n).map(|i| i as i64).collect();
    let ssn: Vec<String> = ids
        .iter()
        .map(|i| format!("{:03}-{:02}-{:04}", i % 997, i % 89, i % 9973))
        .collect();
    let email: Vec<String> = ids.iter().map(|i| format!("user{i}@example.org")).collect();
    let balance: Vec<f64> = ids.iter().map(|i| (*i % 100_000) as f64 * 1.25).collect();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from(ssn)),
        Arc::new(StringArray::from(email)),
        Arc::new(Float64Array::from(balance)),
    ];
    RecordBatch::try_new(schema(), cols).expect("batch")
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ssn", DataType::Utf8, false),
        Field::new("email", DataType::Utf8, false),
        Field::new("balance", DataType::Float64, false),
    ]))
}

fn write(rt: &tokio::runtime::Runtime, path: &Path, encrypt: bool) {
    let mut props = WriterProperties::builder()
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(8192)
        .set_max_row_group_row_count(Some(250_000));
    if encrypt {
        let kms = keyring();
        let mut material = KeyMaterialWriter::new(&kms);
        let (footer, footer_md) = rt
            .block_on(material.data_key("kf", true))
            .expect("footer key");
        let (pii, pii_md) = rt
            .block_on(material.data_key("kc1", false))
            .expect("pii key");
        let (money, money_md) = rt
            .block_on(material.data_key("kc2", false))
            .expect("money key");
        let fep = FileEncryptionProperties::builder(footer.expose().to_vec())
            .with_footer_key_metadata(footer_md)
            .with_column_key_and_metadata("ssn", pii.expose().to_vec(), pii_md.clone())
            .with_column_key_and_metadata("email", pii.expose().to_vec(), pii_md)
            .with_column_key_and_metadata("balance", money.expose().to_vec(), money_md)
            .build()
            .expect("encryption");
        props = props.with_file_encryption_properties(fep);
    }
    #[expect(clippy::disallowed_methods, reason = "benchmark setup")]
    let file = std::fs::File::create(path).expect("create");
    let mut w = ArrowWriter::try_new(file, schema(), Some(props.build())).expect("writer");
    for start in (0..ROWS).step_by(50_000) {
        w.write(&batch(start, 50_000)).expect("write");
    }
    w.close().expect("close");
}

fn resolver() -> Arc<KeyResolver> {
    Arc::new(KeyResolver::new(
        Some(Arc::new(keyring())),
        HashMap::new(),
        DEFAULT_KEY_CACHE_TTL,
    ))
}

/// Starts the reference crypto service in process on a loopback port; returns its
/// remote provider.
#[expect(clippy::disallowed_methods, reason = "benchmark setup")]
fn remote(rt: &tokio::runtime::Runtime, dir: &Path) -> Arc<RemoteProvider> {
    std::fs::write(dir.join("keyring.json"), KEYRING).expect("keyring");
    std::fs::write(dir.join("jwt.secret"), JWT_SECRET).expect("secret");
    std::fs::write(
        dir.join("crypto-server.toml"),
        "[kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n\
         [auth]\naudience = \"clearice-crypto\"\nhs256_secret_file = \"jwt.secret\"\n\
         trusted_services = [\"bench\"]\n\
         [keys.kf]\nusers = [\"*\"]\n[keys.kc1]\nusers = [\"*\"]\n[keys.kc2]\nusers = [\"*\"]\n",
    )
    .expect("config");
    let config =
        clearice_crypto_server::Config::load(&dir.join("crypto-server.toml")).expect("config");
    let service = Arc::new(clearice_crypto_server::Service::new(config).expect("service"));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(async move {
        clearice_crypto_server::serve(service, listener, None, std::future::pending()).await
    });
    let mut config = RemoteConfig::new("bench", format!("http://{addr}"));
    config.credential = RemoteCredential::Hs256 {
        secret: SecretKey::from_bytes(JWT_SECRET.as_bytes().to_vec()),
        subject: "bench".into(),
        audience: "clearice-crypto".into(),
    };
    // The runtime's handle keeps the provider's connections on the bench runtime.
    let _guard = rt.enter();
    Arc::new(RemoteProvider::new(config, None).expect("remote provider"))
}

#[derive(Clone, Copy)]
enum Reader {
    /// parquet-rs's object-store reader (what DataFusion uses), no decryption.
    Plaintext,
    /// The same, with parquet-rs's own PME decryption.
    Native,
    /// ClearIce's decrypting reader (local provider) over the same store.
    ClearIce,
    /// ClearIce's decrypting reader with the remote provider (keys stay in the service).
    Remote,
    /// The same, reading the row groups last to first: the same requests and work, but
    /// nothing decrypted ahead (the reader decrypts the next row group only when reading
    /// forwards), to measure what decrypting ahead buys.
    RemoteBackwards,
}

/// 1 % of the rows, from the middle of the file.
fn one_percent() -> RowSelection {
    RowSelection::from(vec![
        RowSelector::skip(ROWS / 2),
        RowSelector::select(ROWS / 100),
        RowSelector::skip(ROWS / 2 - ROWS / 100),
    ])
}

async fn read(
    reader: Reader,
    path: &Path,
    resolver: &Arc<KeyResolver>,
    remote: &ProviderRef,
    selective: bool,
    metrics: &ExecutionPlanMetricsSet,
) -> usize {
    let policy = if selective {
        PageIndexPolicy::Required
    } else {
        PageIndexPolicy::Skip
    };
    let mut options = ArrowReaderOptions::new().with_page_index_policy(policy);
    // Every reader goes through the same local object store, as DataFusion's scans do.
    let store = Arc::new(object_store::local::LocalFileSystem::new());
    let size = tokio::fs::metadata(path).await.expect("size").len();
    let location = object_store::path::Path::from_filesystem_path(path).expect("path");
    let input: Box<dyn AsyncFileReader + Send> = match reader {
        Reader::Plaintext | Reader::Native => {
            if let Reader::Native = reader {
                let retriever = resolver.retriever_for_file(path.display().to_string(), None);
                options = options.with_file_decryption_properties(
                    FileDecryptionProperties::with_key_retriever(retriever)
                        .build()
                        .expect("props"),
                );
            }
            Box::new(
                datafusion::parquet::arrow::async_reader::ParquetObjectReader::new(store, location)
                    .with_file_size(size),
            )
        }
        Reader::ClearIce | Reader::Remote | Reader::RemoteBackwards => {
            let provider: ProviderRef = match reader {
                Reader::Remote | Reader::RemoteBackwards => Arc::clone(remote),
                _ => Arc::new(LocalProvider::new(Arc::clone(resolver), None)),
            };
            let grant = ScanGrant {
                principal: "bench".into(),
                scope: KeyScope::All,
                ..ScanGrant::unrestricted()
            };
            let keys = ScanKeys::new(grant, &provider);
            DecryptingReaderFactory::new(store, keys)
                .create_reader(
                    0,
                    PartitionedFile::new(location.to_string(), size),
                    None,
                    metrics,
                )
                .expect("reader")
        }
    };
    let mut b = ParquetRecordBatchStreamBuilder::new_with_options(Boxed(input), options)
        .await
        .expect("builder")
        .with_batch_size(8192);
    if selective {
        b = b.with_row_selection(one_percent());
    }
    if let Reader::RemoteBackwards = reader {
        let groups = b.metadata().num_row_groups();
        b = b.with_row_groups((0..groups).rev().collect());
    }
    let batches: Vec<RecordBatch> = b
        .build()
        .expect("stream")
        .try_collect()
        .await
        .expect("read");
    batches.iter().map(RecordBatch::num_rows).sum()
}

struct Boxed(Box<dyn AsyncFileReader + Send>);

impl AsyncFileReader for Boxed {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, datafusion::parquet::errors::Result<bytes::Bytes>> {
        self.0.get_bytes(range)
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, datafusion::parquet::errors::Result<Vec<bytes::Bytes>>>
    {
        self.0.get_byte_ranges(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<
        'a,
        datafusion::parquet::errors::Result<
            Arc<datafusion::parquet::file::metadata::ParquetMetaData>,
        >,
    > {
        self.0.get_metadata(options)
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let enc: PathBuf = dir.path().join("encrypted.parquet");
    let plain: PathBuf = dir.path().join("plain.parquet");
    write(&rt, &enc, true);
    write(&rt, &plain, false);
    let resolver = resolver();
    let remote_provider = remote(&rt, dir.path());
    let remote: ProviderRef = remote_provider.clone();
    // Provider calls, HTTP requests and decryption work per query, reported once.
    for (label, reader, selective) in [
        ("local", Reader::ClearIce, false),
        ("local", Reader::ClearIce, true),
        ("remote", Reader::Remote, false),
        ("remote", Reader::Remote, true),
        ("remote backwards", Reader::RemoteBackwards, false),
    ] {
        {
            let m = ExecutionPlanMetricsSet::new();
            let before = remote_provider.request_count();
            let rows = rt.block_on(read(reader, &enc, &resolver, &remote, selective, &m));
            let metrics = m.clone_inner();
            let get = |n: &str| metrics.sum_by_name(n).map_or(0, |v| v.as_usize());
            eprintln!(
                "clearice {label} {}: {rows} rows, {} provider calls ({} HTTP requests), {} chunks ({} of them ahead) and {} page ranges decrypted, {} modules",
                if selective { "1% range" } else { "full scan" },
                get("crypto_provider_calls"),
                remote_provider.request_count() - before,
                get("crypto_chunks_decrypted"),
                get("crypto_chunks_decrypted_ahead"),
                get("crypto_page_ranges_decrypted"),
                get("crypto_modules_decrypted"),
            );
        }
    }
    for (name, selective) in [("reader_full_scan", false), ("reader_1pct_range", true)] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(ROWS as u64));
        g.sample_size(20);
        for (label, reader, path) in [
            ("plaintext", Reader::Plaintext, &plain),
            ("parquet_rs_native", Reader::Native, &enc),
            ("clearice_local", Reader::ClearIce, &enc),
            ("clearice_remote", Reader::Remote, &enc),
            ("clearice_remote_backwards", Reader::RemoteBackwards, &enc),
            ("clearice_on_plaintext", Reader::ClearIce, &plain),
        ] {
            if selective && matches!(reader, Reader::RemoteBackwards) {
                // (A row selection counts rows in the order the row groups are read.)
                continue;
            }
            g.bench_function(label, |b| {
                b.to_async(&rt).iter(|| async {
                    read(
                        reader,
                        path,
                        &resolver,
                        &remote,
                        selective,
                        &ExecutionPlanMetricsSet::new(),
                    )
                    .await
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
