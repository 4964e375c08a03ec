//! The APIs the gateway proxies, told apart by path: vLLM 0.32's POST routes
//! that name a `model` (docs/vllm-apis.md lists them). Each API is described
//! here once, and the rest of the gateway reads the description: how its
//! prompt is read (affinity key, prefix index), whether it may be a warmup,
//! whether it takes a sequence slot, how its usage is read, the shape of its
//! errors, how its spans are named. A path not listed here is not proxied
//! (404). Adding an API: its description here, its usage dialect in
//! `accounting` when it reports usage its own way, a handler in `vllm-sim`,
//! tests.

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

/// A proxied POST's API. Each is described once ([`Api::describe`]); what
/// the rest of the gateway does with a request of it is read from there.
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
    /// `/v1/embeddings`: as `Engine`, named by the GenAI conventions.
    Embeddings,
    /// Other work of the engine (pooling, scoring, batches, other
    /// generation routes): routed by model, takes a slot, forwarded as it
    /// is.
    Engine,
    /// Audio transcription and translation: as `Engine`, the model in a
    /// multipart form field.
    Audio,
    /// The tokenizer and the chat template (`/tokenize`, render): answered
    /// by vLLM's API server without the engine, so routed by model without
    /// a slot.
    Tokenizer,
    /// As `Tokenizer`, on Anthropic's API (count_tokens, render).
    MessagesTokenizer,
    /// A retrieve or cancel of a stored response ([`stored_response`]):
    /// routed to the backend that stored it, without a slot.
    Stored,
}

/// Everything the gateway knows of an API.
#[derive(Debug)]
pub struct Description {
    /// The paths of its POSTs.
    pub paths: &'static [&'static str],
    /// Where its body names the model.
    pub body: BodyFormat,
    /// How its responses report usage, when the gateway reads it.
    pub dialect: Option<Dialect>,
    /// The shape of the errors its clients expect.
    pub errors: Shape,
    /// `gen_ai.provider.name` of its spans.
    pub provider: &'static str,
    /// The operation the OpenTelemetry GenAI conventions name it by, if
    /// they do.
    pub operation: Option<&'static str>,
    /// Whether it runs on the engine, and so waits for a sequence slot.
    pub takes_slot: bool,
    /// A completion: where warmups apply and a stream's usage may be asked
    /// for.
    pub completion: bool,
    /// Whether its `previous_response_id` continues a stored response.
    pub continues_stored: bool,
    /// How its prompt is read (the prefix index's chain, the derived key);
    /// none for an API without one.
    pub conversation: Option<Conversation>,
}

/// How a request's prompt is read from its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation {
    /// A list of messages, after a system prompt in a field of its own when
    /// the API has one; the tools come first.
    Messages {
        system: Option<Field>,
        messages: Field,
    },
    /// A text `prompt`.
    Text,
}

/// A top-level body field a prompt is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Tools,
    /// Messages' system prompt.
    System,
    /// Chat's and Messages' list of messages.
    Messages,
    /// Responses' system prompt.
    Instructions,
    /// Responses' input: a list of items, or a string (one user message).
    Input,
    /// Completions' prompt.
    Prompt,
}

/// How a request body names its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// A JSON object's top-level `"model"`.
    Json,
    /// A `multipart/form-data` field named `model`.
    Multipart,
}

/// Which API's error shape a client expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
}

/// The proxied APIs, the most frequent first (a path is looked up in this
/// order).
const PROXIED: [Api; 9] = [
    Api::ChatCompletions,
    Api::Messages,
    Api::Responses,
    Api::Completions,
    Api::Embeddings,
    Api::Engine,
    Api::Audio,
    Api::Tokenizer,
    Api::MessagesTokenizer,
];

/// Engine work forwarded as it is: slot, JSON, no usage read.
const ENGINE: Description = Description {
    paths: &[],
    body: BodyFormat::Json,
    dialect: None,
    errors: Shape::OpenAi,
    provider: "openai",
    operation: None,
    takes_slot: true,
    completion: false,
    continues_stored: false,
    conversation: None,
};

const CHAT_COMPLETIONS: Description = Description {
    paths: &["/v1/chat/completions"],
    dialect: Some(Dialect::Completions),
    operation: Some("chat"),
    completion: true,
    conversation: Some(Conversation::Messages {
        system: None,
        messages: Field::Messages,
    }),
    ..ENGINE
};

const COMPLETIONS: Description = Description {
    paths: &["/v1/completions"],
    dialect: Some(Dialect::Completions),
    operation: Some("text_completion"),
    completion: true,
    conversation: Some(Conversation::Text),
    ..ENGINE
};

const RESPONSES: Description = Description {
    paths: &["/v1/responses"],
    dialect: Some(Dialect::Responses),
    operation: Some("chat"),
    continues_stored: true,
    conversation: Some(Conversation::Messages {
        system: Some(Field::Instructions),
        messages: Field::Input,
    }),
    ..ENGINE
};

