//! The services the daemon runs beside each other in one Pingora server:
//! the proxy on every listener, the Prometheus endpoint, and the background
//! work (health checks, JWKS refresh, DNS discovery).

use pingora::apps::HttpServerOptions;
use pingora::connectors::ConnectorOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::proxy::ProxyServiceBuilder;
use pingora::server::Server;
use pingora::services::background::background_service;

use std::time::Duration;

use crate::auth::fetch::Refresher;
use crate::auth::jwt::Verifier;
use crate::catalog::Check;
use crate::config::GatewayConfig;
use crate::discovery::AtStart;
use crate::proxy::{self, Gateway};
use crate::tls;
use crate::trace::Traces;

/// Add every service of `config` to `server` (bootstrapped): `jwt` its
/// verifier and refresher, `resolved` the backends found at start. Returns
/// the request tracer, if tracing is on, for the end of the process.
pub fn add(
    server: &mut Server,
    config: GatewayConfig,
    jwt: Option<(Verifier, Option<Refresher>)>,
    resolved: AtStart,
) -> Option<Traces> {
    let listen = config.listen.clone();
    let metrics_listen = config.metrics_listen;
    let upstream = tls::trusting(
        ConnectorOptions::from_server_conf(&server.configuration),
        config.upstream_ca_file.as_deref(),
    );
    let (verifier, refresher) = jwt.unzip();
    let (gateway, health_checks) = Gateway::new(config, verifier, resolved);
    let refresh = gateway.refresh_service();
    let learn = gateway.learn_service();
    let subscribe = gateway.subscribe_service();
    let traces = gateway.traces();
    let mut proxy = ProxyServiceBuilder::new(&server.configuration, gateway)
        .client_options(upstream)
        .build();
    // A reload closes no connection under a request the client is sending:
    // an idle one is answered `Connection: close` at its next request
    // (vendor/pingora-proxy), and an HTTP/2 one accepted just before the
    // listener stopped has its first request served before the GOAWAY
    // (vendor/pingora-core).
    if let Some(app) = proxy.app_logic_mut() {
        app.answer_idle_connections_at_shutdown = true;
        let mut options = HttpServerOptions::default();
        options.h2_first_stream_at_shutdown = true;
        app.server_options = Some(options);
    }
    for l in listen {
        let addr = l.addr.to_string();
        match &l.tls {
            Some(t) => proxy.add_tls_with_settings(&addr, None, tls::listener_settings(t)),
            // Plain HTTP reads straight into the request's own buffers:
            // Pingora's default 64 KiB read buffer per connection would
            // double what a request in flight holds (and copy its body once
            // more). TLS keeps it: rustls reads record by record.
            None => proxy.add_listener(
                ListenerConfig::tcp(addr).l4_buffer(L4BufferSettings::default().read(0)),
            ),
        }
    }
    let mut metrics = pingora_prometheus::prometheus_http_service();
    metrics.add_tcp(&metrics_listen.to_string());
    server.add_service(proxy);
    server.add_service(metrics);
    for (name, service) in health_checks {
        server.add_service(background_service(&name, service));
    }
    if let Some(refresher) = refresher.flatten() {
        server.add_service(background_service("jwks refresh", refresher));
    }
    if let Some(refresh) = refresh {
        server.add_service(background_service("discovery", refresh));
    }
    if let Some(learn) = learn {
        server.add_service(background_service("learned models", learn));
    }
    if let Some(subscribe) = subscribe {
        server.add_service(background_service("kv events", subscribe));
    }
    traces
}

/// The longest `-t` waits for a learned pool's backend to list its models.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// What `-t` finds asking the learned pools' backends for their models,
/// if any pool is learned.
pub fn check_learned(config: &GatewayConfig, resolved: AtStart) -> Result<Option<Check>, String> {
    let Some(learn) = proxy::learn_check(config, resolved, CHECK_TIMEOUT) else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Some(runtime.block_on(learn.check())))
}
