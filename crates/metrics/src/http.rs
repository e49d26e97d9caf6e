//! Serving an axum router over HTTP/1.1 and HTTP/2, in plaintext or TLS, with graceful
//! shutdown: the crypto-server's API and the `/metrics` endpoint.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

/// Longest a TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` (TLS when `tls` is given) until `shutdown`; requests
/// still running then get 10 s to end.
pub async fn serve(
    app: axum::Router,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors, say: pause rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // An answer goes out as several writes (a body of many buffers): without this,
        // Nagle holds its last small write until the client's delayed ACK (40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {e}");
        }
        let svc = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        match &tls {
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                #[expect(
                    clippy::disallowed_methods,
                    reason = "one task per connection, as hyper serves; graceful shutdown waits for it"
                )]
                tokio::spawn(async move {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    let _ = watcher.watch(conn.into_owned()).await;
                });
            }
            None => {
                let conn = builder
                    .serve_connection(TokioIo::new(stream), svc)
                    .into_owned();
                let fut = graceful.watch(conn);
                #[expect(
                    clippy::disallowed_methods,
                    reason = "one task per connection, as hyper serves; graceful shutdown waits for it"
                )]
                tokio::spawn(async move {
                    let _ = fut.await;
                });
            }
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => {
            tracing::warn!("requests still running after 10 s; stopping");
        }
    }
    Ok(())
}

/// A TLS acceptor for a PEM certificate chain and private key (HTTP/2 and HTTP/1.1);
/// the error names which of the two is unusable (`cert`, `key`) and why.
pub fn tls_acceptor(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<tokio_rustls::TlsAcceptor, (&'static str, String)> {
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ("cert", e.to_string()))?;
    if certs.is_empty() {
        return Err(("cert", "no certificate in the file".into()));
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| ("key", e.to_string()))?
        .ok_or_else(|| ("key", "no private key in the file".into()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut server = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ("cert", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ("cert", e.to_string()))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}
