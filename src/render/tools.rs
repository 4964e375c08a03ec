//! Tools and tool calls as vLLM 0.32 hands them to the template.
//!
//! ```text
//! tools: each a {type: "function", function: {name, description, parameters,
//!     strict, defer_loading}} (`ChatCompletionToolsParam.model_dump()`):
//!     description and parameters kept when null, strict and defer_loading
//!     only when set, other fields dropped; the parameters as the client
//!     wrote them, keys in its order
//!   Messages: name, description, input_schema (with "type": "object"
//!     added last when it has none), strict, defer_loading
//!   Responses: function tools, a namespace's function tools named
//!     `<namespace>__<name>`, a custom tool as a function of one string
//!     `input`; other tools (web search, ...) dropped
//! tool calls: {id, function: {arguments, name}, type}, the arguments
//!     decoded to an object (`_postprocess_messages`): a JSON string parsed,
//!     anything empty, not JSON or not an object as {}
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minijinja::value::ValueKind;
use minijinja::Value;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::python::Dumped;
use super::Unrendered;

/// The tool lists of recent requests as the template sees them, by their
/// JSON text (and a Messages request's tools added and removed by its
/// blocks): an agent sends the same list with every request, so it is
/// read, converted and written by `tojson` once, not per request.
pub(super) struct Lists {
    kept: Mutex<Kept>,
}

/// Lists kept at most, and their JSON's bytes at most (a coding agent's
/// list is 20 to 70 KB; converted, several times that): past either, the
/// least recently used go. A list not kept is converted again, by a
/// render thread; one larger than the bytes alone is never kept.
const KEPT: usize = 256;
const KEPT_BYTES: usize = 8 << 20;

impl Default for Lists {
    fn default() -> Self {
        Lists::bounded(KEPT, KEPT_BYTES)
    }
}

struct Kept {
    /// Each list, when it was last used (`clock`), and its JSON's bytes.
    lists: HashMap<u64, (Arc<[Value]>, u64, usize)>,
    clock: u64,
    bytes: usize,
    max_lists: usize,
    max_bytes: usize,
}

impl Kept {
    fn get(&mut self, key: u64) -> Option<Arc<[Value]>> {
        self.clock += 1;
        let (list, used, _) = self.lists.get_mut(&key)?;
        *used = self.clock;
        Some(list.clone())
    }

    fn keep(&mut self, key: u64, list: Arc<[Value]>, bytes: usize) {
        if bytes > self.max_bytes {
            return;
        }
        self.forget(key);
        while self.lists.len() >= self.max_lists || self.bytes + bytes > self.max_bytes {
            // A scan of the kept lists, once a new list is converted: rare
            // beside the lookups.
            let oldest = self.lists.iter().min_by_key(|(_, (_, used, _))| *used);
            let Some(oldest) = oldest.map(|(key, _)| *key) else {
                break;
            };
            self.forget(oldest);
        }
        self.clock += 1;
        self.bytes += bytes;
        self.lists.insert(key, (list, self.clock, bytes));
    }

    fn forget(&mut self, key: u64) {
        if let Some((_, _, had)) = self.lists.remove(&key) {
            self.bytes -= had;
        }
    }
}

/// Which API's form a list is in (the same JSON converts otherwise).
#[derive(Clone, Copy)]
pub(super) enum Form {
    Chat = 1,
    Messages = 2,
    Responses = 3,
}

/// Turns a request's tools, as read, into the tools the template sees.
pub(super) type Convert = fn(Vec<Value>) -> Result<Vec<Value>, Unrendered>;

/// A request's tool list: kept from an earlier request, or new and
/// converted where the prompt is rendered, so that a proxy's thread, which
/// renders only small prompts, never parses and dumps a new list of tens
/// of KB.
pub(super) enum Tools {
    Kept(Arc<[Value]>),
    New(Box<ToConvert>),
}

/// Converts a new list and keeps it in the lists.
pub(super) type ToConvert = dyn FnOnce(&Lists) -> Result<Arc<[Value]>, Unrendered> + Send;

impl Tools {
    pub fn is_new(&self) -> bool {
        matches!(self, Tools::New(_))
    }

