//! `clearice serve`: the Flight SQL endpoint with TLS, auth and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clearice_engine::Engine;
use clearice_flight::ClearIceFlightSql;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Runs the server until SIGINT or SIGTERM; returns the exit code.
#[expect(
    clippy::disallowed_methods,
    reason = "TLS files and the address file, once at startup before serving"
)]
pub async fn run(
    engine: Arc<Engine>,
    addr: Option<String>,
    addr_file: Option<PathBuf>,
    metrics: &MetricsArgs,
    cpu: clearice_engine::CpuExecutor,
) -> Result<i32> {
    let config = engine.config().clone();
    let server = config.server.clone().unwrap_or_default();
    let addr = addr
        .or(server.addr.clone())
        .unwrap_or_else(|| "127.0.0.1:50051".into());
    let sock: SocketAddr = tokio::net::lookup_host(&addr)
        .await
        .with_context(|| format!("cannot resolve listen address '{addr}'"))?
        .next()
        .with_context(|| format!("no address for '{addr}'"))?;
    let tls = match (&server.tls_cert, &server.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                let p = config.resolve(p);
                std::fs::read(&p).with_context(|| format!("[server] TLS file '{}'", p.display()))
            };
            let mut tls =
                ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
            if let Some(ca) = &server.tls_client_ca {
                tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
            }
            Some(tls)
        }
        (None, None) => None,
        _ => bail!("[server] needs both tls_cert and tls_key for TLS"),
    };
    if tls.is_none() && !sock.ip().is_loopback() && !server.insecure {
        bail!(
            "refusing to listen on {sock} without TLS: set [server] tls_cert and tls_key, or insecure = true to accept plaintext"
        );
    }
    if server.users.is_empty() {
        bail!("[server] has no users: add [server.users.NAME] password_hash = \"$argon2id$...\"");
    }
    let demo: Vec<&String> = server
        .users
        .iter()
        .filter(|(_, u)| u.demo)
        .map(|(n, _)| n)
        .collect();
    if !demo.is_empty() {
        tracing::warn!(users = ?demo, "demo users whose password equals their name are enabled: for the demo only");
        eprintln!(
            "WARNING: demo users {demo:?} have their name as password; do not expose this server"
        );
    }
    let listener = tokio::net::TcpListener::bind(sock)
        .await
        .with_context(|| format!("cannot listen on {sock}"))?;
    let bound = listener.local_addr()?;
    // Bound before the server says it is ready: a metrics port in use stops it first.
    engine.report_memory_pool();
    let metrics = start_metrics(&config.metrics, metrics, |p| config.resolve(p)).await?;
    let scheme = if tls.is_some() { "grpc+tls" } else { "grpc" };
    println!("ClearIce Flight SQL listening on {scheme}://{bound}");
    if let Some(f) = addr_file {
        std::fs::write(&f, bound.to_string())
            .with_context(|| format!("cannot write '{}'", f.display()))?;
    }
    // After a burst, give freed memory back to the OS: every 10 s while no query holds
    // pool memory (the trim runs on a blocking thread and takes milliseconds).
    let idle = Arc::clone(&engine);
    #[expect(
        clippy::disallowed_methods,
        reason = "a background timer of the server's IO runtime, aborted when the server stops"
    )]
    let trimmer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if idle.memory_reserved() == 0 {
                let _ = tokio::task::spawn_blocking(crate::memory::release_free_memory).await;
            }
        }
    });
    let service = ClearIceFlightSql::new(engine, &server).with_cpu_executor(cpu);
    clearice_flight::serve(service, listener, tls, shutdown_signal()).await?;
    trimmer.abort();
    metrics.abort();
    println!("ClearIce Flight SQL stopped");
    Ok(0)
}

