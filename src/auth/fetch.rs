//! Fetching the JWKS over HTTP(S) with Pingora's own client (its rustls),
//! and the background service that refreshes it.
//!
//! `https` is verified against the system's trust store, or `ca_file` when
//! set. Plain `http` is allowed only to a loopback host: on any other path
//! whoever sits on the network could hand the gateway their own keys and
//! mint tokens it accepts.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::RequestHeader;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::HttpPeer;

use super::jwks::{Fetch, Jwks, FETCH_TIMEOUT};
use super::jwks_url::JwksUrl;
use super::jwt::config::{JwksSource, JwtConfig};
use super::jwt::Verifier;

/// Largest JWKS accepted (a provider's holds a few keys, a few KiB).
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Fetches a JWKS URL, a new connection each time (a fetch every few
/// minutes gains nothing from a pool).
pub struct HttpFetcher {
    url: JwksUrl,
    /// Built once: loading the system's trust store takes a while (100 ms
    /// in a debug build), which a request waiting for a refetch would pay.
    connector: Connector,
}

impl HttpFetcher {
    /// `ca_file`, if any, must hold CA certificates (the configuration
    /// checks it: Pingora's connector panics on a bad one).
    pub fn new(url: JwksUrl, ca_file: Option<String>) -> Self {
        let mut options = ConnectorOptions::new(0);
        options.ca_file = ca_file;
        HttpFetcher {
            url,
            connector: Connector::new(Some(options)),
        }
    }

    async fn get(&self) -> pingora::Result<(u16, BytesMut)> {
        use pingora::{Error, ErrorType};
        let url = &self.url;
        let addr = tokio::net::lookup_host((url.host.as_str(), url.port))
            .await
            .map_err(|e| Error::because(ErrorType::ConnectNoRoute, "resolving the host", e))?
            .next()
            .ok_or_else(|| Error::explain(ErrorType::ConnectNoRoute, "the host has no address"))?;
        let mut peer = HttpPeer::new(addr, url.tls, url.host.clone());
        peer.options.connection_timeout = Some(FETCH_TIMEOUT);
        peer.options.read_timeout = Some(FETCH_TIMEOUT);
        let (mut session, _) = self.connector.get_http_session(&peer).await?;
        let mut req = RequestHeader::build("GET", url.path.as_bytes(), None)?;
        req.insert_header(http::header::HOST, &url.authority)?;
        req.insert_header(http::header::ACCEPT, "application/json")?;
        req.insert_header(http::header::CONNECTION, "close")?;
        session.write_request_header(Box::new(req)).await?;
        session.finish_request_body().await?;
        session.read_response_header().await?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        let mut body = BytesMut::new();
        while let Some(chunk) = session.read_response_body().await? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, "JWKS larger than 1 MiB");
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }
}

#[async_trait]
impl Fetch for HttpFetcher {
    async fn fetch(&self) -> Result<String, String> {
        let (status, body) = self.get().await.map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("HTTP status {status}"));
        }
        String::from_utf8(body.to_vec()).map_err(|_| "the JWKS is not UTF-8".into())
    }

    fn source(&self) -> &str {
        self.url.as_str()
    }
}

/// [`start`] before the daemon starts: on a runtime of its own that ends
/// before Pingora starts its runtimes or forks.
pub fn load(config: &JwtConfig) -> Result<(Verifier, Option<Refresher>), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(start(config))
}

/// The verifier of `config` with its keys loaded: a `jwks_url` is fetched
/// now (an error names the URL), and comes with the service that keeps it
/// current.
pub async fn start(config: &JwtConfig) -> Result<(Verifier, Option<Refresher>), String> {
    let (jwks, refresh) = match &config.jwks {
        JwksSource::File(keys) => (Jwks::fixed(keys.clone()), None),
        JwksSource::Url {
            url,
            ca_file,
            refresh,
        } => {
            let fetcher = HttpFetcher::new(url.clone(), ca_file.clone());
            (Jwks::fetched(Box::new(fetcher)).await?, Some(*refresh))
        }
    };
    let jwks = Arc::new(jwks);
    let refresher = refresh.map(|every| Refresher {
        jwks: jwks.clone(),
        every,
    });
    Ok((Verifier::new(config.policy.clone(), jwks), refresher))
}

/// Refetches the JWKS every `every`, as a Pingora background service.
pub struct Refresher {
    pub jwks: Arc<Jwks>,
    pub every: Duration,
}

#[async_trait]
impl BackgroundService for Refresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let first = tokio::time::Instant::now() + self.every;
        let mut tick = tokio::time::interval_at(first, self.every);
        // A refresh that ran long delays the next, rather than bunching up.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.jwks.refresh().await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}
