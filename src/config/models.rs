//! `models`: each model's name, its backends (`address` or `addresses`,
//! see `address`) and its own admission limits and balance factor.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::address::{self, AddressFile, BackendConfig, Target};
use super::entries::Entry;
use super::scheduler::{NUM_SEQS, QUEUE_DEPTH};
use crate::admission::{Capacity, Fleet};
use crate::field::Bound;
use crate::field::{invalid, Invalid};
use crate::kv_events::{Endpoints, Ports};
use crate::render::Renderer;
use crate::routing::chain::BLOCK_TOKENS;
use crate::routing::{Exact, IndexSize, Policy};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// The model's name. None: the models (and LoRA adapters) its backends
    /// list in `GET /v1/models` are learned.
    name: Option<String>,
    /// A single backend (the form older files use): `IP:port`, or
    /// `name:port` for every address the name resolves to.
    address: Option<String>,
    /// Several backends, each a string or `{address, weight, tls, sni}`.
    addresses: Option<Vec<Entry<AddressFile>>>,
    /// Overrides `scheduler.max_num_seqs` for this model's backends.
    max_num_seqs: Option<u64>,
    /// Overrides `scheduler.max_queue_depth` for this model's backends.
    max_queue_depth: Option<u64>,
    /// Other names clients may ask for this model by: exact, or globs
    /// with `*`.
    aliases: Option<Vec<String>>,
    /// A model without a name only: a directory of LoRA adapters (one
    /// subdirectory each); a request for one no backend has loaded loads
    /// it on the backend routing picks.
    load_adapters_from: Option<String>,
    /// The backends' KV-cache events, which keep the prefix index exact.
    kv_events: Option<KvEventsFile>,
}

/// `models[].kv_events`: where each backend publishes, and the model's
/// files to tokenize prompts with.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KvEventsFile {
    /// Each backend's PUB port, on the backend's host (vLLM's
    /// `--kv-events-config` endpoint `tcp://*:PORT`).
    port: u64,
    /// Each backend's replay port (`replay_endpoint`). Default: none (a
    /// gap in a backend's events forgets what it said).
    replay_port: Option<u64>,
    /// vLLM's `--block-size`, in tokens.
    block_size: u64,
    /// The model's directory: `tokenizer.json`, and the chat template
    /// (`chat_template.jinja` or `tokenizer_config.json`).
    tokenizer: String,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The model's name; for a learned pool its label, `models[i]`, which
    /// no request names.
    pub name: String,
    /// Its names are learned from its backends' `GET /v1/models`
    /// (`crate::catalog`).
    pub learned: bool,
    pub backends: Vec<BackendConfig>,
    /// Admission limits of each of this model's backends.
    pub limits: Capacity,
    /// How this model's requests are routed.
    pub policy: Policy,
    /// Other names that mean this model (`crate::aliases`).
    pub aliases: Vec<String>,
    /// Learned pools: where adapters are loaded from on demand.
    pub load_adapters_from: Option<PathBuf>,
    /// With `scheduler.load_feedback`: the backend's whole `max_num_seqs`
    /// (before the split between replicas, the most slots its load reports
    /// may lend this replica) and the replicas. None: off.
    pub load_feedback: Option<Fleet>,
}

impl ModelConfig {
    /// Whether any entry is a DNS name.
    pub fn uses_names(&self) -> bool {
        self.backends
            .iter()
            .any(|b| matches!(b.target, Target::Name { .. }))
    }
}

const MAX_BACKENDS_PER_MODEL: usize = 256;

/// At least one model, names unique; `limits` and `routing` apply where a
/// model sets none of its own.
pub fn validate(
    models: Vec<ModelFile>,
    limits: Capacity,
    replicas: usize,
    load_feedback: bool,
    routing: &Policy,
) -> Result<Vec<ModelConfig>, Invalid> {
    if models.is_empty() {
        return Err(invalid("gateway.models", "[]", "needs at least one model"));
    }
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, m) in models.into_iter().enumerate() {
        let path = format!("gateway.models[{i}]");
        let model = validate_model(&path, m, limits, replicas, load_feedback, routing)?;
        if !model.learned && !names.insert(model.name.clone()) {
            return Err(invalid(
                format!("{path}.name"),
                &model.name,
                "duplicate model name",
            ));
        }
        out.push(model);
    }
    check_aliases(&out)?;
    Ok(out)
}

