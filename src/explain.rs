//! `poimen-gateway route`: the backends of a model in the order a request
//! would try them, printed without starting the daemon, so an operator can
//! answer "where does session K go, and where next if that GPU fails?".
//!
//! The order is [`RoutingTable::rank`]'s, the daemon's own, with no backend
//! excluded and no load. DNS names are resolved as the daemon resolves them
//! at start (`discovery::resolve_at_start`), and each backend is shown as
//! the rendezvous hash reads it: its resolved `IP:port`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use pingora::server::configuration::ServerConf;

use crate::api::Api;
use crate::config::{GatewayConfig, ModelConfig};
use crate::discovery::{self, Entries};
use crate::routing::{rendezvous, Affinity, Facts, Keyless, Request, RoutingTable};

const USAGE: &str =
    "usage: poimen-gateway route -c FILE --model M (--key K | --body FILE) [--path PATH]";

/// The endpoint a `--body` is taken to be sent to, unless `--path` says.
const DEFAULT_PATH: &str = "/v1/chat/completions";

/// What is routed.
#[derive(Debug, Clone, Copy)]
pub enum Query<'a> {
    /// A request with this `X-Poimen-Cache-Key`.
    Key(&'a str),
    /// A request without the header: this body, sent to `path`.
    Body { path: &'a str, body: &'a [u8] },
}

/// The backends of `model` (`entries`, as resolved) in the order a request
/// would try them, as lines of text: what orders them, what each DNS name
/// resolved to, then one line per backend.
pub fn explain(model: &ModelConfig, entries: &Entries, query: Query) -> Vec<String> {
    let policy = &model.policy;
    let derived = match query {
        Query::Body { path, body } => {
            policy.derived_key(Api::of_path(path), &crate::body::prompt_of(body))
        }
        Query::Key(_) => None,
    };
    let keyless = policy.keyless.as_str();
    let (affinity, why) = match (query, &derived) {
        (Query::Key(k), _) => (
            Affinity::Key(k.as_bytes()),
            format!("key {k:?} (X-Poimen-Cache-Key)"),
        ),
        (Query::Body { .. }, Some(d)) => (
            Affinity::Derived(d.as_bytes()),
            format!("no key; derived from the body's head (routing.keyless: {keyless}): {d}"),
        ),
        (Query::Body { .. }, None) if policy.keyless != Keyless::RoundRobin => (
            Affinity::None,
            "no key, and the body has no head to derive one from".to_string(),
        ),
        (Query::Body { .. }, None) => (
            Affinity::None,
            "no key, and routing.keyless is round_robin".to_string(),
        ),
    };
    let members = entries.members();
    let router = RoutingTable::new(policy, members.iter().copied());
    let mut lines = vec![format!("model {}, {why}", model.name)];
    for (name, addrs) in entries.resolved_names() {
        let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let addrs = match addrs.is_empty() {
            true => "nothing yet (does not resolve)".to_string(),
            false => addrs.join(", "),
        };
        lines.push(format!("{name} resolves to {addrs}"));
    }
    lines.extend(match affinity {
        Affinity::Key(key) | Affinity::Derived(key) => ranked(&members, &router, affinity, key),
        Affinity::None => round_robin(&members, &router),
    });
    if policy.prefix_index.is_some() {
        lines.push(
            "prefix_index: the order above is kept for a new conversation on idle backends; a request goes where its gateway's index says at least half of its prompt is cached (route cache), unless waiting there costs clearly more than a cold prefill elsewhere (route balance); a new conversation goes to the least busy".into(),
        );
        if let Query::Body { path, body } = query {
            let blocks = crate::routing::chain::of(Api::of_path(path), body).len() as u64;
            let tokens = blocks * crate::routing::chain::BLOCK_TOKENS;
            lines.push(format!(
                "the body's prompt: {blocks} blocks of the index, about {tokens} tokens"
            ));
        }
    }
    lines
}

