//! One source of truth for every key: the file format's serde structs. Their
//! keys (read through `schemars`, which follows serde's attributes), their
//! defaults (what leaving a key out parses to) and their ranges (the
//! `Bound`s, each naming its keys) are checked against the two places that
//! restate them: `conf/gateway.yaml`, which shows every key (an optional
//! one may be commented out, `# key: value`), and `docs/configuration.md`,
//! whose tables have a row `| `key` | default | range | meaning |` per key.
//!
//! Keys are written in full, list elements as `[]`:
//! `gateway.models[].addresses[].weight`. A default is `required`, `none`
//! (as if the key were left out) or a YAML value in backticks; the example
//! file states one as `Default X` (or `default X`, `Default: X`) in the
//! comment above the key or after it on its line, and a range as `range X`.
//! Each problem is reported with its key.

mod example;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value as Json;
use serde_yaml::{Mapping, Value};

use crate::config::*;
use example::{example_keys, statement, yaml_token};

const EXAMPLE: &str = include_str!("../../../../conf/gateway.yaml");
const DOCS: &str = include_str!("../../../../docs/configuration.md");

/// Numbers passed on as they are: no range to state.
const UNBOUNDED: [&str; 1] = ["gateway.warmup.vllm_priority"];

#[test]
fn the_docs_list_every_key_with_the_codes_default_and_range() {
    let (keys, ranges) = (code_keys(), ranges());
    let mut problems = Vec::new();
    let mut rows = BTreeSet::new();
    for (key, default, range) in docs_rows(DOCS) {
        let range = range.trim_matches('`');
        let range = (!matches!(range, "" | "-" | "—")).then_some(range);
        let mut found = check(&keys, &ranges, &key, Some(docs_default(&default)), range);
        if let (None, Some(code)) = (range, ranges.get(key.as_str())) {
            found.push(format!("range: none given, the code's is `{code}`"));
        }
        if !rows.insert(key.clone()) {
            found.push("a second row".into());
        }
        problems.extend(found.into_iter().map(|p| format!("{key}: {p}")));
    }
    for key in keys.keys().filter(|k| !rows.contains(*k)) {
        problems.push(format!("{key}: no row"));
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_example_file_shows_every_key_with_the_codes_default_and_range() {
    let (keys, ranges) = (code_keys(), ranges());
    let shown = example_keys(EXAMPLE);
    let mut problems = Vec::new();
    for (key, comment) in &shown {
        let default =
            statement(comment, "default").map(|d| yaml_value(yaml_token(d)).map(Stated::Value));
        let range = statement(comment, "range");
        for p in check(&keys, &ranges, key, default, range) {
            problems.push(format!("{key}: {p}"));
        }
    }
    for key in keys.keys().filter(|k| !shown.contains_key(*k)) {
        problems.push(format!(
            "{key}: missing (write it, or `# {key}: ...` commented out)"
        ));
    }
    assert!(
        problems.is_empty(),
        "conf/gateway.yaml:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_number_has_a_range_and_every_range_a_key() {
    let (keys, ranges) = (code_keys(), ranges());
    for (key, info) in &keys {
        let bounded = ranges.contains_key(key.as_str()) || UNBOUNDED.contains(&key.as_str());
        assert!(!info.number || bounded, "{key}: a number without a Bound");
    }
    for key in ranges.keys() {
        assert!(
            keys.contains_key(*key),
            "{key}: a Bound's key, not in the file format"
        );
    }
}

/// Every range, as the docs state it, by key.
fn ranges() -> BTreeMap<&'static str, String> {
    let integers = [
        EXCLUSION_SECS,
        BODY_BYTES,
        CONNECT_TIMEOUT_MS,
        READ_TIMEOUT_MS,
        scheduler::NUM_SEQS,
        scheduler::QUEUE_DEPTH,
        scheduler::REPLICAS,
        scheduler::QUEUE_TIMEOUT_MS,
        warmup::DELAY_MS,
        render::THREADS,
        render::QUEUE,
        render::MAX_PROMPT_BYTES,
        render::INLINE_BYTES,
        health_check::INTERVAL_MS,
        health_check::TIMEOUT_MS,
        health_check::CONSECUTIVE_OK,
        routing::KEYLESS_PREFIX_BYTES,
        routing::CACHE_TOKENS,
        routing::MAX_TOKENS,
        models::BLOCK_SIZE,
        models::EVENT_PORT,
        stored_responses::MAX_OWNERS,
        stored_responses::MAX_AGE_SECS,
        stored_responses::LOOKUP_TIMEOUT_MS,
        tenants::WEIGHT,
        tenants::MAX_IN_FLIGHT,
        tenants::REQUESTS_PER_MINUTE,
        tenants::TOKENS_PER_MINUTE,
        tenants::MAX_TRACKED,
        tenants::OUTPUT_TOKEN_COST,
        tracing::MAX_QUEUED_SPANS,
        tracing::EXPORT_TIMEOUT_MS,
        address::WEIGHT,
        crate::auth::jwt::config::LEEWAY_SECS,
        crate::auth::jwt::config::JWKS_REFRESH_SECS,
    ];
    let floats = [discovery::REFRESH_SECS, tracing::SAMPLE_RATIO];
    let integers = integers.iter().map(|b| (b.keys, b.to_string()));
    let floats = floats.iter().map(|b| (b.keys, b.to_string()));
    integers
        .chain(floats)
        .flat_map(|(keys, range)| keys.iter().map(move |k| (*k, range.clone())))
        .collect()
}

/// A key of the file format.
struct Key {
    required: bool,
    number: bool,
    /// A value of its type, to fill in where it is required.
    filler: Value,
}

/// Every key of the file format, from the serde structs.
fn code_keys() -> BTreeMap<String, Key> {
    let schema = schemars::schema_for!(GatewayFile);
    let mut keys = BTreeMap::new();
    walk(schema.as_value(), schema.as_value(), "gateway", &mut keys);
    keys
}

fn walk(root: &Json, schema: &Json, path: &str, keys: &mut BTreeMap<String, Key>) {
    let schema = resolve(root, schema);
    if let Some(properties) = schema["properties"].as_object() {
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        for (name, sub) in properties {
            let key = format!("{path}.{name}");
            let types = types(root, sub);
            let filler = match types.first().map(String::as_str) {
                Some("array") => Value::Sequence(vec![]),
                Some("integer" | "number") => Value::from(1),
                _ => Value::from("x"),
            };
            let info = Key {
                required: required.contains(&Json::from(name.as_str())),
                number: types.iter().any(|t| t == "integer" || t == "number"),
                filler,
            };
            keys.insert(key.clone(), info);
            walk(root, sub, &key, keys);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(root, items, &format!("{path}[]"), keys);
    }
    for branch in schema["anyOf"].as_array().into_iter().flatten() {
        walk(root, branch, path, keys);
    }
}

fn resolve<'a>(root: &'a Json, schema: &'a Json) -> &'a Json {
    match schema["$ref"].as_str() {
        Some(r) => root.pointer(r.trim_start_matches('#')).expect(r),
        None => schema,
    }
}

/// The JSON types a value may have, the first branch's first.
fn types(root: &Json, schema: &Json) -> Vec<String> {
    let schema = resolve(root, schema);
    match (&schema["type"], schema["anyOf"].as_array()) {
        (Json::String(t), _) => vec![t.clone()],
        (Json::Array(ts), _) => ts.iter().filter_map(|t| Some(t.as_str()?.into())).collect(),
        (_, Some(branches)) => branches.iter().flat_map(|b| types(root, b)).collect(),
        _ => vec![],
    }
}

/// A default as the docs state it.
enum Stated {
    Required,
    Value(Value),
}

/// The problems of what a documentation states of `key`: its default, its
/// range (which must begin what is stated).
fn check(
    keys: &BTreeMap<String, Key>,
    ranges: &BTreeMap<&str, String>,
    key: &str,
    default: Option<Result<Stated, String>>,
    range: Option<&str>,
) -> Vec<String> {
    let Some(info) = keys.get(key) else {
        return vec!["no such key in the file format".into()];
    };
    let mut problems = Vec::new();
    match default {
        None => {}
        Some(Err(e)) => problems.push(format!("default: {e}")),
        Some(Ok(Stated::Required)) if !info.required => {
            problems.push("default: `required`, but the code has a default".into());
        }
        Some(Ok(Stated::Required)) => {}
        Some(Ok(Stated::Value(_))) if info.required => {
            problems.push("default: the key is required, the code has none".into());
        }
        Some(Ok(Stated::Value(v))) => {
            if let Err(e) = same_as_left_out(keys, key, &v) {
                problems.push(format!("default: {e}"));
            }
        }
    }
    let stated_ok = |stated: &str, code: &str| {
        stated
            .strip_prefix(code)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', ',', ';', ' ', ')']))
    };
    match (range, ranges.get(key)) {
        (None, _) => {}
        (Some(stated), Some(code)) if stated_ok(stated, code) => {}
        (Some(stated), code) => {
            let stated: String = stated
                .split(". ")
                .next()
                .unwrap_or("")
                .chars()
                .take(24)
                .collect();
            let code = code.map_or("none".into(), |c| format!("`{c}`"));
            problems.push(format!(
                "range: states `{}`, the code's is {code}",
                stated.trim()
            ));
        }
    }
    problems
}

/// Whether setting `key` to `value` parses as leaving it out does.
fn same_as_left_out(keys: &BTreeMap<String, Key>, key: &str, value: &Value) -> Result<(), String> {
    let parse = |v: Option<&Value>| {
        let segments: Vec<&str> = key.split('.').collect();
        let section = fill(keys, segments[0], &segments[1..], v);
        serde_yaml::from_value::<GatewayFile>(section).map(|g| format!("{g:?}"))
    };
    let shown = serde_yaml::to_string(value).unwrap_or_default();
    let shown = shown.trim();
    let left_out = parse(None).map_err(|e| format!("left out, it does not parse: {e}"))?;
    let set = parse(Some(value)).map_err(|e| format!("`{shown}`: {e}"))?;
    if set == left_out {
        Ok(())
    } else {
        Err(format!("`{shown}` is not the code's default"))
    }
}

/// The map at `at` (`gateway`, `gateway.models[]`) with its required keys
/// filled in, and the rest of the key's path below it: its last part set to
/// `value`, or left out.
fn fill(keys: &BTreeMap<String, Key>, at: &str, rest: &[&str], value: Option<&Value>) -> Value {
    let mut map = Mapping::new();
    for (key, info) in keys.iter().filter(|(_, info)| info.required) {
        let child = key.strip_prefix(at).and_then(|c| c.strip_prefix('.'));
        if let Some(name) = child.filter(|c| !c.contains('.')) {
            map.insert(name.into(), info.filler.clone());
        }
    }
    let name = rest[0].trim_end_matches("[]");
    map.remove(name);
    let inner = match rest {
        [_] => value.cloned(),
        [list, ..] if list.ends_with("[]") => Some(Value::Sequence(vec![fill(
            keys,
            &format!("{at}.{list}"),
            &rest[1..],
            value,
        )])),
        [part, ..] => Some(fill(keys, &format!("{at}.{part}"), &rest[1..], value)),
        [] => unreachable!("a key has a last part"),
    };
    if let Some(inner) = inner {
        map.insert(name.into(), inner);
    }
    Value::Mapping(map)
}

/// A stated default: `none` or a YAML value.
fn yaml_value(text: &str) -> Result<Value, String> {
    if text == "none" {
        return Ok(Value::Null);
    }
    serde_yaml::from_str(text).map_err(|e| format!("`{text}` is no YAML value: {e}"))
}

/// The rows of the docs' tables: key, default cell, range cell.
fn docs_rows(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|line| {
            let row = line.trim().strip_prefix('|')?;
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let key = cells[0].strip_prefix('`')?.strip_suffix('`')?;
            let cell = |i: usize| cells.get(i).copied().unwrap_or("").to_string();
            key.starts_with("gateway")
                .then(|| (key.into(), cell(1), cell(2)))
        })
        .collect()
}

/// A docs default cell: `required` or `none` (then anything), or a value
/// in backticks (then anything).
fn docs_default(cell: &str) -> Result<Stated, String> {
    match cell.split_whitespace().next() {
        Some("required") => return Ok(Stated::Required),
        Some("none") => return Ok(Stated::Value(Value::Null)),
        _ => {}
    }
    let value = cell
        .strip_prefix('`')
        .and_then(|c| c.split_once('`'))
        .ok_or_else(|| format!("`{cell}`: write `value`, none or required"))?
        .0;
    yaml_value(value).map(Stated::Value)
}
