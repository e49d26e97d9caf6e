//! The reference service over HTTP with ClearIce's remote provider as its client: modules
//! encrypted by the service under the key material's data key (checked with that key),
//! decrypted back, refused for a key without a rule, a body over the size limit refused,
//! and a graceful shutdown.
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use bytes::Bytes;
use clearice_crypto::protocol;
use clearice_crypto::{
    Algorithm, CallContext, CryptoProvider, KeyMaterialWriter, KeyringKms, Kms, Module,
    ModuleBatch, ModuleCipher, ModulePosition, ModuleType, ProviderError, RemoteConfig,
    RemoteCredential, RemoteProvider, SecretKey,
};

const SECRET: &str = "0123456789abcdef0123456789abcdef";
const KEYRING: &str = r#"{"k": "MDEyMzQ1Njc4OTAxMjM0NQ==", "nobody": "MTIzNDU2Nzg5MDEyMzQ1MA==", "t": "YWJjZGVmZ2hpamtsbW5vcA=="}"#;

fn batch(key: clearice_crypto::KeyRef, sizes: &[usize]) -> ModuleBatch {
    ModuleBatch {
        key,
        algorithm: Algorithm::AesGcmV1,
        column: Some("ssn".into()),
        modules: sizes
            .iter()
            .enumerate()
            .map(|(i, n)| Module {
                position: ModulePosition::new(ModuleType::DataPage, 0, 1, i),
                aad: format!("aad-{i}").into_bytes(),
                data: Bytes::from(vec![i as u8; *n]),
                nonce: None,
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_encrypts_decrypts_refuses_limits_and_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("keyring.json"), KEYRING).unwrap();
    std::fs::write(d.join("jwt.secret"), SECRET).unwrap();
    std::fs::write(
        d.join("c.toml"),
        "max_request_mb = 1\naudit = \"audit.jsonl\"\n\
         [kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n\
         [auth]\naudience = \"clearice-crypto\"\nhs256_secret_file = \"jwt.secret\"\ntrusted_services = [\"clearice\"]\n\
         [keys.k]\nusers = [\"ann\"]\n[keys.t]\nusers = [\"ann\"]\ntable_key = true\n",
    )
    .unwrap();
    let config = clearice_crypto_server::Config::load(&d.join("c.toml")).unwrap();
    let service = Arc::new(clearice_crypto_server::Service::new(config).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(clearice_crypto_server::serve(
        service,
        listener,
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut rc = RemoteConfig::new("svc", format!("http://{addr}"));
    rc.credential = RemoteCredential::Hs256 {
        secret: SecretKey::from_bytes(SECRET.as_bytes().to_vec()),
        subject: "clearice".into(),
        audience: "clearice-crypto".into(),
    };
    rc.max_request_bytes = 4 << 20; // larger than the service's limit, to reach it
    rc.timeout = Duration::from_secs(5);
    let remote = RemoteProvider::new(rc, None).unwrap();
    let ctx = CallContext {
        principal: "ann".into(),
        file: "/lake/f.parquet".into(),
        ..Default::default()
    };

    // Key material as a writer makes it; the service alone unwraps it.
    let kms = KeyringKms::from_json(KEYRING).unwrap();
    let mut writer = KeyMaterialWriter::new(&kms);
    let (dek, material) = writer.data_key("k", false).await.unwrap();
    let key = remote
        .describe_key(&ctx, Bytes::from(material))
        .await
        .unwrap();
    assert_eq!(key.key_id, "k");

    let plain = batch(key.clone(), &[10, 1000, 0]);
    let bodies = remote.encrypt(&ctx, plain.clone()).await.unwrap();
    assert_eq!(bodies.len(), 3);
    // The service encrypted under the material's data key, with each module's AAD.
    let cipher = ModuleCipher::new(dek.expose()).unwrap();
    for (m, body) in plain.modules.iter().zip(&bodies) {
        let out = cipher
            .decrypt(Algorithm::AesGcmV1, ModuleType::DataPage, &m.aad, body)
            .unwrap();
        assert_eq!(out, m.data.as_ref());
    }
    let mut encrypted = plain.clone();
    for (m, body) in encrypted.modules.iter_mut().zip(bodies) {
        m.data = Bytes::from(body);
    }
    let back = remote.decrypt(&ctx, encrypted.clone()).await.unwrap();
    assert_eq!(back[1], vec![1u8; 1000]);
    // A column chunk's worth of modules (12 × 200 KB) goes as 4 concurrent requests of
    // 3 modules each, answered in order.
    let big = batch(key.clone(), &[200_000; 12]);
    let sealed = remote.encrypt(&ctx, big.clone()).await.unwrap();
    let mut big_enc = big.clone();
    for (m, body) in big_enc.modules.iter_mut().zip(sealed) {
        m.data = Bytes::from(body);
    }
    let before = remote.request_count();
    let opened = remote.decrypt(&ctx, big_enc).await.unwrap();
    assert_eq!(remote.request_count() - before, 4);
    assert_eq!(opened.len(), 12);
    for (m, p) in big.modules.iter().zip(&opened) {
        assert_eq!(p, &m.data);
    }
    // A module moved to another position (AAD) fails with its index.
    let mut moved = encrypted.clone();
    moved.modules[1].aad = b"aad-elsewhere".to_vec();
    match remote.decrypt(&ctx, moved).await {
        Err(ProviderError::Invalid { index: 1, .. }) => {}
        other => panic!("expected Invalid at 1, got {other:?}"),
    }

    // The JSON transport (DBPS-style: base64 value in the JSON body) answers the same.
    let req = protocol::BatchRequest {
        column_reference: protocol::ColumnReference {
            name: Some("ssn".into()),
        },
        encryption: protocol::EncryptionRef {
            key_id: "k".into(),
            key_metadata: BASE64_STANDARD.encode(&key.key_metadata),
        },
        access: protocol::Access {
            user_id: "ann".into(),
            ..Default::default()
        },
        data_batch_encrypted: Some(protocol::DataBatch {
            value_format: protocol::ValueFormat {
                format: protocol::MODULES_FORMAT.into(),
                algorithm: "AES_GCM_V1".into(),
            },
            value: protocol::frame(encrypted.modules.iter().map(|m| m.data.as_ref())),
        }),
        modules: encrypted
            .modules
            .iter()
            .map(|m| protocol::ModuleInfo {
                kind: m.position.kind as u8,
                page: m.position.page,
                column: m.position.column,
                aad: BASE64_STANDARD.encode(&m.aad),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let token = clearice_crypto::mint_hs256(
        &SecretKey::from_bytes(SECRET.as_bytes().to_vec()),
        "clearice",
        "clearice-crypto",
        Duration::from_secs(60),
    );
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/decrypt"))
        .bearer_auth(token.expose())
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: protocol::BatchResponse = resp.json().await.unwrap();
    assert_eq!(answer.access.access_control.as_deref(), Some("granted"));
    let plain = protocol::unframe(&answer.data_batch.unwrap().value, 3).unwrap();
    assert_eq!(plain[1], vec![1u8; 1000]);

    // Another user, and a key without a rule: refused by the service.
    let bob = CallContext {
        principal: "bob".into(),
        ..ctx.clone()
    };
    match remote.decrypt(&bob, encrypted).await {
        Err(ProviderError::Denied {
            key_id, principal, ..
        }) => {
            assert_eq!((key_id.as_str(), principal.as_str()), ("k", "bob"))
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    let (_, nobody) = writer.data_key("nobody", false).await.unwrap();
    let nobody = remote
        .describe_key(&ctx, Bytes::from(nobody))
        .await
        .unwrap();
    assert!(matches!(
        remote.encrypt(&ctx, batch(nobody, &[4])).await,
        Err(ProviderError::Denied { .. })
    ));

    // Table keys of tables Iceberg encrypts (`table_key = true`): the service wraps and
    // unwraps key encryption keys under the master key it keeps, for a trusted service
    // acting for a user its rules allow, in the KMS's own wrap format (the keyring's,
    // which Iceberg's Java client reads too).
    let kek = [7u8; 16];
    let wrapped = remote.wrap_key(&ctx, &kek, "t").await.unwrap();
    let local = kms
        .unwrap_key(&BASE64_STANDARD.encode(&wrapped), "t")
        .await
        .unwrap();
    assert_eq!(local.expose(), &kek);
    let back = remote.unwrap_key(&ctx, &wrapped, "t").await.unwrap();
    assert_eq!(back.expose(), &kek);
    match remote.unwrap_key(&bob, &wrapped, "t").await {
        Err(ProviderError::Denied {
            key_id, principal, ..
        }) => {
            assert_eq!((key_id.as_str(), principal.as_str()), ("t", "bob"))
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    assert!(matches!(
        remote.wrap_key(&bob, &kek, "t").await,
        Err(ProviderError::Denied { .. })
    ));
    // A module key is never released: PME wraps its key encryption keys the same way, so
    // /unwrap would hand out what /decrypt keeps in the service.
    let pme_wrapped = remote.wrap_key(&ctx, &kek, "k").await;
    assert!(
        matches!(pme_wrapped, Err(ProviderError::Denied { .. })),
        "{pme_wrapped:?}"
    );
    let module_kek = BASE64_STANDARD
        .decode(kms.wrap_key(&kek, "k").await.unwrap())
        .unwrap();
    assert!(matches!(
        remote.unwrap_key(&ctx, &module_kek, "k").await,
        Err(ProviderError::Denied { .. })
    ));
    // ...and a table key does no module cryptography.
    let (_, table_material) = writer.data_key("t", false).await.unwrap();
    let table_ref = remote
        .describe_key(&ctx, Bytes::from(table_material))
        .await
        .unwrap();
    assert!(matches!(
        remote.encrypt(&ctx, batch(table_ref, &[4])).await,
        Err(ProviderError::Denied { .. })
    ));
    // A user's own token does not get table keys released, even one the rules name.
    let ann_token = clearice_crypto::mint_hs256(
        &SecretKey::from_bytes(SECRET.as_bytes().to_vec()),
        "ann",
        "clearice-crypto",
        Duration::from_secs(60),
    );
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/unwrap"))
        .bearer_auth(ann_token.expose())
        .json(&protocol::WrapRequest {
            key_id: "t".into(),
            key: BASE64_STANDARD.encode(&wrapped),
            ..Default::default()
        })
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let mut flipped = wrapped.clone();
    flipped[20] ^= 1;
    match remote.unwrap_key(&ctx, &flipped, "t").await {
        Err(ProviderError::Unavailable { reason, .. }) => {
            assert!(reason.contains("does not unwrap under 't'"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let audit = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().any(|r| r["operation"] == "unwrap_key"
        && r["user"] == "ann"
        && r["granted"] == true
        && r["error"].is_null()));
    assert!(lines.iter().any(|r| {
        r["operation"] == "unwrap_key"
            && r["user"] == "ann"
            && r["error"]
                .as_str()
                .is_some_and(|e| e.contains("does not unwrap"))
    }));
    assert!(
        lines.iter().any(|r| r["operation"] == "unwrap_key"
            && r["subject"] == "ann"
            && r["granted"] == false)
    );
    assert!(!audit.contains(&BASE64_STANDARD.encode(kek)), "{audit}");

    // Over the service's 1 MiB body limit: refused, not buffered.
    match remote.encrypt(&ctx, batch(key.clone(), &[2 << 20])).await {
        Err(ProviderError::Unavailable { reason, .. }) => {
            assert!(reason.contains("413"), "{reason}")
        }
        other => panic!("expected 413, got {other:?}"),
    }

    // The audit names users, keys and decisions, never key bytes.
    let audit = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    assert!(audit.contains("\"user\":\"bob\"") && audit.contains("\"granted\":false"));
    assert!(!audit.contains("MDEyMzQ1Njc4OTAxMjM0NQ=="));

    // Graceful shutdown: serve returns, and the port no longer answers.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("serve did not stop")
        .unwrap()
        .unwrap();
    match remote.decrypt(&ctx, batch(key, &[1])).await {
        Err(ProviderError::Unavailable { reason, .. }) => {
            assert!(reason.contains("cannot connect"), "{reason}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