    /// The list, converted and kept if new.
    pub fn converted(self, lists: &Lists) -> Result<Arc<[Value]>, Unrendered> {
        match self {
            Tools::Kept(list) => Ok(list),
            Tools::New(convert) => convert(lists),
        }
    }
}

impl Lists {
    /// At most `lists` lists and `bytes` of their JSON kept.
    fn bounded(lists: usize, bytes: usize) -> Self {
        Lists {
            kept: Mutex::new(Kept {
                lists: HashMap::new(),
                clock: 0,
                bytes: 0,
                max_lists: lists.max(1),
                max_bytes: bytes,
            }),
        }
    }

    /// The list `raw` of an API's `form`, converted by `convert`: kept, or
    /// new, to be kept once converted.
    pub fn get(&self, form: Form, raw: &RawValue, convert: Convert) -> Tools {
        self.find(key(form, raw), raw, convert)
    }

    /// The list `raw`, converted by `convert`, kept under `key`.
    pub fn find(
        &self,
        key: u64,
        raw: &RawValue,
        convert: impl FnOnce(Vec<Value>) -> Result<Vec<Value>, Unrendered> + Send + 'static,
    ) -> Tools {
        if let Some(list) = self.kept.lock().unwrap().get(key) {
            return Tools::Kept(list);
        }
        let raw = raw.to_owned();
        Tools::New(Box::new(move |lists: &Lists| {
            let list: Arc<[Value]> = wrapped(convert(parse(&raw)?)?);
            let bytes = raw.get().len();
            lists.kept.lock().unwrap().keep(key, list.clone(), bytes);
            Ok(list)
        }))
    }
}

/// What a list `raw` of an API's `form` is kept under.
pub(super) fn key(form: Form, raw: &RawValue) -> u64 {
    xxh3_64_with_seed(raw.get().as_bytes(), form as u64)
}

/// A list of tools read in the client's key order.
pub(super) fn parse(raw: &RawValue) -> Result<Vec<Value>, Unrendered> {
    serde_json::from_str(raw.get()).map_err(|_| Unrendered::Failed)
}

/// Tools that keep their `tojson`.
pub(super) fn wrapped(tools: Vec<Value>) -> Arc<[Value]> {
    tools.into_iter().map(Dumped::value).collect()
}

/// Whether `raw` is `[]`.
pub(super) fn is_empty_list(raw: &RawValue) -> bool {
    raw.get()
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .eq(*b"[]")
}

/// A Chat Completions tool as the template sees it.
pub(super) fn chat_tool(tool: &Value) -> Result<Value, Unrendered> {
    if !is_map(tool) || field(tool, "type").is_some_and(|t| t.as_str() != Some("function")) {
        return Err(Unrendered::Failed);
    }
    let function = field(tool, "function")
        .filter(is_map)
        .ok_or(Unrendered::Failed)?;
    let outer = field(tool, "defer_loading").filter(|v| !v.is_none());
    let defer = field(&function, "defer_loading").filter(|v| !v.is_none());
    let function = definition(
        field(&function, "name").ok_or(Unrendered::Failed)?,
        field(&function, "description"),
        field(&function, "parameters"),
        field(&function, "strict"),
        defer.or_else(|| outer.clone()),
    );
    let mut dict = vec![("type", Value::from("function")), ("function", function)];
    dict.extend(outer.map(|v| ("defer_loading", v)));
    Ok(map(dict))
}

/// An Anthropic Messages tool as the template sees it.
pub(super) fn messages_tool(tool: &Value) -> Result<Value, Unrendered> {
    let schema = field(tool, "input_schema")
        .filter(is_map)
        .ok_or(Unrendered::Failed)?;
    let schema = match field(&schema, "type") {
        Some(_) => schema,
        None => map(entries(&schema)?
            .into_iter()
            .chain([("type".to_string(), Value::from("object"))])),
    };
    let function = definition(
        field(tool, "name").ok_or(Unrendered::Failed)?,
        field(tool, "description"),
        Some(schema),
        field(tool, "strict"),
        field(tool, "defer_loading"),
    );
    Ok(map([
        ("type", Value::from("function")),
        ("function", function),
    ]))
}

