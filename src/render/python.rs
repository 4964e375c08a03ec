//! What transformers' Jinja environment prints unlike minijinja: its
//! `tojson` filter is Python's `json.dumps` (no HTML escaping, `", "` and
//! `": "` between items, keys in the order given, Python's float repr), and
//! a value printed bare is Python's `str` of it (`True`, `None`, `1e-05`).
//! A container printed bare (Python's repr of it) is refused: the render
//! then fails, and the request is estimated, never guessed.

use std::fmt::Write;
use std::sync::{Arc, OnceLock};

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State, Value};

/// Install the filter and the formatter in `env`.
pub(super) fn install(env: &mut Environment) {
    env.add_filter("tojson", tojson);
    env.set_formatter(format);
}

/// A dict that keeps its `tojson` once written: a tool, which an agent
/// sends again with every request (`tools.rs` keeps the lists).
#[derive(Debug)]
pub(super) struct Dumped {
    map: Value,
    json: OnceLock<Result<String, String>>,
}

impl Dumped {
    pub fn value(map: Value) -> Value {
        Value::from_object(Dumped {
            map,
            json: OnceLock::new(),
        })
    }
}

impl Object for Dumped {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.map.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.map.try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, as transformers defines it.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    if kwargs.args().next().is_none() {
        if let Some(d) = value.downcast_object_ref::<Dumped>() {
            let json = d.json.get_or_init(|| {
                let mut out = String::new();
                (Dump::default().value(&mut out, &d.map, 0)).map_err(|e| e.to_string())?;
                Ok(out)
            });
            return json
                .clone()
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e));
        }
    }
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        Some(v) => Some(v.as_str().ok_or_else(|| refused("indent"))?.to_string()),
    };
    let (item, key) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => (pair[0].clone(), pair[1].clone()),
        Some(_) => return Err(refused("separators")),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let dump = Dump {
        ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        indent,
        item,
        key,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump.value(&mut out, value, 0)?;
    Ok(out)
}

fn format(out: &mut Output, _: &mut State, value: &Value) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::Undefined => return Ok(()),
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number => number(value)?,
        ValueKind::String => {
            return out
                .write_str(value.as_str().unwrap_or_default())
                .map_err(io)
        }
        _ => return Err(refused("a container printed as Python's repr")),
    };
    out.write_str(&text).map_err(io)
}

struct Dump {
    ascii: bool,
    sort: bool,
    indent: Option<String>,
    item: String,
    key: String,
}

/// `json.dumps`'s defaults.
impl Default for Dump {
    fn default() -> Self {
        Dump {
            ascii: false,
            sort: false,
            indent: None,
            item: ", ".into(),
            key: ": ".into(),
        }
    }
}

impl Dump {
    fn value(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(value)?),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, ('[', ']'), items.len(), depth, |out, i| {
                    self.value(out, &items[i], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<(String, Value)> = value
                    .try_iter()?
                    .map(|k| Ok((key_text(&k)?, k)))
                    .collect::<Result<_, Error>>()?;
                if self.sort {
                    keys.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, ('{', '}'), keys.len(), depth, |out, i| {
                    self.string(out, &keys[i].0);
                    out.push_str(&self.key);
                    self.value(out, &value.get_item(&keys[i].1)?, depth + 1)
                })?;
            }
            _ => return Err(refused("a value JSON has no form for")),
        }
        Ok(())
    }

    /// `n` items between `open` and `close`, each written by `item`.
    fn container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        n: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..n {
            if i > 0 {
                out.push_str(&self.item);
            }
            self.newline(out, depth + 1);
            item(out, i)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers,
/// booleans and None as their JSON text.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => number(key),
        _ => Err(refused("a key JSON has no form for")),
    }
}

/// A number as Python writes it: integers in full, floats as `repr`.
fn number(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        return Ok(value.to_string());
    }
    Ok(float_repr(f64::try_from(value.clone())?))
}

/// Python's `repr` of a float: the shortest digits that read back the
/// same, in positional notation for exponents -4 to 15, else as `1e-05`,
/// `1.5e+16`.
pub(super) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` writes an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let (head, tail) = digits.split_at(1);
        let dot = if tail.is_empty() { "" } else { "." };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{head}{dot}{tail}e{exp_sign}{:02}", exp.abs());
    }
    let point = exp + 1;
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{text}")
}

fn refused(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("not rendered as Python would: {what}"),
    )
}

fn io(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "could not write the output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr_prints_them() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
            (-2.5e-7, "-2.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e100, "1e+100"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    fn render(source: &str, ctx: Value) -> Result<String, Error> {
        let mut env = Environment::new();
        install(&mut env);
        env.render_str(source, ctx)
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let tool: Value = serde_json::from_str(
            r#"{"z": 1, "a": {"y": 1.0, "b": null, "e": 1e-05}, "s": "<a & 'b'> é \u0001\n", "t": [true, []], "o": {}}"#,
        )
        .unwrap();
        let ctx = minijinja::context! { tool };
        assert_eq!(
            render("{{ tool | tojson }}", ctx.clone()).unwrap(),
            r#"{"z": 1, "a": {"y": 1.0, "b": null, "e": 1e-05}, "s": "<a & 'b'> é \u0001\n", "t": [true, []], "o": {}}"#
        );
        assert_eq!(
            render("{{ tool.a | tojson(indent=2) }}", ctx.clone()).unwrap(),
            "{\n  \"y\": 1.0,\n  \"b\": null,\n  \"e\": 1e-05\n}"
        );
        assert_eq!(
            render(
                "{{ tool.a | tojson(sort_keys=true, separators=[',', ':'], ensure_ascii=true) }}{{ 'é😀' | tojson(ensure_ascii=true) }}",
                ctx
            )
            .unwrap(),
            r#"{"b":null,"e":1e-05,"y":1.0}"\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn bare_values_print_as_python_str_and_containers_are_refused() {
        let ctx = minijinja::context! { t => true, n => (), f => 1e-5, i => 3 };
        assert_eq!(
            render("{{ t }} {{ n }} {{ f }} {{ i }} {{ missing }}.", ctx).unwrap(),
            "True None 1e-05 3 ."
        );
        assert!(render("{{ [1] }}", Value::UNDEFINED).is_err());
        assert!(render("{{ x | tojson }}", Value::UNDEFINED).is_err());
    }
}
