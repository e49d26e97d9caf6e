//! Scale-out over mutual TLS: a coordinator and three workers with certificates of one
//! cluster CA answer as one process does, and a worker refuses every peer that does not
//! present a certificate of that CA (or speaks plaintext), whatever credential it holds.

use std::path::Path;
use std::time::Duration;

use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::cluster::{QUERIES, cluster_with, still_answers};
use crate::common::*;
use clearice_testkit::certs::{ca, node};

const GET_WORKER_INFO: &str = "/worker.WorkerService/GetWorkerInfo";

/// `GetWorkerInfo` on the worker at `url` over `channel`, with the cluster's credential
/// when `signer` is given: the worker's status, or the transport's error.
async fn worker_info(
    url: &str,
    tls: Option<ClientTlsConfig>,
    signer: Option<&clearice_engine::TaskSigner>,
) -> Result<tonic::Code, String> {
    let mut endpoint = Channel::from_shared(url.to_owned()).unwrap();
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = datafusion_distributed::WorkerServiceClient::new(channel);
    let mut request = tonic::Request::new(datafusion_distributed::GetWorkerInfoRequest {});
    if let Some(s) = signer {
        request.metadata_mut().insert(
            "authorization",
            s.call_credential(GET_WORKER_INFO).parse().unwrap(),
        );
    }
    match tokio::time::timeout(Duration::from_secs(10), client.get_worker_info(request)).await {
        Err(_) => Err("no answer in 10 s".into()),
        Ok(Ok(_)) => Ok(tonic::Code::Ok),
        // The transport failing (the handshake refused, a TLS alert read as HTTP/2, the
        // connection closed under the call): the codes tonic gives a call the server never
        // answered.
        Ok(Err(s))
            if matches!(
                s.code(),
                tonic::Code::Unknown
                    | tonic::Code::Unavailable
                    | tonic::Code::Cancelled
                    | tonic::Code::Internal
            ) =>
        {
            Err(format!("{s:?}"))
        }
        Ok(Err(s)) => Ok(s.code()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_cluster_answers_as_one_process_and_refuses_other_peers() {
    let tmp = tempfile::tempdir().unwrap();
    let config = demo::init(&tmp.path().join("lake")).await.unwrap();
    let dir = config.parent().unwrap();
    let (ca_pem, issuer) = ca("ClearIce test cluster CA");
    let (cert, key) = node(&issuer);
    for (f, text) in [("ca.pem", &ca_pem), ("node.pem", &cert), ("node.key", &key)] {
        std::fs::write(dir.join(f), text).unwrap();
    }
    let tls = "tls_cert = \"node.pem\"\ntls_key = \"node.key\"\ntls_ca = \"ca.pem\"\n";
    let (coordinator, workers) = cluster_with(&config, tls, "https").await;
    let single = Engine::open(Config::load(&config).unwrap()).await.unwrap();
    for principal in ["admin", "analyst"] {
        for sql in QUERIES {
            // A denial (the analyst's `card_number`) is the same denial.
            let run = |engine: &Engine| {
                let session = engine.session(principal);
                async move {
                    query(&session, sql)
                        .await
                        .map(|b| json_rows(&b))
                        .map_err(|e| e.to_string())
                }
            };
            assert_eq!(
                run(&coordinator).await,
                run(&single).await,
                "{principal}: {sql}"
            );
        }
    }
    assert_eq!(coordinator.live_workers().unwrap().len(), 3);

    // Peers of the worker, each with the cluster's call credential.
    let url = &workers[0].url;
    let secret = std::fs::read(dir.join("cluster.secret")).unwrap();
    let signer =
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(60)).unwrap();
    let trusts_ca = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca_pem));
    // The cluster's certificate: taken (the control for the refusals below).
    let member = trusts_ca().identity(Identity::from_pem(&cert, &key));
    assert_eq!(
        worker_info(url, Some(member.clone()), Some(&signer)).await,
        Ok(tonic::Code::Ok)
    );
    // ...and without the credential, refused by the worker all the same.
    assert_eq!(
        worker_info(url, Some(member), None).await,
        Ok(tonic::Code::Unauthenticated)
    );
    // No client certificate, one from another CA, plaintext: the connection fails.
    let refused = |what: &str, r: Result<tonic::Code, String>| {
        assert!(r.is_err(), "{what}: {r:?}");
    };
    refused(
        "no client certificate",
        worker_info(url, Some(trusts_ca()), Some(&signer)).await,
    );
    let (_, rogue) = ca("another CA");
    let (rogue_cert, rogue_key) = node(&rogue);
    refused(
        "a certificate of another CA",
        worker_info(
            url,
            Some(trusts_ca().identity(Identity::from_pem(&rogue_cert, &rogue_key))),
            Some(&signer),
        )
        .await,
    );
    refused(
        "plaintext HTTP/2",
        worker_info(&url.replace("https://", "http://"), None, Some(&signer)).await,
    );
    // The cluster still answers.
    still_answers(&coordinator).await;
}