/// The function tools a Responses tool stands for, as the template sees
/// them.
pub(super) fn responses_tools(tool: &Value) -> Result<Vec<Value>, Unrendered> {
    let flat = |named: &Value, name: Value| {
        map([
            ("type", Value::from("function")),
            (
                "function",
                definition(
                    name,
                    field(named, "description"),
                    field(named, "parameters"),
                    field(named, "strict"),
                    field(named, "defer_loading"),
                ),
            ),
        ])
    };
    let name = field(tool, "name").ok_or(Unrendered::Failed);
    Ok(match field(tool, "type").as_ref().and_then(Value::as_str) {
        Some("function") => vec![flat(tool, name?)],
        Some("namespace") => {
            let space = name?;
            let inner = field(tool, "tools").ok_or(Unrendered::Failed)?;
            let mut functions = Vec::new();
            for t in inner.try_iter().map_err(|_| Unrendered::Failed)? {
                if field(&t, "type").as_ref().and_then(Value::as_str) == Some("function") {
                    let own = field(&t, "name").ok_or(Unrendered::Failed)?;
                    functions.push(flat(&t, Value::from(namespaced(&space, &own)?)));
                }
            }
            functions
        }
        Some("custom") => vec![map([
            ("type", Value::from("function")),
            (
                "function",
                definition(
                    name?,
                    field(tool, "description"),
                    Some(custom_parameters()),
                    None,
                    None,
                ),
            ),
        ])],
        _ => Vec::new(),
    })
}

/// The name vLLM gives a namespace's function.
pub(super) fn namespaced(space: &Value, name: &Value) -> Result<String, Unrendered> {
    match (space.as_str(), name.as_str()) {
        (Some(space), Some(name)) => Ok(format!("{space}__{name}")),
        _ => Err(Unrendered::Failed),
    }
}

/// A custom tool's call arguments: its free-form input under `input`.
pub(super) fn custom_arguments(input: &str) -> Value {
    map([("input", Value::from(input))])
}

/// The one-string function a custom tool is shown as.
fn custom_parameters() -> Value {
    let input = map([
        ("type", Value::from("string")),
        (
            "description",
            Value::from("The freeform text payload for this tool."),
        ),
    ]);
    map([
        ("type", Value::from("object")),
        ("properties", map([("input", input)])),
        ("required", Value::from(vec![Value::from("input")])),
        ("additionalProperties", Value::from(false)),
    ])
}

/// `FunctionDefinition.model_dump()`.
fn definition(
    name: Value,
    description: Option<Value>,
    parameters: Option<Value>,
    strict: Option<Value>,
    defer_loading: Option<Value>,
) -> Value {
    let mut dict = vec![
        ("name", name),
        ("description", description.unwrap_or(Value::from(()))),
        ("parameters", parameters.unwrap_or(Value::from(()))),
    ];
    dict.extend(strict.filter(|v| !v.is_none()).map(|v| ("strict", v)));
    dict.extend(
        defer_loading
            .filter(|v| !v.is_none())
            .map(|v| ("defer_loading", v)),
    );
    map(dict)
}

/// A Chat Completions tool call as the template sees it: `{id, function:
/// {arguments, name, ...}, type, ...}` (the order pydantic validates the
/// client's dict to, its other keys after), the arguments decoded.
pub(super) fn chat_call(call: &Value) -> Result<Value, Unrendered> {
    if !is_map(call) || field(call, "type").is_some_and(|t| t.as_str() != Some("function")) {
        return Err(Unrendered::Failed);
    }
    let function = field(call, "function")
        .filter(is_map)
        .ok_or(Unrendered::Failed)?;
    let arguments = arguments(field(&function, "arguments"))?;
    let function = map(ordered(
        &function,
        &["arguments", "name"],
        |k, v| match k {
            "arguments" => arguments.clone(),
            _ => v,
        },
    )?);
    Ok(map(ordered(
        call,
        &["id", "function", "type"],
        |k, v| match k {
            "function" => function.clone(),
            _ => v,
        },
    )?))
}