/// `clearice crypto-server --config FILE`: runs the reference crypto service until
/// SIGINT or SIGTERM; returns the exit code.
#[expect(
    clippy::disallowed_methods,
    reason = "the address file, once at startup before serving"
)]
pub async fn crypto_server(
    path: &std::path::Path,
    addr: Option<String>,
    addr_file: Option<PathBuf>,
    metrics: &MetricsArgs,
) -> Result<i32> {
    use clearice_crypto_server::{Config, Service, tls_acceptor};
    let owned = path.to_owned();
    let (service, tls, config) = tokio::task::spawn_blocking(move || {
        let config = Config::load(&owned)?;
        let tls = tls_acceptor(&config)?;
        let service = Service::new(config.clone())?;
        Ok::<_, clearice_crypto_server::Error>((service, tls, config))
    })
    .await??;
    let addr = addr
        .or(config.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8443".into());
    let sock: SocketAddr = tokio::net::lookup_host(&addr)
        .await
        .with_context(|| format!("cannot resolve listen address '{addr}'"))?
        .next()
        .with_context(|| format!("no address for '{addr}'"))?;
    if tls.is_none() && !sock.ip().is_loopback() && !config.insecure {
        bail!(
            "refusing to listen on {sock} without TLS: set [tls] cert and key, or insecure = true to accept plaintext"
        );
    }
    let listener = tokio::net::TcpListener::bind(sock)
        .await
        .with_context(|| format!("cannot listen on {sock}"))?;
    let bound = listener.local_addr()?;
    let metrics = start_metrics(&config.metrics, metrics, |p| config.resolve(p)).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("ClearIce crypto-server listening on {scheme}://{bound}");
    if let Some(f) = addr_file {
        std::fs::write(&f, bound.to_string())
            .with_context(|| format!("cannot write '{}'", f.display()))?;
    }
    clearice_crypto_server::serve(Arc::new(service), listener, tls, shutdown_signal()).await?;
    metrics.abort();
    println!("ClearIce crypto-server stopped");
    Ok(0)
}

/// Runs a cluster worker (`clearice worker`) until SIGINT or SIGTERM; returns the exit code.
#[expect(
    clippy::disallowed_methods,
    reason = "the address file, once at startup before serving"
)]
pub async fn worker(
    engine: Engine,
    addr: Option<String>,
    addr_file: Option<PathBuf>,
    metrics: &MetricsArgs,
) -> Result<i32> {
    // Fails early (before listening) without a cluster secret.
    engine.worker_service()?;
    let cluster = engine.config().cluster.as_ref();
    let insecure = cluster.is_some_and(|c| c.insecure);
    // Checked together with tls_key and tls_ca when the engine opened.
    let tls = cluster.is_some_and(|c| c.tls_cert.is_some());
    let addr = addr.unwrap_or_else(|| "127.0.0.1:50061".into());
    let sock: SocketAddr = tokio::net::lookup_host(&addr)
        .await
        .with_context(|| format!("cannot resolve listen address '{addr}'"))?
        .next()
        .with_context(|| format!("no address for '{addr}'"))?;
    // Without TLS, stage results (decrypted, masked rows) cross this connection in
    // plaintext.
    if !tls && !sock.ip().is_loopback() && !insecure {
        bail!(
            "refusing to listen on {sock} without TLS: set [cluster] tls_cert, tls_key and \
             tls_ca (mutual TLS), or insecure = true to accept plaintext"
        );
    }
    let listener = tokio::net::TcpListener::bind(sock)
        .await
        .with_context(|| format!("cannot listen on {sock}"))?;
    let bound = listener.local_addr()?;
    engine.report_memory_pool();
    let config = engine.config().clone();
    let metrics = start_metrics(&config.metrics, metrics, |p| config.resolve(p)).await?;
    let scheme = if tls { "https" } else { "http" };
    println!("ClearIce worker listening on {scheme}://{bound}");
    if let Some(f) = addr_file {
        std::fs::write(&f, bound.to_string())
            .with_context(|| format!("cannot write '{}'", f.display()))?;
    }
    engine.serve_worker(listener, shutdown_signal()).await?;
    metrics.abort();
    println!("ClearIce worker stopped");
    Ok(0)
}

/// Where the Prometheus endpoint listens (`serve`, `worker`, `crypto-server`).
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Prometheus `/metrics` listen address; port 0 picks a free port. Default: the
    /// config's `[metrics] addr`, else none.
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Write the bound metrics address (host:port) to this file once listening.
    #[arg(long)]
    metrics_addr_file: Option<PathBuf>,
}

/// A running `/metrics` endpoint (or none), stopped with the server.
struct MetricsTask(Option<tokio::task::JoinHandle<()>>);

impl MetricsTask {
    fn abort(self) {
        if let Some(t) = self.0 {
            t.abort();
        }
    }
}

/// Starts the `/metrics` endpoint `config` and `args` describe, if any.
#[expect(
    clippy::disallowed_methods,
    reason = "the address file, once at startup; the endpoint's task is aborted when the server stops"
)]
async fn start_metrics(
    config: &clearice_metrics::MetricsConfig,
    args: &MetricsArgs,
    resolve: impl Fn(&std::path::Path) -> PathBuf,
) -> Result<MetricsTask> {
    let Some(endpoint) =
        clearice_metrics::Endpoint::bind(config, args.metrics_addr.clone(), resolve).await?
    else {
        return Ok(MetricsTask(None));
    };
    println!("ClearIce metrics on {}", endpoint.url()?);
    if let Some(f) = &args.metrics_addr_file {
        std::fs::write(f, endpoint.local_addr()?.to_string())
            .with_context(|| format!("cannot write '{}'", f.display()))?;
    }
    Ok(MetricsTask(Some(tokio::spawn(async move {
        if let Err(e) = endpoint.serve(std::future::pending()).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    }))))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
