//! The daemon: Pingora's command line (`-c FILE`, `-t`, `-d`, `-u`), the
//! gateway section checked before anything starts, then the proxy and the
//! Prometheus services; or `route` (see `explain.rs`), which starts nothing.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use pingora::prelude::*;
use pingora::proxy::http_proxy_service;
use pingora::server::RunArgs;
use pingora::services::background::background_service;
use poimen_gateway::config::GatewayConfig;
use poimen_gateway::discovery;
use poimen_gateway::logging;
use poimen_gateway::proxy::Gateway;

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
        println!("poimen-gateway: {path}: configuration OK");
        return ExitCode::SUCCESS;
    }
    server.bootstrap();

    let listen = config.listen.clone();
    let metrics_listen = config.metrics_listen;
    let (gateway, health_checks) = Gateway::new(config, resolved);
    let refresh = gateway.refresh_service();
    let mut proxy = http_proxy_service(&server.configuration, gateway);
    for addr in listen {
        proxy.add_tcp(&addr.to_string());
    }
    let mut metrics = pingora_prometheus::prometheus_http_service();
    metrics.add_tcp(&metrics_listen.to_string());
    server.add_service(proxy);
    server.add_service(metrics);
    for (name, service) in health_checks {
        server.add_service(background_service(&name, service));
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
