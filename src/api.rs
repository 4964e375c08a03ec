//! The APIs the gateway proxies, told apart by path: vLLM 0.32's POST routes
//! that name a `model` (docs/vllm-apis.md lists them). What a request is
//! decides how its affinity key is derived, whether it may be a warmup,
//! whether it takes a sequence slot and how its usage is read. A path not
//! listed here is not proxied (404).

/// How a response reports usage (read by `accounting`), from the request's
/// API ([`Api::dialect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI `/v1/chat/completions` and `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

/// The longest response id the gateway keeps or asks about: vLLM's are
/// `resp_` and 16 hex digits; a longer one is not a vLLM id.
pub const MAX_RESPONSE_ID_BYTES: usize = 256;

/// Whether `id` may be a stored response's id: short, and only the
/// characters an id is made of (it goes into a request path when the
/// backends are asked).
pub fn valid_response_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RESPONSE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A proxied POST's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
    /// `/v1/responses`: OpenAI's Responses API, with stored responses.
    Responses,
    /// `/v1/messages`: Anthropic's Messages API.
    Messages,
    /// Other work of the engine (embeddings, pooling, scoring, batches,
    /// other generation routes): routed by model, takes a slot, forwarded
    /// as it is.
    Engine,
    /// Audio transcription and translation: as `Engine`, the model in a
    /// multipart form field.
    Audio,
    /// The tokenizer and the chat template (`/tokenize`, count_tokens,
    /// render): answered by vLLM's API server without the engine, so
    /// routed by model without a slot.
    Tokenizer,
    /// A retrieve or cancel of a stored response ([`stored_response`]):
    /// routed to the backend that stored it, without a slot.
    Stored,
}

/// How a request body names its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// A JSON object's top-level `"model"`.
    Json,
    /// A `multipart/form-data` field named `model`.
    Multipart,
}

impl Api {
    /// The API of a POST to `path`, if the gateway proxies it.
    pub fn of_post(path: &str) -> Option<Self> {
        Some(match path {
            "/v1/chat/completions" => Api::ChatCompletions,
            "/v1/completions" => Api::Completions,
            "/v1/responses" => Api::Responses,
            "/v1/messages" => Api::Messages,
            "/v1/chat/completions/batch"
            | "/v1/embeddings"
            | "/v2/embed"
            | "/pooling"
            | "/classify"
            | "/score"
            | "/v1/score"
            | "/rerank"
            | "/v1/rerank"
            | "/v2/rerank"
            | "/cohere/v2/chat"
            | "/generative_scoring"
            | "/v1/systemone"
            | "/inference/v1/generate" => Api::Engine,
            "/v1/audio/transcriptions" | "/v1/audio/translations" => Api::Audio,
            "/tokenize"
            | "/detokenize"
            | "/v1/messages/count_tokens"
            | "/v1/chat/completions/render"
            | "/v1/completions/render"
            | "/v1/messages/render"
            | "/v1/responses/render"
            | "/v1/chat/completions/derender"
            | "/v1/completions/derender" => Api::Tokenizer,
            _ => return None,
        })
    }

    /// The API of a POST to `path`, for a body given by hand (`route
    /// --path`): a path not proxied is plain engine work.
    pub fn of_path(path: &str) -> Self {
        Api::of_post(path).unwrap_or(Api::Engine)
    }

    /// A completion: where warmups apply and usage may be asked for.
    pub fn is_completion(self) -> bool {
        matches!(self, Api::ChatCompletions | Api::Completions)
    }

    /// How its responses report usage, when the gateway reads it.
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            Api::ChatCompletions | Api::Completions => Some(Dialect::Completions),
            Api::Responses => Some(Dialect::Responses),
            Api::Messages => Some(Dialect::Messages),
            _ => None,
        }
    }

    /// Whether it runs on the engine, and so waits for a sequence slot.
    pub fn takes_slot(self) -> bool {
        !matches!(self, Api::Tokenizer | Api::Stored)
    }

    /// The operation the OpenTelemetry GenAI conventions name it by, if
    /// they do; `path` tells embeddings from other engine work.
    pub fn gen_ai_operation(self, path: &str) -> Option<&'static str> {
        match self {
            Api::ChatCompletions | Api::Responses | Api::Messages => Some("chat"),
            Api::Completions => Some("text_completion"),
            Api::Engine if path == "/v1/embeddings" => Some("embeddings"),
            _ => None,
        }
    }

    pub fn body_format(self) -> BodyFormat {
        match self {
            Api::Audio => BodyFormat::Multipart,
            _ => BodyFormat::Json,
        }
    }
}

/// A request about one stored response: `GET /v1/responses/{id}` or
/// `POST /v1/responses/{id}/cancel` (vLLM 0.32 serves no DELETE and no
/// `input_items`). Routed to the backend that stored it, without a slot.
pub fn stored_response(method: &http::Method, path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = match (method, rest.strip_suffix("/cancel")) {
        (&http::Method::POST, Some(id)) => id,
        (&http::Method::GET, None) => rest,
        _ => return None,
    };
    valid_response_id(id).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn listed_paths_only() {
        assert_eq!(Api::of_post("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::of_post("/tokenize"), Some(Api::Tokenizer));
        assert_eq!(Api::of_post("/v1/audio/translations"), Some(Api::Audio));
        assert_eq!(Api::of_post("/v1/embeddings"), Some(Api::Engine));
        for unknown in [
            "/v1/unknown",
            "/v1/tokenize",
            "/invocations",
            "/v1/models",
            "/v1/",
        ] {
            assert_eq!(Api::of_post(unknown), None, "{unknown}");
        }
        assert!(!Api::Tokenizer.takes_slot() && Api::Messages.takes_slot());
        assert_eq!(Api::Messages.dialect(), Some(Dialect::Messages));
        assert_eq!(Api::Tokenizer.dialect(), None);
    }

    #[test]
    fn stored_response_paths() {
        let id = |m: Method, p: &str| stored_response(&m, p);
        assert_eq!(
            id(Method::GET, "/v1/responses/resp_1"),
            Some("resp_1".into())
        );
        assert_eq!(
            id(Method::POST, "/v1/responses/resp_1/cancel"),
            Some("resp_1".into())
        );
        assert_eq!(id(Method::DELETE, "/v1/responses/resp_1"), None);
        assert_eq!(id(Method::GET, "/v1/responses/resp_1/input_items"), None);
        assert_eq!(id(Method::POST, "/v1/responses/resp_1"), None);
        assert_eq!(id(Method::GET, "/v1/responses/"), None);
        assert_eq!(id(Method::GET, "/v1/responses/a%2Fb"), None);
    }
}
