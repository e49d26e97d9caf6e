//! The encrypted demo table read from an S3-compatible server on loopback (`moto_server`,
//! started here) vs the same table on local disk, in one run: a full scan and a 1 %
//! filter, plus the HTTP requests (GETs) each query sends to S3.
//!
//! `CLEARICE_PYTHON=.../venv/bin/python cargo bench -p clearice-benches --bench s3`
//! (the venv of `scripts/test.sh`, which has `moto_server`; without it the bench skips).
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented pub fn"
)]
// A benchmark harness may block: it is not an async worker serving anyone.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clearice_benches::run;
use clearice_demo::{self as demo, DemoOptions};
use clearice_engine::{Config, Engine, S3Options, Secret};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const QUERIES: &[(&str, &str)] = &[
    ("full_scan", "SELECT * FROM lake.sales.customers"),
    (
        "filter_1pct",
        "SELECT id, email FROM lake.sales.customers WHERE id % 100 = 7",
    ),
];

struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto(python: &str) -> (Moto, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let child = Command::new(Path::new(python).with_file_name("moto_server"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(60), "moto_server");
        std::thread::sleep(Duration::from_millis(100));
    }
    let endpoint = format!("http://127.0.0.1:{port}");
    let made = Command::new(python)
        .args([
            "-c",
            &format!(
                "import boto3; boto3.client('s3', endpoint_url='{endpoint}', aws_access_key_id='bench', \
                 aws_secret_access_key='bench', region_name='us-east-1').create_bucket(Bucket='bench')"
            ),
        ])
        .output()
        .expect("python");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (Moto(child), endpoint)
}

fn s3(c: &mut Criterion) {
    let Ok(python) = std::env::var("CLEARICE_PYTHON") else {
        eprintln!("SKIPPED: set CLEARICE_PYTHON to a python whose bin/ has moto_server");
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (_moto, endpoint) = start_moto(&python);
    let dir = tempfile::tempdir().expect("tempdir");
    let options = S3Options {
        endpoint: Some(endpoint),
        region: Some("us-east-1".into()),
        access_key_id: Some("bench".into()),
        secret_access_key: Some(Secret::new("bench")),
        ..Default::default()
    };
    let (local, remote) = rt.block_on(async {
        let local = demo::init(&dir.path().join("local"))
            .await
            .expect("local lake");
        let remote = demo::init_with(
            &dir.path().join("s3"),
            DemoOptions {
                warehouse: Some("s3://bench/lake".into()),
                s3: options,
                ..Default::default()
            },
        )
        .await
        .expect("S3 lake");
        let secret = dir.path().join("s3.secret");
        std::fs::write(&secret, "bench").expect("secret");
        let text = std::fs::read_to_string(&remote).expect("config").replace(
            "[storage.s3]\n",
            &format!(
                "[storage.s3]\naccess_key_id = \"bench\"\nsecret_access_key_file = \"{}\"\n",
                secret.display()
            ),
        );
        std::fs::write(&remote, text).expect("config");
        let open = |p: std::path::PathBuf| async move {
            Arc::new(
                Engine::open(Config::load(&p).expect("config"))
                    .await
                    .expect("engine"),
            )
        };
        (open(local).await, open(remote).await)
    });
    let (on_disk, on_s3) = (local.session("admin"), remote.session("admin"));
    for (name, sql) in QUERIES {
        // Requests per query, outside the timing.
        let before = remote.storage_requests();
        let rows = rt.block_on(run(&on_s3, sql));
        let after = remote.storage_requests();
        eprintln!(
            "{name}: {rows} rows; S3 requests per query: {} GET, {} HEAD",
            after.get - before.get,
            after.head - before.head
        );
        let mut g = c.benchmark_group(format!("s3_{name}"));
        g.throughput(Throughput::Elements(demo::CUSTOMERS as u64));
        g.sample_size(20);
        g.bench_function("local_disk", |b| {
            b.to_async(&rt).iter(|| run(&on_disk, sql))
        });
        g.bench_function("s3_loopback", |b| b.to_async(&rt).iter(|| run(&on_s3, sql)));
        g.finish();
    }
}

criterion_group!(benches, s3);
criterion_main!(benches);
