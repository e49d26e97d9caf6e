//! `[metrics]`: the `/metrics` endpoint a Prometheus server scrapes.
//!
//! ```toml
//! [metrics]
//! addr = "127.0.0.1:9464"        # absent: no endpoint
//! token_file = "metrics.token"   # a bearer token scrapes must send (required off loopback)
//! tls_cert = "metrics.pem"       # TLS (required off loopback, unless insecure = true)
//! tls_key = "metrics.key"
//! ```
//!
//! The series name principals and count their statements: off the loopback interface a
//! scrape must authenticate (Prometheus' `authorization: { credentials_file: ... }`), and
//! the token does not cross the network in plaintext unless `insecure = true` says so.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use crate::{Error, MetricsConfig};

/// Shortest bearer token accepted in `token_file`, bytes.
const MIN_TOKEN: usize = 16;

/// A bound `/metrics` endpoint, not yet serving.
pub struct Endpoint {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// SHA-256 of the token scrapes must send.
    token: Option<[u8; 32]>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.listener.local_addr().ok())
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.is_some())
            .finish()
    }
}

fn config_error(key: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        key: format!("[metrics] {key}"),
        reason: reason.into(),
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Endpoint {
    /// Checks `config` and binds its address (`addr` overrides it); `resolve` turns a
    /// configured path into a file to read (relative to the config file). `None`: no
    /// endpoint is configured.
    pub async fn bind(
        config: &MetricsConfig,
        addr: Option<String>,
        resolve: impl Fn(&Path) -> PathBuf,
    ) -> Result<Option<Self>, Error> {
        let Some(addr) = addr.or_else(|| config.addr.clone()) else {
            return Ok(None);
        };
        let sock: SocketAddr = tokio::net::lookup_host(&addr)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| config_error("addr", format!("cannot resolve '{addr}'")))?;
        let read = |key: &str, p: &Path| {
            let p = resolve(p);
            let key = key.to_owned();
            async move {
                tokio::fs::read(&p)
                    .await
                    .map_err(|e| config_error(&key, format!("cannot read '{}': {e}", p.display())))
            }
        };
        let token = match &config.token_file {
            Some(p) => {
                let bytes = read("token_file", p).await?;
                let token = String::from_utf8_lossy(&bytes).trim().to_owned();
                if token.len() < MIN_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(config_error(
                        "token_file",
                        format!("the token must be at least {MIN_TOKEN} visible ASCII characters"),
                    ));
                }
                Some(sha256(token.as_bytes()))
            }
            None => None,
        };
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(c), Some(k)) => {
                let (cert, key) = (read("tls_cert", c).await?, read("tls_key", k).await?);
                Some(
                    crate::http::tls_acceptor(&cert, &key)
                        .map_err(|(which, reason)| config_error(&format!("tls_{which}"), reason))?,
                )
            }
            (None, None) => None,
            _ => {
                return Err(config_error(
                    "tls_cert",
                    "TLS needs both tls_cert and tls_key",
                ));
            }
        };
        if !sock.ip().is_loopback() {
            if token.is_none() {
                return Err(config_error(
                    "token_file",
                    format!("metrics on {sock} (not loopback) need a bearer token: set token_file"),
                ));
            }
            if tls.is_none() && !config.insecure {
                return Err(config_error(
                    "tls_cert",
                    format!(
                        "refusing to serve metrics on {sock} without TLS: set tls_cert and tls_key, or insecure = true to accept plaintext"
                    ),
                ));
            }
        }
        let listener = TcpListener::bind(sock)
            .await
            .map_err(|e| config_error("addr", format!("cannot listen on {sock}: {e}")))?;
        Ok(Some(Self {
            listener,
            tls,
            token,
        }))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Its URL (`http(s)://host:port/metrics`).
    pub fn url(&self) -> std::io::Result<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Ok(format!("{scheme}://{}/metrics", self.local_addr()?))
    }

    /// Answers scrapes until `shutdown`.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let token = self.token;
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move |headers: HeaderMap| async move { scrape(&headers, token) }),
        );
        crate::http::serve(app, self.listener, self.tls, shutdown).await
    }
}