/// The longest alias: a model name is no longer in practice.
const MAX_ALIAS_BYTES: usize = 256;

/// Each alias a name, none a model's own name or another model's alias.
fn check_aliases(models: &[ModelConfig]) -> Result<(), Invalid> {
    let mut seen = HashSet::new();
    for (i, m) in models.iter().enumerate() {
        for (j, alias) in m.aliases.iter().enumerate() {
            let path = format!("gateway.models[{i}].aliases[{j}]");
            if alias.is_empty()
                || alias.len() > MAX_ALIAS_BYTES
                || alias.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return Err(invalid(
                    path,
                    alias,
                    "must be a name (at most 256 bytes, no spaces or control characters)",
                ));
            }
            if models.iter().any(|other| &other.name == alias) {
                return Err(invalid(path, alias, "is the name of a model"));
            }
            if !seen.insert(alias.as_str()) {
                return Err(invalid(path, alias, "duplicate alias"));
            }
        }
    }
    Ok(())
}

/// A model's name, configured or learned: not blank, no control
/// characters (it is written into headers, log lines and metric labels).
pub fn is_model_name(name: &str) -> bool {
    !name.trim().is_empty() && !name.chars().any(char::is_control)
}

fn validate_model(
    path: &str,
    m: ModelFile,
    defaults: Capacity,
    replicas: usize,
    load_feedback: bool,
    routing: &Policy,
) -> Result<ModelConfig, Invalid> {
    let learned = m.name.is_none();
    let name = m
        .name
        .unwrap_or_else(|| path.trim_start_matches("gateway.").to_string());
    if !is_model_name(&name) {
        return Err(invalid(
            format!("{path}.name"),
            &name,
            "must be a non-empty name without control characters",
        ));
    }
    let load_adapters_from = match m.load_adapters_from {
        Some(dir) if !learned => {
            return Err(invalid(
                format!("{path}.load_adapters_from"),
                &dir,
                "only for a model without a name (whose adapters are learned)",
            ))
        }
        Some(dir) if !Path::new(&dir).is_dir() => {
            return Err(invalid(
                format!("{path}.load_adapters_from"),
                &dir,
                "not a directory",
            ))
        }
        dir => dir.map(PathBuf::from),
    };
    if learned && m.aliases.as_ref().is_some_and(|a| !a.is_empty()) {
        return Err(invalid(
            format!("{path}.aliases"),
            &name,
            "a model whose names are learned has no name to alias",
        ));
    }
    let entries: Vec<AddressFile> = match (m.address, m.addresses) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                path,
                &name,
                "set either `address` or `addresses`, not both",
            ))
        }
        (None, None) => return Err(invalid(path, &name, "needs `address` or `addresses`")),
        (Some(a), None) => vec![AddressFile::from(a)],
        (None, Some(list)) => list.into_iter().map(|e| e.0).collect(),
    };
    let list_path = format!("{path}.addresses");
    if entries.is_empty() {
        return Err(invalid(list_path, "[]", "needs at least one address"));
    }
    if entries.len() > MAX_BACKENDS_PER_MODEL {
        return Err(invalid(
            list_path,
            entries.len(),
            &format!("at most {MAX_BACKENDS_PER_MODEL} backends per model"),
        ));
    }
    let mut backends: Vec<BackendConfig> = Vec::new();
    let mut own_ports = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{list_path}[{i}]");
        let target = address::target(&at, &entry.address)?;
        if let Some(ports) = entry.kv_events() {
            let at = format!("{at}.kv_events");
            let Target::Addr(addr) = target else {
                return Err(invalid(at, &entry.address, "only for an IP:port entry"));
            };
            if m.kv_events.is_none() {
                return Err(invalid(at, &entry.address, "needs the model's `kv_events`"));
            }
            own_ports.push((addr, event_ports(&at, ports.port, ports.replay_port)?));
        }
        if backends.iter().any(|b| b.target == target) {
            return Err(invalid(
                at,
                &entry.address,
                "duplicate address in this model",
            ));
        }
        backends.push(address::backend(at, entry, target)?);
    }
    let configured = Capacity {
        max_num_seqs: match m.max_num_seqs {
            Some(n) => NUM_SEQS.check(&format!("{path}.max_num_seqs"), n)? as usize,
            None => defaults.max_num_seqs,
        },
        max_queue_depth: match m.max_queue_depth {
            Some(n) => QUEUE_DEPTH.check(&format!("{path}.max_queue_depth"), n)? as usize,
            None => defaults.max_queue_depth,
        },
    };
    // Divided here, once, after a model's own limits replaced the defaults,
    // so both are shared alike.
    let limits = configured.shared_by(replicas);
    let mut policy = routing.clone();
    if let Some(events) = m.kv_events {
        if learned {
            return Err(invalid(
                format!("{path}.kv_events"),
                &name,
                "only for a model with a name",
            ));
        }
        let at = format!("{path}.kv_events");
        let Some(size) = policy.prefix_index else {
            return Err(invalid(
                at,
                &name,
                "needs `routing.prefix_index` (the index the events keep)",
            ));
        };
        let exact = kv_events(&at, events, own_ports, size)?;
        ports_apart(&list_path, &backends, &exact.endpoints)?;
        policy.exact = Some(exact);
    }
    Ok(ModelConfig {
        name,
        learned,
        aliases: m.aliases.unwrap_or_default(),
        load_adapters_from,
        backends,
        limits,
        policy,
        load_feedback: load_feedback.then_some(Fleet {
            ceiling: configured.max_num_seqs,
            replicas,
        }),
    })
}

