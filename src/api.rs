//! The APIs the gateway proxies, told apart by path: what each request is
//! decides how its affinity key is derived, whether it may be a warmup and
//! how its usage is read.

/// A proxied request's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses` (OpenAI Responses).
    Responses,
    /// `POST /v1/messages` (Anthropic Messages).
    Messages,
    /// Any other `POST /v1/*`: routed by its `model`, nothing more.
    Other,
}

impl Api {
    /// The API of a POST to `path`.
    pub fn of_path(path: &str) -> Self {
        match path {
            "/v1/chat/completions" => Api::ChatCompletions,
            "/v1/completions" => Api::Completions,
            "/v1/responses" => Api::Responses,
            "/v1/messages" => Api::Messages,
            _ => Api::Other,
        }
    }

    /// A completion: where warmups and prefix-cache accounting apply.
    pub fn is_completion(self) -> bool {
        matches!(self, Api::ChatCompletions | Api::Completions)
    }
}