/// One scrape: the bearer token checked (when one is configured), then the series in
/// the format the scraper accepts (OpenMetrics, else Prometheus text 0.0.4).
fn scrape(headers: &HeaderMap, token: Option<[u8; 32]>) -> Response {
    if let Some(want) = token {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| sha256(t.trim().as_bytes()));
        // Digests compared: the time taken says nothing about the token.
        if sent != Some(want) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a bearer token is required\n",
            )
                .into_response();
        }
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let content_type = if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE
    };
    (
        [(header::CONTENT_TYPE, content_type)],
        crate::encode(openmetrics),
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    fn config(addr: &str, token_file: Option<&str>, insecure: bool) -> MetricsConfig {
        MetricsConfig {
            addr: Some(addr.into()),
            token_file: token_file.map(PathBuf::from),
            insecure,
            ..MetricsConfig::default()
        }
    }

    async fn refusal(c: &MetricsConfig, dir: &Path) -> String {
        match Endpoint::bind(c, None, |p| dir.join(p)).await {
            Err(e) => e.to_string(),
            Ok(e) => panic!("bound {e:?}"),
        }
    }

    #[tokio::test]
    async fn off_loopback_an_endpoint_needs_a_token_and_tls_or_insecure() {
        let dir = std::env::temp_dir().join(format!("clearice-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("short"), "abc\n").unwrap();
        std::fs::write(dir.join("token"), "0123456789abcdef0123\n").unwrap();
        let e = refusal(&config("0.0.0.0:0", None, false), &dir).await;
        assert!(e.starts_with("[metrics] token_file: "), "{e}");
        let e = refusal(&config("0.0.0.0:0", Some("token"), false), &dir).await;
        assert!(e.starts_with("[metrics] tls_cert: refusing"), "{e}");
        let e = refusal(&config("127.0.0.1:0", Some("short"), false), &dir).await;
        assert!(e.contains("at least 16"), "{e}");
        std::fs::write(dir.join("spaced"), "0123456789 abcdef0123\n").unwrap();
        let e = refusal(&config("127.0.0.1:0", Some("spaced"), false), &dir).await;
        assert!(e.contains("visible ASCII"), "{e}");
        let e = refusal(&config("127.0.0.1:0", Some("absent"), false), &dir).await;
        assert!(e.contains("cannot read") && e.contains("absent"), "{e}");
        let c = config("0.0.0.0:0", Some("token"), true);
        let bound = Endpoint::bind(&c, None, |p| dir.join(p)).await.unwrap();
        assert!(bound.is_some_and(|b| b.token.is_some()));
        // Loopback needs neither; no address, no endpoint.
        let c = config("127.0.0.1:0", None, false);
        assert!(
            Endpoint::bind(&c, None, |p| dir.join(p))
                .await
                .unwrap()
                .is_some()
        );
        let none = MetricsConfig::default();
        assert!(
            Endpoint::bind(&none, None, |p| dir.join(p))
                .await
                .unwrap()
                .is_none()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_scrape_without_the_token_is_refused() {
        let token = Some(sha256(b"0123456789abcdef"));
        let mut headers = HeaderMap::new();
        assert_eq!(scrape(&headers, token).status(), StatusCode::UNAUTHORIZED);
        headers.insert(
            header::AUTHORIZATION,
            "Bearer 0123456789abcdeX".parse().unwrap(),
        );
        assert_eq!(scrape(&headers, token).status(), StatusCode::UNAUTHORIZED);
        // The scheme's case does not matter (RFC 7235).
        headers.insert(
            header::AUTHORIZATION,
            "bearer 0123456789abcdef".parse().unwrap(),
        );
        let ok = scrape(&headers, token);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()[header::CONTENT_TYPE],
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE
        );
    }
}