/// The rendezvous order for `key` (which `affinity` carries), best first.
fn ranked(
    members: &[(SocketAddr, u32)],
    router: &RoutingTable,
    affinity: Affinity,
    key: &[u8],
) -> Vec<String> {
    let width = address_width(router);
    let mut lines = vec![format!(
        "rank  {:<width$}  weight  {:>10}",
        "backend", "score"
    )];
    let order = router
        .rank(Request::new(affinity, &[]), |_| Facts::default())
        .unwrap_or_default();
    for (i, c) in order.iter().enumerate() {
        let w = weight(members, &c.addr);
        let score = rendezvous::score(rendezvous::pair_hash(key, &c.addr.to_string()), w);
        let note = if i == 0 {
            "chosen"
        } else {
            "next if the ones above fail"
        };
        lines.push(format!(
            "{:>4}  {:<width$}  {w:>6}  {score:>10.4}  {note}",
            i + 1,
            c.addr
        ));
    }
    lines
}

/// No key: every backend takes turns.
fn round_robin(members: &[(SocketAddr, u32)], router: &RoutingTable) -> Vec<String> {
    let width = address_width(router);
    let mut lines = vec![
        "round-robin: each request takes the next backend in turn, as often as its weight".into(),
        format!("{:<width$}  weight", "backend"),
    ];
    lines.extend(
        router
            .addrs()
            .iter()
            .map(|a| format!("{a:<width$}  {:>6}", weight(members, a))),
    );
    lines
}

fn weight(members: &[(SocketAddr, u32)], addr: &SocketAddr) -> u32 {
    members
        .iter()
        .find(|(a, _)| a == addr)
        .map_or(0, |(_, w)| *w)
}

fn address_width(router: &RoutingTable) -> usize {
    router
        .addrs()
        .iter()
        .map(|a| a.to_string().len())
        .max()
        .unwrap_or(0)
}

/// The `route` command line, after the word `route`.
#[derive(Debug, PartialEq)]
pub struct Args {
    pub config: PathBuf,
    pub model: String,
    pub given: Given,
    /// The endpoint a body is sent to.
    pub path: String,
}

/// What the request to explain is given by: a key, or a body in a file.
#[derive(Debug, PartialEq)]
pub enum Given {
    Key(String),
    Body(PathBuf),
}

/// Parse `route`'s flags; `Ok(None)` when help was asked for.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Option<Args>, String> {
    let (mut config, mut model, mut key, mut body, mut path) = (None, None, None, None, None);
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let slot = match flag.to_str() {
            Some("-h" | "--help") => return Ok(None),
            Some("-c" | "--conf") => &mut config,
            Some("--model") => &mut model,
            Some("--key") => &mut key,
            Some("--body") => &mut body,
            Some("--path") => &mut path,
            _ => return Err(format!("unknown argument {flag:?}")),
        };
        let flag = flag.to_string_lossy();
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if slot.replace(value).is_some() {
            return Err(format!("{flag} given twice"));
        }
    }
    let text = |v: OsString, flag: &str| {
        v.into_string()
            .map_err(|v| format!("{flag} {v:?}: not UTF-8"))
    };
    let config = config.ok_or("a configuration file is required: -c FILE")?;
    let model = text(model.ok_or("--model is required")?, "--model")?;
    let given = match (key, body) {
        (Some(k), None) => match text(k, "--key")? {
            // The daemon takes an empty header for no header.
            k if k.is_empty() => return Err("--key is empty: an empty key is no key".into()),
            k => Given::Key(k),
        },
        (None, Some(b)) => Given::Body(b.into()),
        (None, None) => return Err("--key K or --body FILE is required".into()),
        (Some(_), Some(_)) => return Err("give --key or --body, not both".into()),
    };
    let path = match path {
        Some(p) => text(p, "--path")?,
        None => DEFAULT_PATH.into(),
    };
    Ok(Some(Args {
        config: config.into(),
        model,
        given,
        path,
    }))
}

/// Run `route` with the arguments after it: exit 0 with the order on
/// stdout, or 2 with the error on stderr, as `-t` does.
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match parse_args(args) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("poimen-gateway route: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match route(&args) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("poimen-gateway: {e}");
            ExitCode::from(2)
        }
    }
}

