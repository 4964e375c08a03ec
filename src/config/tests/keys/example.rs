//! Reading `conf/gateway.yaml` as a person does: every key, commented out
//! or not, with the comment that describes it, and what that comment
//! states as the key's default and range.

use std::collections::BTreeMap;

use serde_yaml::Value;

/// What follows the first `word` (`default`, `range`; any case, then a
/// space or `: `) in `comment`.
pub fn statement<'a>(comment: &'a str, word: &str) -> Option<&'a str> {
    let lower = comment.to_ascii_lowercase();
    lower.match_indices(word).find_map(|(i, _)| {
        let before = lower[..i].chars().next_back();
        let rest = &comment[i + word.len()..];
        let rest = rest.strip_prefix(": ").or_else(|| rest.strip_prefix(' '))?;
        (!before.is_some_and(|c| c.is_ascii_alphanumeric())).then(|| rest.trim_start())
    })
}

/// The YAML value at the start of `text`: a quoted string, a flow list or
/// map, or a word (without the punctuation after it).
pub fn yaml_token(text: &str) -> &str {
    let end = match text.chars().next() {
        Some('"') => text[1..].find('"').map_or(text.len(), |i| i + 2),
        Some('[') => text.find(']').map_or(text.len(), |i| i + 1),
        Some('{') => text.find('}').map_or(text.len(), |i| i + 1),
        _ => text.find([' ', ',', ';', ')']).unwrap_or(text.len()),
    };
    text[..end].trim_end_matches(['.', ':'])
}

/// Every key under `gateway:` in the example file, commented out or not,
/// with the comment that describes it: the comment lines right above it
/// and the comment after it on its line.
pub fn example_keys(text: &str) -> BTreeMap<String, String> {
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    // The open maps and list items: (column of their keys, path).
    let mut open: Vec<(usize, String)> = Vec::new();
    let mut prose = String::new();
    for line in text.lines() {
        let (code, commented) = uncomment(line);
        let (code, after) = split_comment(&code);
        let Some(parsed) = YamlLine::parse(code) else {
            if commented {
                prose = format!("{prose} {} {after}", code.trim());
            } else {
                prose.clear();
            }
            continue;
        };
        // The path of what holds a key at `column`, closing what it ends.
        let mut holder = |column: usize| {
            while open.last().is_some_and(|(c, _)| *c >= column) {
                open.pop();
            }
            open.last().map_or(String::new(), |(_, p)| format!("{p}."))
        };
        let (key, value) = match parsed {
            YamlLine::Key {
                column,
                name,
                value,
            } => (Some((column, format!("{}{name}", holder(column)))), value),
            YamlLine::Item { dash, name, value } => {
                let item = format!("{}[]", holder(dash).trim_end_matches('.'));
                open.push((dash, item.clone()));
                let key = name.map(|name| (dash + 2, format!("{item}.{name}")));
                if key.is_none() {
                    flow_keys(value, &item, &mut keys);
                }
                (key, value)
            }
        };
        if let Some((column, path)) = key {
            let described = keys.entry(path.clone()).or_default();
            *described = format!("{described} {prose} {after}");
            flow_keys(value, &path, &mut keys);
            open.push((column, path));
        }
        prose.clear();
    }
    keys.retain(|k, _| k.starts_with("gateway."));
    keys
}

/// The keys of a flow map or list value (`{address: x, tls: {cert_file:
/// y}}`) at `path`.
fn flow_keys(value: &str, path: &str, keys: &mut BTreeMap<String, String>) {
    if value.starts_with(['{', '[']) {
        let flow: Value = serde_yaml::from_str(value).expect(value);
        flow_walk(&flow, path, keys);
    }
}

fn flow_walk(value: &Value, path: &str, keys: &mut BTreeMap<String, String>) {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                let key = format!("{path}.{}", k.as_str().unwrap_or_default());
                keys.entry(key.clone()).or_default();
                flow_walk(v, &key, keys);
            }
        }
        Value::Sequence(items) => {
            for v in items {
                flow_walk(v, &format!("{path}[]"), keys);
            }
        }
        _ => {}
    }
}

/// `line` with its `# ` removed, as often as it was commented out (a
/// commented key keeps its column), and whether it was.
fn uncomment(line: &str) -> (String, bool) {
    let mut line = line.to_string();
    let mut commented = false;
    while let Some(hash) = line
        .find(|c: char| c != ' ')
        .filter(|&i| line[i..].starts_with('#'))
    {
        let rest = &line[hash + 1..];
        line = format!(
            "{}{}",
            &line[..hash],
            rest.strip_prefix(' ').unwrap_or(rest)
        );
        commented = true;
    }
    (line, commented)
}

/// The YAML before a ` #` comment (outside quotes), and the comment.
fn split_comment(line: &str) -> (&str, &str) {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted && (i == 0 || line[..i].ends_with(' ')) => {
                return (&line[..i], line[i + 1..].trim());
            }
            _ => {}
        }
    }
    (line, "")
}

/// A line of YAML block style that opens a key or a list item.
enum YamlLine<'a> {
    Key {
        column: usize,
        name: &'a str,
        value: &'a str,
    },
    /// `- value`, or `- name: value` (the first key of a map item).
    Item {
        dash: usize,
        name: Option<&'a str>,
        value: &'a str,
    },
}

impl<'a> YamlLine<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let column = line.len() - line.trim_start().len();
        let text = line.trim();
        if let Some(item) = text.strip_prefix("- ") {
            let (name, value) = match Self::key(item) {
                Some((name, value)) => (Some(name), value),
                None => (None, item),
            };
            let dash = column;
            return Some(YamlLine::Item { dash, name, value });
        }
        let (name, value) = Self::key(text)?;
        Some(YamlLine::Key {
            column,
            name,
            value,
        })
    }

    /// `name: value` with a lower-case key name.
    fn key(text: &'a str) -> Option<(&'a str, &'a str)> {
        let (name, value) = text.split_once(':')?;
        let word = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        (word && (value.is_empty() || value.starts_with(' '))).then(|| (name, value.trim()))
    }
}