/// A tool call the gateway builds from another API's: `{id, function:
/// {name, arguments}, type}` (Responses) or `{id, function: {arguments,
/// name}, type}` (Messages, validated as a chat request).
pub(super) fn call(id: Value, name: Value, arguments: Value, name_first: bool) -> Value {
    let function = match name_first {
        true => map([("name", name), ("arguments", arguments)]),
        false => map([("arguments", arguments), ("name", name)]),
    };
    map([
        ("id", id),
        ("function", function),
        ("type", Value::from("function")),
    ])
}

/// A call's `arguments` as vLLM gives them to the template: an object.
pub(super) fn arguments(given: Option<Value>) -> Result<Value, Unrendered> {
    let Some(given) = given.filter(Value::is_true) else {
        return Ok(empty());
    };
    let parsed = match given.as_str() {
        // An integer of 19 digits or more may not fit 64 bits: Python keeps
        // it whole, serde_json would make it a float.
        Some(text) if has_digits(text, 19) => return Err(Unrendered::Unsupported),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            // Python's json reads these; serde_json does not.
            Err(_) if text.contains("NaN") || text.contains("Infinity") => {
                return Err(Unrendered::Unsupported)
            }
            Err(_) => return Ok(empty()),
        },
        None => given,
    };
    Ok(if is_map(&parsed) { parsed } else { empty() })
}

/// Whether `text` has a run of `n` digits.
fn has_digits(text: &str, n: usize) -> bool {
    let mut run = 0;
    text.bytes().any(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= n
    })
}

/// Map `v` without its `key`.
pub(super) fn without(v: &Value, key: &str) -> Result<Value, Unrendered> {
    Ok(map(entries(v)?.into_iter().filter(|(k, _)| k != key)))
}

/// A map's field, if it is set (null counts as set, as in Python).
pub(super) fn field(v: &Value, key: &str) -> Option<Value> {
    v.get_attr(key).ok().filter(|v| !v.is_undefined())
}

fn empty() -> Value {
    map(std::iter::empty::<(String, Value)>())
}

fn is_map(v: &Value) -> bool {
    v.kind() == ValueKind::Map
}

fn entries(v: &Value) -> Result<Vec<(String, Value)>, Unrendered> {
    let keys = v.try_iter().map_err(|_| Unrendered::Failed)?;
    keys.map(|k| {
        let key = k.as_str().ok_or(Unrendered::Failed)?.to_string();
        let value = v.get_item(&k).map_err(|_| Unrendered::Failed)?;
        Ok((key, value))
    })
    .collect()
}

/// The entries of map `v`: `first` (those present) in that order, then the
/// others in `v`'s order; `each` may replace a value of `first`.
fn ordered(
    v: &Value,
    first: &[&str],
    each: impl Fn(&str, Value) -> Value,
) -> Result<Vec<(String, Value)>, Unrendered> {
    let all = entries(v)?;
    let mut out: Vec<(String, Value)> = first
        .iter()
        .filter_map(|k| {
            let (key, value) = all.iter().find(|(key, _)| key == k)?;
            Some((key.clone(), each(k, value.clone())))
        })
        .collect();
    out.extend(
        all.into_iter()
            .filter(|(k, _)| !first.contains(&k.as_str())),
    );
    Ok(out)
}