const MESSAGES: Description = Description {
    paths: &["/v1/messages"],
    dialect: Some(Dialect::Messages),
    errors: Shape::Anthropic,
    provider: "anthropic",
    operation: Some("chat"),
    conversation: Some(Conversation::Messages {
        system: Some(Field::System),
        messages: Field::Messages,
    }),
    ..ENGINE
};

const EMBEDDINGS: Description = Description {
    paths: &["/v1/embeddings"],
    operation: Some("embeddings"),
    ..ENGINE
};

const OTHER_ENGINE: Description = Description {
    paths: &[
        "/v1/chat/completions/batch",
        "/v2/embed",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/cohere/v2/chat",
        "/generative_scoring",
        "/v1/systemone",
        "/inference/v1/generate",
    ],
    ..ENGINE
};

const AUDIO: Description = Description {
    paths: &["/v1/audio/transcriptions", "/v1/audio/translations"],
    body: BodyFormat::Multipart,
    ..ENGINE
};

const TOKENIZER: Description = Description {
    paths: &[
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/responses/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
    ],
    takes_slot: false,
    ..ENGINE
};

const MESSAGES_TOKENIZER: Description = Description {
    paths: &["/v1/messages/count_tokens", "/v1/messages/render"],
    errors: Shape::Anthropic,
    provider: "anthropic",
    ..TOKENIZER
};

const STORED: Description = Description {
    paths: &[],
    takes_slot: false,
    ..ENGINE
};

impl Api {
    /// What the gateway knows of it.
    pub fn describe(self) -> &'static Description {
        match self {
            Api::ChatCompletions => &CHAT_COMPLETIONS,
            Api::Completions => &COMPLETIONS,
            Api::Responses => &RESPONSES,
            Api::Messages => &MESSAGES,
            Api::Embeddings => &EMBEDDINGS,
            Api::Engine => &OTHER_ENGINE,
            Api::Audio => &AUDIO,
            Api::Tokenizer => &TOKENIZER,
            Api::MessagesTokenizer => &MESSAGES_TOKENIZER,
            Api::Stored => &STORED,
        }
    }

    /// The API of a POST to `path`, if the gateway proxies it.
    pub fn of_post(path: &str) -> Option<Self> {
        PROXIED
            .into_iter()
            .find(|api| api.describe().paths.contains(&path))
    }

    /// The API of a POST to `path`, for a body given by hand (`route
    /// --path`): a path not proxied is plain engine work.
    pub fn of_path(path: &str) -> Self {
        Api::of_post(path).unwrap_or(Api::Engine)
    }
}

impl Shape {
    /// The shape of the errors of a request to `path`: its API's, or for a
    /// path no API has, the shape of the API whose path it extends
    /// (`/v1/messages/...` is answered as Anthropic's).
    pub fn of_path(path: &str) -> Self {
        let anthropic = PROXIED.into_iter().any(|api| {
            let d = api.describe();
            d.errors == Shape::Anthropic && d.paths.iter().any(|p| path.starts_with(p))
        });
        match anthropic {
            true => Shape::Anthropic,
            false => Shape::OpenAi,
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

/// The route template of a request (`http.route`): its path, but for a
/// stored response, whose id is not part of its route.
pub fn route<'a>(method: &http::Method, path: &'a str) -> &'a str {
    match stored_response(method, path) {
        Some(_) if path.ends_with("/cancel") => "/v1/responses/{id}/cancel",
        Some(_) => "/v1/responses/{id}",
        None => path,
    }
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
        assert_eq!(Api::of_post("/v1/embeddings"), Some(Api::Embeddings));
        assert_eq!(Api::of_post("/v2/embed"), Some(Api::Engine));
        for unknown in [
            "/v1/unknown",
            "/v1/tokenize",
            "/invocations",
            "/v1/models",
            "/v1/",
        ] {
            assert_eq!(Api::of_post(unknown), None, "{unknown}");
        }
        assert_eq!(
            Api::of_post("/v1/messages/count_tokens"),
            Some(Api::MessagesTokenizer)
        );
        assert!(!Api::Tokenizer.describe().takes_slot && Api::Messages.describe().takes_slot);
        assert_eq!(Api::Messages.describe().dialect, Some(Dialect::Messages));
        assert_eq!(Api::Tokenizer.describe().dialect, None);
    }

    #[test]
    fn no_path_is_two_apis() {
        let mut seen = std::collections::HashSet::new();
        for api in PROXIED {
            for path in api.describe().paths {
                assert!(seen.insert(path), "{path} twice");
            }
        }
    }

    #[test]
    fn the_messages_api_and_paths_under_it_are_answered_in_anthropics_shape() {
        for path in [
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/messages/../x",
        ] {
            assert_eq!(Shape::of_path(path), Shape::Anthropic, "{path}");
        }
        for path in ["/v1/chat/completions", "/tokenize", "/v1/unknown"] {
            assert_eq!(Shape::of_path(path), Shape::OpenAi, "{path}");
        }
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
