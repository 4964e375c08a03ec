//! The daemon: Pingora's command line (`-c FILE`, `-t`, `-d`, `-u`), the
//! gateway section checked before anything starts, then the proxy and the
//! Prometheus services; or `route` (see `explain.rs`), which starts nothing.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use pingora::connectors::ConnectorOptions;
use pingora::prelude::*;
use pingora::proxy::ProxyServiceBuilder;
use pingora::server::RunArgs;
use pingora::services::background::background_service;
use poimen_gateway::auth::fetch::{self, Refresher};
use poimen_gateway::auth::jwt::Verifier;
use poimen_gateway::config::{GatewayConfig, JwtConfig};
use poimen_gateway::discovery;
use poimen_gateway::logging;
use poimen_gateway::proxy::Gateway;
use poimen_gateway::tls;

fn main() -> ExitCode {
    // `route` is ours; any other command line is Pingora's, which would
    // refuse the word.
    if std::env::args_os().nth(1).is_some_and(|a| a == "route") {
        return poimen_gateway::explain::run(std::env::args_os().skip(2));
    }
    logging::init();
    let code = run();
    // Log lines are written by a thread of their own: write out what is
    // still queued before the process ends.
    logging::flush();
    code
}

/// The JWT verifier, its keys loaded (a `jwks_url` fetched, on a runtime of
/// its own that ends before Pingora starts its runtimes or forks).
fn load_jwt(config: &JwtConfig) -> Result<(Verifier, Option<Refresher>), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(fetch::start(config))
}

fn run() -> ExitCode {
    let opt = Opt::parse_args();
    let Some(path) = opt.conf.clone() else {
        eprintln!("poimen-gateway: a configuration file is required: -c FILE");
        return ExitCode::from(2);
    };
    let config = match GatewayConfig::load(path.as_ref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("poimen-gateway: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    // The JWT keys, before anything starts: without them no token could be
    // verified. `-t` fetches them too, so a wrong URL shows before a reload.
    let jwt = match config.jwt.as_ref().map(load_jwt).transpose() {
        Ok(jwt) => jwt,
        Err(e) => {
            eprintln!("poimen-gateway: {path}: gateway.auth.jwt: {e}");
            return ExitCode::from(2);
        }
    };
    let test_only = opt.test;
    // Pingora reads its own keys from the same file.
    let mut server = match Server::new(Some(opt)) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("poimen-gateway: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let resolved = match discovery::resolve_checked(&config) {
        Ok(resolved) => resolved,
        Err(e) => {
            eprintln!("poimen-gateway: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    // Names allowed not to resolve: the daemon adds their backends later.
    for name in &resolved.unresolved {
        match test_only {
            true => eprintln!("poimen-gateway: {path}: {}", name.warning()),
            false => name.log_allowed(),
        }
    }
    if test_only {
        if let Some((verifier, _)) = &jwt {
            println!("poimen-gateway: {path}: JWKS: {} keys", verifier.keys());
        }
        println!("poimen-gateway: {path}: configuration OK");
        return ExitCode::SUCCESS;
    }
    server.bootstrap();

    let listen = config.listen.clone();
    let metrics_listen = config.metrics_listen;
    let upstream = tls::trusting(
        ConnectorOptions::from_server_conf(&server.configuration),
        config.upstream_ca_file.as_deref(),
    );
    let (verifier, refresher) = jwt.unzip();
    let (gateway, health_checks) = Gateway::new(config, verifier, resolved);
    let refresh = gateway.refresh_service();
    let mut proxy = ProxyServiceBuilder::new(&server.configuration, gateway)
        .client_options(upstream)
        .build();
    for l in listen {
        let addr = l.addr.to_string();
        match &l.tls {
            Some(t) => proxy.add_tls_with_settings(&addr, None, tls::listener_settings(t)),
            None => proxy.add_tcp(&addr),
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
    if server.configuration.daemon {
        logging::prepare_for_fork();
    }
    // Not `run_forever`, which ends the process with `exit(0)` once the
    // services have stopped (on SIGTERM, SIGINT, or SIGQUIT for an upgrade):
    // `run` returns then, so `main` can flush the log.
    server.run(RunArgs::default());
    ExitCode::SUCCESS
}
