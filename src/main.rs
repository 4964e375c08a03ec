//! The daemon: Pingora's command line (`-c FILE`, `-t`, `-d`, `-u`), the
//! gateway section checked before anything starts, then the services
//! (`services.rs`) until the server stops; or `route` (see `explain.rs`),
//! which starts nothing.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use pingora::prelude::*;
use pingora::server::RunArgs;
use poimen_gateway::auth::fetch;
use poimen_gateway::config::GatewayConfig;
use poimen_gateway::{discovery, logging, services};

// See Cargo.toml for why this allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // No transparent huge pages: mimalloc asks for them, and on a host
    // whose memory has fragmented the kernel compacts and zeroes a 2 MiB
    // page inside the page fault, tens of ms in which the faulting thread
    // (a proxy thread: every connection it holds) stands still. Beside new
    // 64 KB prompts, small requests' p99 went from 28 to 6.4 ms without
    // them (bench/results/render-cost.md).
    let thp_off = nix::sys::prctl::set_thp_disable(true);
    // fastokens would spread a long prompt over threads of its own, one a
    // core, each spinning after its part: the render threads
    // (`render.threads`) are the gateway's tokenizing parallelism. Set
    // before any thread starts, as the environment must be.
    if std::env::var_os("FASTOKENS_BPE_THREADS").is_none() {
        std::env::set_var("FASTOKENS_BPE_THREADS", "1");
    }
    // `route` is ours; any other command line is Pingora's, which would
    // refuse the word.
    if std::env::args_os().nth(1).is_some_and(|a| a == "route") {
        return poimen_gateway::explain::run(std::env::args_os().skip(2));
    }
    logging::init();
    if let Err(e) = thp_off {
        log::warn!("transparent huge pages stay as the host sets them: {e}");
    }
    let code = match run(Opt::parse_args()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("poimen-gateway: {e}");
            ExitCode::from(2)
        }
    };
    // Log lines are written by a thread of their own: write out what is
    // still queued before the process ends.
    logging::flush();
    code
}

/// Why the daemon refused to start (exit status 2).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("a configuration file is required: -c FILE")]
    NoConfig,
    #[error("{0}: {1}")]
    Config(String, String),
}

/// Check the file, then serve until the server stops; with `-t`, only check.
fn run(opt: Opt) -> Result<(), StartError> {
    let path = opt.conf.clone().ok_or(StartError::NoConfig)?;
    let refused = |why: String| StartError::Config(path.clone(), why);
    let config = GatewayConfig::load(path.as_ref()).map_err(|e| refused(e.to_string()))?;
    // The JWT keys, before anything starts: without them no token could be
    // verified. `-t` fetches them too, so a wrong URL shows before a reload.
    let jwt = (config.jwt.as_ref().map(fetch::load).transpose())
        .map_err(|e| refused(format!("gateway.auth.jwt: {e}")))?;
    let test_only = opt.test;
    // Pingora reads its own keys from the same file.
    let mut server = Server::new(Some(opt)).map_err(|e| refused(e.to_string()))?;
    let resolved = discovery::resolve_checked(&config).map_err(refused)?;
    // Names allowed not to resolve: the daemon adds their backends later.
    for name in &resolved.unresolved {
        match test_only {
            true => eprintln!("poimen-gateway: {path}: {}", name.warning()),
            false => name.log_allowed(),
        }
    }
    if test_only {
        if let Some(check) = services::check_learned(&config, resolved).map_err(&refused)? {
            for backend in &check.silent {
                eprintln!("poimen-gateway: {path}: {backend} did not list its models: not checked");
            }
            if let Some(clash) = check.clashes.first() {
                return Err(refused(format!(
                    "{clash}, a name the configuration gives a model: \
                     remove one (the configured model would serve it)"
                )));
            }
        }
        if let Some((verifier, _)) = &jwt {
            println!("poimen-gateway: {path}: JWKS: {} keys", verifier.keys());
        }
        println!("poimen-gateway: {path}: configuration OK");
        return Ok(());
    }
    server.bootstrap();
    let traces = services::add(&mut server, config, jwt, resolved);
    // Not `run_forever`, which ends the process with `exit(0)` once the
    // services have stopped (on SIGTERM, SIGINT, or SIGQUIT for an upgrade):
    // `run` returns then, so the last spans are exported and `main` can
    // flush the log.
    server.run(RunArgs::default());
    if let Some(traces) = traces {
        traces.shutdown();
    }
    Ok(())
}
