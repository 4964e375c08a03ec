//! What the gateway needs from a request body: the top-level `"model"`.
//!
//! The body is parsed in full (the OpenAI SDKs put `"model"` after the
//! messages) but nothing else is kept: other values are skipped, not built.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not a JSON object: {0}")]
    NotJson(String),
    #[error("request body has no \"model\"")]
    NoModel,
    #[error("\"model\" must be one non-empty string")]
    BadModel,
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    model: Option<ModelField<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ModelField<'a> {
    Name(#[serde(borrow)] Cow<'a, str>),
    Other(IgnoredAny),
}

/// The top-level `"model"` of a JSON request body.
pub fn model_of(body: &[u8]) -> Result<Cow<'_, str>, BodyError> {
    let probe: Probe = serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        if msg.starts_with("duplicate field `model`") {
            BodyError::BadModel
        } else {
            BodyError::NotJson(msg)
        }
    })?;
    match probe.model {
        None => Err(BodyError::NoModel),
        Some(ModelField::Name(m)) if !m.is_empty() => Ok(m),
        Some(_) => Err(BodyError::BadModel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_model_after_large_messages() {
        let filler = "x".repeat(100_000);
        let body =
            format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"model":"m-1"}}"#);
        assert_eq!(model_of(body.as_bytes()).unwrap(), "m-1");
    }

    #[test]
    fn nested_model_keys_do_not_count() {
        let body = br#"{"messages":[{"model":"wrong"}],"tools":{"model":"no"},"model":"right"}"#;
        assert_eq!(model_of(body).unwrap(), "right");
        assert_eq!(
            model_of(br#"{"messages":[{"model":"wrong"}]}"#),
            Err(BodyError::NoModel)
        );
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        assert_eq!(model_of(br#"{"model":"a\/b\u0041"}"#).unwrap(), "a/bA");
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
                matches!(model_of(body), Err(BodyError::NotJson(_))),
                "{body:?}"
            );
        }
        assert_eq!(model_of(br#"{}"#), Err(BodyError::NoModel));
        assert_eq!(model_of(br#"{"model":null}"#), Err(BodyError::NoModel));
        for body in [
            &br#"{"model":42}"#[..],
            br#"{"model":""}"#,
            br#"{"model":["a"]}"#,
            br#"{"model":"a","model":"b"}"#,
        ] {
            assert_eq!(model_of(body), Err(BodyError::BadModel), "{body:?}");
        }
    }
}