pub const BLOCK_SIZE: Bound<u64> = Bound::new(&["gateway.models[].kv_events.block_size"], 1, 4096);
pub const EVENT_PORT: Bound<u64> = Bound::new(
    &[
        "gateway.models[].kv_events.port",
        "gateway.models[].kv_events.replay_port",
        "gateway.models[].addresses[].kv_events.port",
        "gateway.models[].addresses[].kv_events.replay_port",
    ],
    1,
    65535,
);

/// The events of a model whose text index is `size`.
fn kv_events(
    at: &str,
    f: KvEventsFile,
    own: Vec<(SocketAddr, Ports)>,
    size: IndexSize,
) -> Result<Exact, Invalid> {
    let block_size = BLOCK_SIZE.check(&format!("{at}.block_size"), f.block_size)? as usize;
    let renderer = Renderer::load(Path::new(&f.tokenizer))
        .map_err(|e| invalid(format!("{at}.tokenizer"), &f.tokenizer, &e))?;
    // The index's blocks are the backends' own; the events say what each
    // holds, so only the index's own bound limits a backend.
    let blocks = (size.max_blocks as u64 * BLOCK_TOKENS).div_ceil(block_size as u64) as usize;
    Ok(Exact {
        index: IndexSize {
            backend_blocks: blocks,
            max_blocks: blocks,
        },
        endpoints: Endpoints {
            ports: event_ports(at, f.port, f.replay_port)?,
            own,
            block_size,
        },
        renderer: Arc::new(renderer),
    })
}

/// Each backend's event sockets are its own: two vLLM servers on one host
/// cannot bind one port, nor the port another serves HTTP on (backends
/// by name are not known before they resolve).
fn ports_apart(list_path: &str, backends: &[BackendConfig], e: &Endpoints) -> Result<(), Invalid> {
    let addrs: Vec<(usize, SocketAddr)> = backends
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match b.target {
            Target::Addr(a) => Some((i, a)),
            Target::Name { .. } => None,
        })
        .collect();
    let mut taken: Vec<(SocketAddr, SocketAddr)> = addrs.iter().map(|(_, a)| (*a, *a)).collect();
    for (i, a) in &addrs {
        let ports = e.of(a);
        for port in std::iter::once(ports.port).chain(ports.replay_port) {
            let socket = SocketAddr::new(a.ip(), port);
            if let Some((_, other)) = taken.iter().find(|(s, _)| *s == socket) {
                let why = format!(
                    "publishes KV-cache events on {socket}, a port {other} takes too: give each backend on one host its own `addresses[].kv_events`"
                );
                return Err(invalid(format!("{list_path}[{i}]"), a.to_string(), &why));
            }
            taken.push((socket, *a));
        }
    }
    Ok(())
}

/// A PUB port and a replay port, checked.
fn event_ports(at: &str, port: u64, replay: Option<u64>) -> Result<Ports, Invalid> {
    let check = |key: &str, p: u64| Ok(EVENT_PORT.check(&format!("{at}.{key}"), p)? as u16);
    Ok(Ports {
        port: check("port", port)?,
        replay_port: replay.map(|p| check("replay_port", p)).transpose()?,
    })
}
