//! Page decryption: ClearIce's `ModuleCipher` (ring for AES-GCM-128/256, RustCrypto for
//! AES-CTR) vs `ring` called directly (what parquet-rs's native decryption uses), 128 and
//! 256-bit keys, 64 KiB pages.
//!
//! `cargo bench -p clearice-benches --bench ciphers`
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented pub fn"
)]

use clearice_crypto::{Algorithm, ModuleCipher, ModuleType};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

const PAGE: usize = 64 * 1024;

fn bench(c: &mut Criterion) {
    let page = vec![7u8; PAGE];
    let nonce = [3u8; 12];
    let mut g = c.benchmark_group("decrypt_64KiB_page");
    g.throughput(Throughput::Bytes(PAGE as u64));
    for (bits, alg) in [(128, &AES_128_GCM), (256, &AES_256_GCM)] {
        let key = vec![1u8; bits / 8];
        let cipher = ModuleCipher::new(&key).expect("key");
        let body = cipher
            .encrypt(
                Algorithm::AesGcmV1,
                ModuleType::DataPage,
                b"aad",
                &nonce,
                &page,
            )
            .expect("encrypt");
        g.bench_function(format!("module_cipher_gcm_{bits}"), |b| {
            let mut out = Vec::with_capacity(PAGE);
            b.iter(|| {
                out.clear();
                cipher
                    .decrypt_into(
                        Algorithm::AesGcmV1,
                        ModuleType::DataPage,
                        b"aad",
                        &body,
                        &mut out,
                    )
                    .expect("decrypt");
            })
        });
        let ring_key = LessSafeKey::new(UnboundKey::new(alg, &key).expect("key"));
        g.bench_function(format!("ring_direct_gcm_{bits}"), |b| {
            let mut buf = Vec::with_capacity(PAGE + 16);
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(&body[12..]);
                ring_key
                    .open_in_place(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(b"aad"),
                        &mut buf,
                    )
                    .expect("open");
            })
        });
        let ctr = cipher
            .encrypt(
                Algorithm::AesGcmCtrV1,
                ModuleType::DataPage,
                b"",
                &nonce,
                &page,
            )
            .expect("encrypt");
        g.bench_function(format!("module_cipher_ctr_{bits}"), |b| {
            let mut out = Vec::with_capacity(PAGE);
            b.iter(|| {
                out.clear();
                cipher
                    .decrypt_into(
                        Algorithm::AesGcmCtrV1,
                        ModuleType::DataPage,
                        b"",
                        &ctr,
                        &mut out,
                    )
                    .expect("decrypt");
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
