//! Channels between coordinator and workers: one connection per worker (mutual TLS when
//! the cluster has certificates), a credential on every call, bounded messages.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion::error::Result as DfResult;
use datafusion_distributed::{
    BoxCloneSyncChannel, ChannelResolver, DefaultChannelResolver, WorkerServiceClient,
};
use tonic::codegen::{Service, http};

use crate::queries::{END_QUERY, QUERY_HEADER};
use crate::signer::TaskSigner;
use crate::tls::ClusterTls;

/// Largest gRPC message a worker decodes or sends, and a coordinator or worker decodes
/// from a worker: 64 MiB. Stage plans are small (a scan travels as its signed request, not
/// its files) and result batches are cut to half of this, so only a peer out to exhaust
/// memory sends more: tonic refuses it (`OUT_OF_RANGE`) from the message's 5-byte length
/// prefix, before reading it.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The channels of a coordinator to its workers and of a worker to the others (stages
/// reading other stages): datafusion-distributed's (one connection per worker, reused),
/// each call carrying a fresh credential for its RPC ([`TaskSigner::call_credential`]) and
/// its messages bounded by [`MAX_MESSAGE_BYTES`].
#[derive(Clone)]
pub(crate) struct ClusterChannels {
    pub(crate) signer: Arc<TaskSigner>,
    pub(crate) tls: Option<Arc<ClusterTls>>,
    channels: DefaultChannelResolver,
    /// With TLS: one lazily connected channel per worker URL.
    secured: Arc<parking_lot::Mutex<HashMap<url::Url, tonic::transport::Channel>>>,
}

impl fmt::Debug for ClusterChannels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterChannels").finish_non_exhaustive()
    }
}

impl ClusterChannels {
    pub(crate) fn new(signer: Arc<TaskSigner>, tls: Option<Arc<ClusterTls>>) -> Self {
        Self {
            signer,
            tls,
            channels: DefaultChannelResolver::default(),
            secured: Arc::default(),
        }
    }

    /// New channels with the same credentials (no connection shared with these).
    pub(crate) fn fresh(&self) -> Self {
        Self::new(Arc::clone(&self.signer), self.tls.clone())
    }

    /// The channel to `url`: over mutual TLS (`https://` only) when the cluster has
    /// certificates, else datafusion-distributed's plaintext one (`http://` only).
    async fn channel(&self, url: &url::Url) -> DfResult<BoxCloneSyncChannel> {
        let wrong = |want: &str| {
            datafusion::error::DataFusionError::Configuration(format!("worker '{url}': {want}"))
        };
        let Some(tls) = &self.tls else {
            if url.scheme() != "http" {
                return Err(wrong(
                    "an https:// worker needs [cluster] tls_cert, tls_key and tls_ca",
                ));
            }
            return self.channels.get_channel(url).await;
        };
        if url.scheme() != "https" {
            return Err(wrong(
                "the cluster uses TLS ([cluster] tls_cert): worker URLs must be https://",
            ));
        }
        let mut secured = self.secured.lock();
        if let Some(c) = secured.get(url) {
            return Ok(BoxCloneSyncChannel::new(c.clone()));
        }
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .and_then(|e| e.tls_config(tls.client()))
            .map_err(|e| wrong(&format!("{e}")))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect_lazy();
        secured.insert(url.clone(), channel.clone());
        Ok(BoxCloneSyncChannel::new(channel))
    }
}

impl ClusterChannels {
    /// Tells the worker at `url` that `query` ended ([`END_QUERY`]): it refuses that
    /// query's scans from then on. Why not, in one line.
    pub(crate) async fn end_query(&self, url: &url::Url, query: uuid::Uuid) -> Result<(), String> {
        let mut channel = Credentialed {
            inner: self.channel(url).await.map_err(|e| e.to_string())?,
            signer: Arc::clone(&self.signer),
        };
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("{}{END_QUERY}", url.as_str().trim_end_matches('/')))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(QUERY_HEADER, query.to_string())
            .body(tonic::body::Body::default())
            .map_err(|e| e.to_string())?;
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .map_err(|e| e.to_string())?;
        let response = channel.call(request).await.map_err(|e| e.to_string())?;
        match tonic::Status::from_header_map(response.headers()) {
            Some(s) if s.code() != tonic::Code::Ok => Err(s.message().to_owned()),
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl ChannelResolver for ClusterChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &url::Url,
    ) -> DfResult<WorkerServiceClient<BoxCloneSyncChannel>> {
        let channel = self.channel(url).await?;
        let channel = BoxCloneSyncChannel::new(Credentialed {
            inner: channel,
            signer: Arc::clone(&self.signer),
        });
        Ok(WorkerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

/// A channel that puts a credential for each call's RPC in its `authorization` header.
#[derive(Clone)]
struct Credentialed {
    inner: BoxCloneSyncChannel,
    signer: Arc<TaskSigner>,
}

impl Service<http::Request<tonic::body::Body>> for Credentialed {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = <BoxCloneSyncChannel as Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let credential = self.signer.call_credential(request.uri().path());
        // Always ASCII; a worker refuses a call without it.
        if let Ok(value) = http::HeaderValue::try_from(credential) {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
        }
        self.inner.call(request)
    }
}
