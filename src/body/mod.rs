//! What the gateway needs from a request body: the top-level `"model"`, and
//! whether it asks for a stream with or without usage.
//!
//! The body is parsed in full (the OpenAI SDKs put `"model"` after the
//! messages) but nothing else is kept: other values are skipped, not built.

mod multipart;

use std::borrow::Cow;
use std::ops::Range;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::{BodyFormat, Field};

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not a JSON object: {0}")]
    NotJson(String),
    #[error("request body has no \"model\"")]
    NoModel,
    #[error("\"model\" must be one non-empty string")]
    BadModel,
    #[error("request body is not a multipart/form-data body with a boundary")]
    NotMultipart,
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<IgnoredAnyOr<bool>>,
    #[serde(default)]
    stream_options: Option<IgnoredAny>,
    #[serde(borrow, default)]
    previous_response_id: Option<IgnoredAnyOr<Cow<'a, str>>>,
    #[serde(default)]
    max_tokens: Option<IgnoredAnyOr<u64>>,
    #[serde(default)]
    max_completion_tokens: Option<IgnoredAnyOr<u64>>,
    #[serde(default)]
    max_output_tokens: Option<IgnoredAnyOr<u64>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

/// The fields a prompt is made of, as sent (the prefix index's chain,
/// `routing::chain`): taken in the one parse that finds the model.
#[derive(Debug, Default, Clone, Copy)]
pub struct Prompt<'a> {
    pub tools: Option<&'a RawValue>,
    /// Messages API.
    pub system: Option<&'a RawValue>,
    /// Chat Completions and Messages.
    pub messages: Option<&'a RawValue>,
    /// Responses API.
    pub instructions: Option<&'a RawValue>,
    /// Responses API.
    pub input: Option<&'a RawValue>,
    /// Completions.
    pub prompt: Option<&'a RawValue>,
}

impl<'a> Probe<'a> {
    fn prompt(&self) -> Prompt<'a> {
        Prompt {
            tools: self.tools,
            system: self.system,
            messages: self.messages,
            instructions: self.instructions,
            input: self.input,
            prompt: self.prompt,
        }
    }
}

impl<'a> Prompt<'a> {
    /// The field `f`, as sent.
    pub fn field(&self, f: Field) -> Option<&'a RawValue> {
        match f {
            Field::Tools => self.tools,
            Field::System => self.system,
            Field::Messages => self.messages,
            Field::Instructions => self.instructions,
            Field::Input => self.input,
            Field::Prompt => self.prompt,
        }
    }
}

/// Equal when every field is the same text.
impl PartialEq for Prompt<'_> {
    fn eq(&self, other: &Self) -> bool {
        let text = |p: &Self| {
            [
                p.tools,
                p.system,
                p.messages,
                p.instructions,
                p.input,
                p.prompt,
            ]
            .map(|f| f.map(RawValue::get))
        };
        text(self) == text(other)
    }
}

/// The prompt fields of a JSON body (empty when it is not an object).
pub fn prompt_of(body: &[u8]) -> Prompt<'_> {
    serde_json::from_slice::<Probe>(body).map_or_else(|_| Prompt::default(), |p| p.prompt())
}

/// A value of type `T`, or anything else (which then counts as absent).
#[derive(Deserialize)]
#[serde(untagged)]
enum IgnoredAnyOr<T> {
    Value(T),
    Other(IgnoredAny),
}

/// The facts of a request body the gateway acts on.
#[derive(Debug, PartialEq)]
pub struct Inspected<'a> {
    pub model: Cow<'a, str>,
    /// Where the body holds it: a JSON string, or a form field's bytes.
    pub model_at: Range<usize>,
    /// `"stream": true`.
    pub stream: bool,
    /// A `stream_options` key is present (the client chose for itself).
    pub stream_options: bool,
    /// A string `previous_response_id` (Responses API).
    pub previous_response_id: Option<Cow<'a, str>>,
    pub prompt: Prompt<'a>,
    /// The fewest output tokens it allows: `max_tokens`,
    /// `max_completion_tokens` (chat) or `max_output_tokens` (Responses).
    pub max_output: Option<u64>,
}

/// The top-level `"model"` (and stream flags) of a JSON request body.
pub fn inspect(body: &[u8]) -> Result<Inspected<'_>, BodyError> {
    // serde would also read a struct from an array: require an object.
    if !body.trim_ascii_start().starts_with(b"{") {
        return Err(BodyError::NotJson("expected `{`".into()));
    }
    let probe: Probe = serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        if msg.starts_with("duplicate field `model`") {
            BodyError::BadModel
        } else {
            BodyError::NotJson(msg)
        }
    })?;
    let prompt = probe.prompt();
    let max_output = [
        &probe.max_tokens,
        &probe.max_completion_tokens,
        &probe.max_output_tokens,
    ]
    .into_iter()
    .filter_map(|m| match m {
        Some(IgnoredAnyOr::Value(n)) => Some(*n),
        _ => None,
    })
    .min();
    let raw = probe.model.ok_or(BodyError::NoModel)?;
    // Borrowed unless escaped.
    let model = match serde_json::from_str::<&str>(raw.get()) {
        Ok(m) => Cow::Borrowed(m),
        Err(_) => Cow::Owned(serde_json::from_str(raw.get()).map_err(|_| BodyError::BadModel)?),
    };
    if model.is_empty() {
        return Err(BodyError::BadModel);
    }
    Ok(Inspected {
        prompt,
        model,
        model_at: within(body, raw.get().as_bytes()),
        stream: matches!(probe.stream, Some(IgnoredAnyOr::Value(true))),
        stream_options: probe.stream_options.is_some(),
        previous_response_id: match probe.previous_response_id {
            Some(IgnoredAnyOr::Value(id)) => Some(id),
            _ => None,
        },
        max_output,
    })
}