/// A dict of `entries`, in their order.
pub(super) fn map<K: Into<Value>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
    let entries = entries.into_iter().map(|(k, v)| (k.into(), v));
    Value::from_object(entries.collect::<indexmap::IndexMap<Value, Value>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat list of one tool named `name`.
    fn list_of(name: &str) -> Box<RawValue> {
        let list = format!(r#"[{{"type":"function","function":{{"name":"{name}"}}}}]"#);
        RawValue::from_string(list).unwrap()
    }

    const CHAT: Convert = |list| list.iter().map(chat_tool).collect();

    #[test]
    fn past_its_bound_the_least_recently_used_list_goes() {
        let lists = Lists::default();
        let get = |i: usize| lists.get(Form::Chat, &list_of(&format!("t{i}")), CHAT);
        for i in 0..KEPT {
            assert!(get(i).is_new());
            assert!(get(i).converted(&lists).is_ok());
            assert!(!get(i).is_new());
        }
        // The first used again: the second is now the least recent.
        assert!(!get(0).is_new());
        assert!(get(KEPT).converted(&lists).is_ok());
        assert!(!get(KEPT).is_new());
        assert!(!get(0).is_new());
        assert!(get(1).is_new());
        assert!(!get(2).is_new());
    }

    #[test]
    fn past_its_bytes_the_least_recently_used_lists_go() {
        // Lists of 1,000 bytes and more; at most 2,500 bytes kept.
        let lists = Lists::bounded(KEPT, 2_500);
        let get = |i: usize, len: usize| {
            let name = format!("t{i}{}", "x".repeat(len));
            lists.get(Form::Chat, &list_of(&name), CHAT)
        };
        for i in 0..2 {
            assert!(get(i, 1_000).converted(&lists).is_ok());
        }
        assert!(!get(0, 1_000).is_new());
        assert!(!get(1, 1_000).is_new());
        // A third: the least recently used goes for it.
        assert!(get(0, 1_000).converted(&lists).is_ok());
        assert!(get(2, 1_000).converted(&lists).is_ok());
        assert!(!get(2, 1_000).is_new());
        assert!(!get(0, 1_000).is_new());
        assert!(get(1, 1_000).is_new());
        // One larger than the bound alone is not kept, and evicts nothing.
        assert!(get(3, 3_000).converted(&lists).is_ok());
        assert!(get(3, 3_000).is_new());
        assert!(!get(0, 1_000).is_new());
        assert!(!get(2, 1_000).is_new());
    }

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    fn dumped(v: &Value) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn a_chat_tool_keeps_its_parameters_in_order_and_drops_the_rest() {
        let tool = json(
            r#"{"function": {"parameters": {"z": 1, "a": {"y": 1.0}}, "name": "f", "extra": 3}, "type": "function"}"#,
        );
        assert_eq!(
            dumped(&chat_tool(&tool).unwrap()),
            r#"{"type":"function","function":{"name":"f","description":null,"parameters":{"z":1,"a":{"y":1.0}}}}"#
        );
        let deferred = json(
            r#"{"type": "function", "function": {"name": "f", "strict": true}, "defer_loading": true}"#,
        );
        assert_eq!(
            dumped(&chat_tool(&deferred).unwrap()),
            r#"{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":true,"defer_loading":true},"defer_loading":true}"#
        );
    }

    #[test]
    fn a_messages_tool_gets_an_object_type_last() {
        let tool = json(
            r#"{"name": "Bash", "description": "run", "input_schema": {"properties": {}}, "cache_control": {"type": "ephemeral"}}"#,
        );
        assert_eq!(
            dumped(&messages_tool(&tool).unwrap()),
            r#"{"type":"function","function":{"name":"Bash","description":"run","parameters":{"properties":{},"type":"object"}}}"#
        );
    }

    #[test]
    fn responses_tools_flatten_namespaces_and_drop_what_is_not_a_function() {
        let ns = json(
            r#"{"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "read", "parameters": {}}, {"type": "web_search"}]}"#,
        );
        assert_eq!(
            dumped(&Value::from(responses_tools(&ns).unwrap())),
            r#"[{"type":"function","function":{"name":"fs__read","description":null,"parameters":{}}}]"#
        );
        assert!(responses_tools(&json(r#"{"type": "web_search"}"#))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn call_arguments_are_decoded_to_an_object() {
        let call = json(
            r#"{"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2.0]}"}, "id": "c1"}"#,
        );
        assert_eq!(
            dumped(&chat_call(&call).unwrap()),
            r#"{"id":"c1","function":{"arguments":{"b":1,"a":[2.0]},"name":"f"},"type":"function"}"#
        );
        for empty in [
            r#""""#,
            r#""{}""#,
            r#""[1]""#,
            r#""{not json""#,
            "null",
            "42",
        ] {
            assert_eq!(
                dumped(&arguments(Some(json(empty))).unwrap()),
                "{}",
                "{empty}"
            );
        }
        // What Python reads and serde_json cannot.
        for text in [
            r#""{\"x\": NaN}""#,
            r#""{\"n\": 123456789012345678901234567890}""#,
        ] {
            assert_eq!(arguments(Some(json(text))), Err(Unrendered::Unsupported));
        }
        assert_eq!(
            chat_call(&json(r#"{"type": "custom", "function": {}}"#)),
            Err(Unrendered::Failed)
        );
    }
}