fn route(args: &Args) -> Result<Vec<String>, String> {
    let file = args.config.display().to_string();
    let config = GatewayConfig::load(&args.config).map_err(|e| format!("{file}: {e}"))?;
    // Pingora's keys too, so that `route` accepts exactly what `-t` does.
    ServerConf::load_from_yaml(&file).map_err(|e| format!("{file}: {e}"))?;
    // A model's name, or an alias of one, as the daemon resolves it.
    let aliases = crate::aliases::Aliases::new(&config.models);
    let asked = args.model.as_str();
    let served = aliases.resolve(asked).map_or(asked, |a| a.served);
    let Some(index) = config.models.iter().position(|m| m.name == served) else {
        let names: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
        return Err(format!(
            "{file}: model {:?} is not configured; models: {names:?}",
            args.model
        ));
    };
    let model = &config.models[index];
    // Every model's names, as the daemon (and -t) resolves them at start.
    let mut resolved = discovery::resolve_checked(&config).map_err(|e| format!("{file}: {e}"))?;
    for name in &resolved.unresolved {
        eprintln!("poimen-gateway: {file}: {}", name.warning());
    }
    let (_, entries) = resolved.models.swap_remove(index);
    let body;
    let query = match &args.given {
        Given::Key(key) => Query::Key(key),
        Given::Body(at) => {
            body = std::fs::read(at).map_err(|e| format!("{}: cannot read: {e}", at.display()))?;
            Query::Body {
                path: &args.path,
                body: &body,
            }
        }
    };
    Ok(explain(model, &entries, query))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = "/v1/chat/completions";

    /// Model `m` (four backends, one weighted) under `routing`.
    fn model(routing: &str) -> ModelConfig {
        let yaml = format!(
            "gateway:\n{routing}  models:\n    - name: m\n      addresses: [\"10.0.0.3:8000\", \"10.0.0.1:8000\", {{address: \"10.0.0.2:8000\", weight: 3}}, \"[::1]:8000\"]\n"
        );
        GatewayConfig::from_yaml(&yaml).unwrap().models.remove(0)
    }

    /// The literal addresses of `m`, as resolved.
    fn entries(m: &ModelConfig) -> Entries {
        Entries::new(&m.backends)
    }

    /// (address, weight) in the documented order for `key`: the rendezvous
    /// ranking over the addresses sorted.
    fn documented(m: &ModelConfig, key: &[u8]) -> Vec<(SocketAddr, u32)> {
        let mut members: Vec<(SocketAddr, u32)> = entries(m).members();
        members.sort();
        let hashed: Vec<(String, u32)> = members.iter().map(|(a, w)| (a.to_string(), *w)).collect();
        let order: Vec<_> = rendezvous::rank(key, &hashed)
            .into_iter()
            .map(|i| members[i])
            .collect();
        // Otherwise the test could not tell a ranking from a listing.
        assert_ne!(order, members, "pick a key whose order is not sorted");
        order
    }

    struct Row {
        addr: SocketAddr,
        weight: u32,
        score: String,
        note: String,
    }

    /// The ranked lines: rank, address, weight, score, note.
    fn rows(lines: &[String]) -> Vec<Row> {
        lines
            .iter()
            .filter_map(|l| {
                let mut t = l.split_whitespace();
                t.next()?.parse::<usize>().ok()?;
                Some(Row {
                    addr: t.next()?.parse().ok()?,
                    weight: t.next()?.parse().ok()?,
                    score: t.next()?.to_string(),
                    note: t.collect::<Vec<_>>().join(" "),
                })
            })
            .collect()
    }

    fn pairs(rows: &[Row]) -> Vec<(SocketAddr, u32)> {
        rows.iter().map(|r| (r.addr, r.weight)).collect()
    }

    #[test]
    fn a_key_is_ranked_as_the_daemon_ranks_it_with_weights_and_scores() {
        let m = model("");
        let lines = explain(&m, &entries(&m), Query::Key("session-42"));
        assert!(lines[0].contains("key \"session-42\""), "{lines:?}");
        let rows = rows(&lines);
        assert_eq!(pairs(&rows), documented(&m, b"session-42"));
        for r in &rows {
            let score = rendezvous::score(
                rendezvous::pair_hash(b"session-42", &r.addr.to_string()),
                r.weight,
            );
            assert_eq!(r.score, format!("{score:.4}"));
        }
        let notes: Vec<&str> = rows.iter().map(|r| r.note.as_str()).collect();
        assert_eq!(
            notes,
            [
                "chosen",
                "next if the ones above fail",
                "next if the ones above fail",
                "next if the ones above fail"
            ]
        );
    }

    #[test]
    fn the_cost_rule_is_explained_with_the_bodys_blocks() {
        let m = model("  routing: {prefix_index: {cache_tokens: 4096}}\n");
        let lines = explain(&m, &entries(&m), Query::Key("k"));
        assert!(lines.last().unwrap().starts_with("prefix_index: "));
        let text = "w".repeat(1000);
        let body = serde_json::json!({"messages": [{"role": "user", "content": text}]});
        let body = body.to_string();
        let query = Query::Body {
            path: DEFAULT_PATH,
            body: body.as_bytes(),
        };
        let lines = explain(&m, &entries(&m), query);
        let last = lines.last().unwrap();
        assert_eq!(
            last,
            "the body's prompt: 4 blocks of the index, about 256 tokens"
        );
    }

    #[test]
    fn a_chat_body_is_ranked_by_its_derived_key() {
        let m = model("  routing: {keyless: prefix}\n");
        let body = br#"{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}],"model":"m"}"#;
        let key = m
            .policy
            .derived_key(Api::of_path(CHAT), &crate::body::prompt_of(body))
            .unwrap();
        let lines = explain(&m, &entries(&m), Query::Body { path: CHAT, body });
        assert!(lines[0].ends_with(key.as_str()), "{lines:?}");
        assert_eq!(pairs(&rows(&lines)), documented(&m, key.as_bytes()));
    }

    #[test]
    fn no_derived_key_is_round_robin_over_every_backend() {
        let prefix = model("  routing: {keyless: prefix}\n");
        let chat = br#"{"messages":[{"role":"user","content":"hi"}],"model":"m"}"#;
        for (m, path, body, why) in [
            (&prefix, CHAT, &br#"{"model":"m"}"#[..], "no head"),
            (&prefix, "/v1/embeddings", &chat[..], "no head"),
            (
                &model(""),
                CHAT,
                &chat[..],
                "routing.keyless is round_robin",
            ),
        ] {
            let lines = explain(m, &entries(m), Query::Body { path, body });
            assert!(lines[0].contains(why), "{lines:?}");
            assert!(lines[1].starts_with("round-robin"), "{lines:?}");
            assert!(rows(&lines).is_empty(), "{lines:?}");
            let listed: Vec<(SocketAddr, u32)> = lines
                .iter()
                .filter_map(|l| {
                    let mut t = l.split_whitespace();
                    Some((t.next()?.parse().ok()?, t.next()?.parse().ok()?))
                })
                .collect();
            let mut members = entries(m).members();
            members.sort();
            assert_eq!(listed, members, "{lines:?}");
        }
    }

    fn parse(args: &[&str]) -> Result<Option<Args>, String> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse(&["-c", "g.yaml", "--model", "m", "--key", "k"]),
            Ok(Some(Args {
                config: "g.yaml".into(),
                model: "m".into(),
                given: Given::Key("k".into()),
                path: DEFAULT_PATH.into(),
            }))
        );
        let body = parse(&[
            "--body",
            "b.json",
            "--path",
            "/v1/completions",
            "--conf",
            "g",
            "--model",
            "m",
        ]);
        let body = body.unwrap().unwrap();
        assert_eq!(
            (body.given, body.path.as_str()),
            (Given::Body("b.json".into()), "/v1/completions")
        );
        assert_eq!(parse(&["--model", "m", "--help"]), Ok(None));
        let refused: [(&[&str], &str); 8] = [
            (&["--model", "m", "--key", "k"], "-c FILE"),
            (&["-c", "g", "--key", "k"], "--model is required"),
            (
                &["-c", "g", "--model", "m"],
                "--key K or --body FILE is required",
            ),
            (
                &["-c", "g", "--model", "m", "--key", "k", "--body", "b"],
                "not both",
            ),
            (&["-c", "g", "--model", "m", "--key", ""], "--key is empty"),
            (&["-c", "g", "--model", "m", "--key"], "--key needs a value"),
            (&["-c", "g", "-c", "h"], "-c given twice"),
            (&["-c", "g", "--modle", "m"], "unknown argument \"--modle\""),
        ];
        for (args, want) in refused {
            let got = parse(args).unwrap_err();
            assert!(got.contains(want), "{args:?}: got {got}, want {want}");
        }
    }
}