/// The facts of a `multipart/form-data` body: its `model` field.
pub fn inspect_multipart<'a>(
    content_type: &[u8],
    body: &'a [u8],
) -> Result<Inspected<'a>, BodyError> {
    let model = multipart::model(content_type, body)?;
    Ok(Inspected {
        model_at: within(body, model.as_bytes()),
        model,
        stream: false,
        stream_options: false,
        previous_response_id: None,
        prompt: Prompt::default(),
        max_output: None,
    })
}

/// Where `part`, a slice of `body`, lies in it.
fn within(body: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - body.as_ptr() as usize;
    start..start + part.len()
}

/// The body with its model (`at`, from [`Inspected::model_at`]) renamed
/// `name`, every other byte as it was.
pub fn with_model(body: &[u8], at: Range<usize>, name: &str, format: BodyFormat) -> Vec<u8> {
    let name = match format {
        BodyFormat::Json => serde_json::to_string(name).unwrap_or_default(),
        BodyFormat::Multipart => name.to_owned(),
    };
    let mut out = Vec::with_capacity(body.len() - at.len() + name.len());
    out.extend_from_slice(&body[..at.start]);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&body[at.end..]);
    out
}

/// The body with `"stream_options":{"include_usage":true}` added as its
/// first key, so vLLM reports usage at the end of the stream. Only for a
/// body `inspect` accepted (a JSON object) without `stream_options`.
pub fn with_stream_usage(body: &[u8]) -> Vec<u8> {
    const OPTION: &[u8] = br#""stream_options":{"include_usage":true},"#;
    let open = body.iter().position(|b| *b == b'{').map_or(0, |i| i + 1);
    let mut out = Vec::with_capacity(body.len() + OPTION.len());
    out.extend_from_slice(&body[..open]);
    out.extend_from_slice(OPTION);
    out.extend_from_slice(&body[open..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_model_after_large_messages() {
        let filler = "x".repeat(100_000);
        let body =
            format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"model":"m-1"}}"#);
        assert_eq!(inspect(body.as_bytes()).unwrap().model, "m-1");
    }

    #[test]
    fn nested_model_keys_do_not_count() {
        let body = br#"{"messages":[{"model":"wrong"}],"tools":{"model":"no"},"model":"right"}"#;
        assert_eq!(inspect(body).unwrap().model, "right");
        assert_eq!(
            inspect(br#"{"messages":[{"model":"wrong"}]}"#),
            Err(BodyError::NoModel)
        );
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        assert_eq!(inspect(br#"{"model":"a\/b\u0041"}"#).unwrap().model, "a/bA");
    }

    #[test]
    fn the_model_is_renamed_and_nothing_else_changes() {
        let body = br#"{ "messages" : [{"model":"x"}],"model" :  "claude-\u0041" ,"n":1}"#;
        let i = inspect(body).unwrap();
        assert_eq!(i.model, "claude-A");
        let renamed = with_model(body, i.model_at, "qwen \"3\"", BodyFormat::Json);
        assert_eq!(
            std::str::from_utf8(&renamed).unwrap(),
            r#"{ "messages" : [{"model":"x"}],"model" :  "qwen \"3\"" ,"n":1}"#
        );
        assert_eq!(inspect(&renamed).unwrap().model, "qwen \"3\"");

        let form =
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--b--\r\n";
        let i = inspect_multipart(b"multipart/form-data; boundary=b", form).unwrap();
        let renamed = with_model(form, i.model_at, "local-asr", BodyFormat::Multipart);
        assert_eq!(
            renamed,
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nlocal-asr\r\n--b--\r\n"
        );
    }

    #[test]
    fn stream_flags() {
        let i = inspect(br#"{"model":"m","stream":true}"#).unwrap();
        assert!(i.stream && !i.stream_options);
        let i = inspect(br#"{"stream":true,"stream_options":{"include_usage":false},"model":"m"}"#)
            .unwrap();
        assert!(i.stream && i.stream_options);
        for body in [
            &br#"{"model":"m"}"#[..],
            br#"{"model":"m","stream":"yes"}"#,
            br#"{"model":"m","stream":false}"#,
        ] {
            assert!(!inspect(body).unwrap().stream);
        }
    }

    #[test]
    fn stream_usage_is_added_as_the_first_key() {
        let body = br#" {"messages":[],"stream":true,"model":"m"}"#;
        let out = with_stream_usage(body);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#" {"stream_options":{"include_usage":true},"messages":[],"stream":true,"model":"m"}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn rejects_bad_bodies() {
        for body in [
            &b""[..],
            b"not json",
            b"[1,2]",
            b"{\"model\":",
            b"\"model\"",
        ] {
            assert!(
                matches!(inspect(body), Err(BodyError::NotJson(_))),
                "{body:?}"
            );
        }
        assert_eq!(inspect(br#"{}"#), Err(BodyError::NoModel));
        assert_eq!(inspect(br#"{"model":null}"#), Err(BodyError::NoModel));
        for body in [
            &br#"{"model":42}"#[..],
            br#"{"model":""}"#,
            br#"{"model":["a"]}"#,
            br#"{"model":"a","model":"b"}"#,
        ] {
            assert_eq!(inspect(body), Err(BodyError::BadModel), "{body:?}");
        }
    }
}