/// `[cluster]` with `extra`, opened as an engine: the error line, if any.
async fn open_with(dir: &Path, base: &str, extra: String) -> Result<(), String> {
    let path = dir.join("check.toml");
    std::fs::write(
        &path,
        format!("{base}\n[cluster]\nsecret_file = \"cluster.secret\"\n{extra}"),
    )
    .unwrap();
    Engine::open(Config::load(&path).map_err(|e| e.to_string())?)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tls_settings_are_checked_when_the_engine_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let config = demo::init(&tmp.path().join("lake")).await.unwrap();
    let dir = config.parent().unwrap();
    let base = std::fs::read_to_string(&config).unwrap();
    std::fs::write(dir.join("cluster.secret"), [b'k'; 40]).unwrap();
    let (ca_pem, issuer) = ca("CA");
    let (cert, key) = node(&issuer);
    for (f, text) in [("ca.pem", &ca_pem), ("node.pem", &cert), ("node.key", &key)] {
        std::fs::write(dir.join(f), text).unwrap();
    }
    let tls = "tls_cert = \"node.pem\"\ntls_key = \"node.key\"\ntls_ca = \"ca.pem\"\n";
    let ok = |extra: &str| open_with(dir, &base, extra.to_owned());
    assert_eq!(ok(tls).await, Ok(()));
    assert_eq!(
        ok(&format!("workers = [\"https://10.1.2.3:50061\"]\n{tls}")).await,
        Ok(())
    );
    assert_eq!(ok("workers = [\"http://127.0.0.1:50061\"]\n").await, Ok(()));
    let refused = |e: Result<(), String>, says: &[&str]| {
        let e = e.unwrap_err();
        assert!(says.iter().all(|s| e.contains(s)), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    };
    refused(
        ok("tls_cert = \"node.pem\"\ntls_ca = \"ca.pem\"\n").await,
        &["cluster.tls_cert", "together"],
    );
    refused(
        ok("probe_interval_ms = 0\n").await,
        &["cluster.probe_interval_ms", "at least 1"],
    );
    assert_eq!(ok("probe_interval_ms = 250\n").await, Ok(()));
    refused(
        ok("workers = [\"http://10.1.2.3:50061\"]\n").await,
        &["cluster.workers", "10.1.2.3", "not on loopback", "insecure"],
    );
    assert_eq!(
        ok("workers = [\"http://10.1.2.3:50061\"]\ninsecure = true\n").await,
        Ok(())
    );
    refused(
        ok(&format!("workers = [\"http://127.0.0.1:50061\"]\n{tls}")).await,
        &["cluster.workers", "https://"],
    );
    refused(
        ok("workers = [\"https://127.0.0.1:50061\"]\n").await,
        &["cluster.workers", "tls_cert"],
    );
    refused(
        ok("tls_cert = \"node.key\"\ntls_key = \"node.key\"\ntls_ca = \"ca.pem\"\n").await,
        &["cluster.tls_cert", "no PEM certificate"],
    );
    refused(
        ok("tls_cert = \"node.pem\"\ntls_key = \"missing.key\"\ntls_ca = \"ca.pem\"\n").await,
        &["cluster.tls_key", "missing.key"],
    );
    // The key is read, never echoed.
    let e = ok("tls_cert = \"node.pem\"\ntls_key = \"node.pem\"\ntls_ca = \"ca.pem\"\n")
        .await
        .unwrap_err();
    assert!(e.contains("no PEM private key"), "{e}");
    assert!(!e.contains(key.lines().nth(1).unwrap()), "{e}");
}
