//! Full scan and aggregate of the demo customers table (100k rows, 4 files), PME
//! encrypted vs the same data in plaintext, and policy-enforced (masked, as `analyst`)
//! vs plain (`admin`) on the encrypted lake, in one run.
//!
//! `cargo bench -p clearice-benches --bench scan`
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented pub fn"
)]

use clearice_benches::{Fixture, run};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const QUERIES: &[(&str, &str)] = &[
    ("full_scan", "SELECT * FROM lake.sales.customers"),
    (
        "aggregate",
        "SELECT country, count(ssn), sum(balance) FROM lake.sales.customers GROUP BY country",
    ),
    (
        "filter_1pct",
        "SELECT id, email FROM lake.sales.customers WHERE ssn LIKE '12%'",
    ),
];

fn scan(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fx = rt.block_on(Fixture::demo());
    for (name, sql) in QUERIES {
        let mut g = c.benchmark_group(*name);
        g.throughput(Throughput::Elements(clearice_demo::CUSTOMERS as u64));
        g.sample_size(20);
        g.bench_function("plaintext", |b| {
            b.to_async(&rt).iter(|| run(&fx.plaintext, sql))
        });
        g.bench_function("encrypted", |b| {
            b.to_async(&rt).iter(|| run(&fx.encrypted, sql))
        });
        g.bench_function("encrypted_masked", |b| {
            b.to_async(&rt).iter(|| run(&fx.masked, sql))
        });
        g.finish();
    }
}

criterion_group!(benches, scan);
criterion_main!(benches);
