//! Mutual TLS between the processes of a cluster: one certificate and key per process
//! (presented as server by a worker and as client by coordinator and workers), and the
//! cluster's CA, the only one trusted either way.

use std::fmt;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A process's cluster certificate, its key and the cluster CA (PEM).
#[derive(Clone)]
pub struct ClusterTls {
    identity: Identity,
    ca: Certificate,
}

impl fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterTls").finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// From PEM bytes: the certificate chain, its private key and the CA bundle. Checks
    /// only that each holds a PEM block of the right kind (tonic parses them when the
    /// first connection is made; a bad key then fails every call with the reason).
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, String> {
        let has = |pem: &[u8], what: &str| {
            String::from_utf8_lossy(pem)
                .lines()
                .any(|l| l.starts_with("-----BEGIN ") && l.contains(what))
        };
        if !has(cert, "CERTIFICATE") {
            return Err("tls_cert holds no PEM certificate".into());
        }
        if !has(key, "PRIVATE KEY") {
            return Err("tls_key holds no PEM private key".into());
        }
        if !has(ca, "CERTIFICATE") {
            return Err("tls_ca holds no PEM certificate".into());
        }
        Ok(Self {
            identity: Identity::from_pem(cert, key),
            ca: Certificate::from_pem(ca),
        })
    }

    /// A worker's server: its certificate, and a client certificate signed by the
    /// cluster CA required of every connection.
    pub(crate) fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
    }

    /// A channel to a worker: the worker's certificate must chain to the cluster CA (no
    /// system roots) and name the URL's host; this process's certificate is presented.
    pub(crate) fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
    }
}
