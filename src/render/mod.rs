//! A request's prompt as the token ids vLLM computes for it, from the
//! model's own files (`models[].kv_events.tokenizer`, the directory vLLM
//! serves): `tokenizer.json` (the Hugging Face `tokenizers` crate), the chat
//! template (`chat_template.jinja`, else `chat_template` in
//! `tokenizer_config.json`) and its special tokens.
//!
//! ```text
//! chat (/v1/chat/completions): the template rendered as transformers'
//!     apply_chat_template does (trim_blocks, lstrip_blocks, loop controls,
//!     Python's string methods) with
//!       messages: each {role, content[, name][, tool_call_id]}, a content
//!         of text parts joined with "\n" (vLLM's "string" content format)
//!       add_generation_prompt (default true), continue_final_message (default false)
//!       bos_token, eos_token, pad_token, unk_token, and chat_template_kwargs
//!     then tokenized without special tokens added
//! completions (/v1/completions): a string prompt tokenized with special
//!     tokens added; a prompt of token ids as it is
//! ```
//!
//! Anything else is not rendered ([`Unrendered`]), never guessed: the
//! other APIs, images and other non-text parts, tools and tool calls
//! (vLLM passes them to the template as its own models dump them), a
//! `cache_salt` (vLLM keys its blocks apart), a template that fails.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use serde::de::IgnoredAny;
use serde::Deserialize;
use tokenizers::Tokenizer;

use crate::api::Api;

/// Why a request's prompt was not rendered: its routing then estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrendered {
    /// An API this module does not render (Messages, Responses, ...).
    Api,
    /// A part other than text (an image, audio).
    NotText,
    /// Tools or tool calls.
    Tools,
    /// A `cache_salt`.
    Salted,
    /// The body is not what the API takes, or the template failed.
    Failed,
}

impl Unrendered {
    pub fn as_str(self) -> &'static str {
        match self {
            Unrendered::Api => "api",
            Unrendered::NotText => "not_text",
            Unrendered::Tools => "tools",
            Unrendered::Salted => "salted",
            Unrendered::Failed => "failed",
        }
    }
}

/// One model's tokenizer and chat template.
pub struct Renderer {
    dir: PathBuf,
    tokenizer: Tokenizer,
    template: Option<Environment<'static>>,
    /// The special tokens a template may name, by name.
    specials: BTreeMap<String, String>,
}

impl fmt::Debug for Renderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renderer").field("dir", &self.dir).finish()
    }
}

/// Two renderers of one directory render alike.
impl PartialEq for Renderer {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
    }
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    chat_template: Option<TemplateField>,
    bos_token: Option<TokenField>,
    eos_token: Option<TokenField>,
    pad_token: Option<TokenField>,
    unk_token: Option<TokenField>,
}

/// A template, or a list of named ones (the one named `default` is used).
#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// A special token: its text, or an added token `{content, ...}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenField {
    Text(String),
    Added { content: String },
}

impl Renderer {
    /// Load the files of model directory `dir`.
    pub fn load(dir: &Path) -> Result<Renderer, String> {
        let file = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let config_file = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = match std::fs::read(&config_file) {
            Ok(text) => serde_json::from_slice(&text)
                .map_err(|e| format!("{}: {e}", config_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenizerConfig::default(),
            Err(e) => return Err(format!("{}: {e}", config_file.display())),
        };
        let jinja = dir.join("chat_template.jinja");
        let source = match std::fs::read_to_string(&jinja) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match config.chat_template {
                Some(TemplateField::One(s)) => Some(s),
                Some(TemplateField::Named(list)) => list
                    .into_iter()
                    .find(|t| t.name == "default")
                    .map(|t| t.template),
                None => None,
            },
            Err(e) => return Err(format!("{}: {e}", jinja.display())),
        };
        let template = source
            .map(|s| environment(s).map_err(|e| format!("{}: chat template: {e}", dir.display())))
            .transpose()?;
        let specials = [
            ("bos_token", config.bos_token),
            ("eos_token", config.eos_token),
            ("pad_token", config.pad_token),
            ("unk_token", config.unk_token),
        ]
        .into_iter()
        .filter_map(|(name, t)| {
            let text = match t? {
                TokenField::Text(s) | TokenField::Added { content: s } => s,
            };
            Some((name.to_string(), text))
        })
        .collect();
        Ok(Renderer {
            dir: dir.to_path_buf(),
            tokenizer,
            template,
            specials,
        })
    }

    /// The token ids of the prompt of a request of `api` with `body`.
    pub fn tokens(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, Unrendered> {
        match api {
            Api::ChatCompletions => {
                let body: ChatBody =
                    serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
                let text = self.render_chat(body)?;
                self.encode(&text, false)
            }
            Api::Completions => {
                let body: CompletionBody =
                    serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
                if body.cache_salt.is_some() {
                    return Err(Unrendered::Salted);
                }
                match body.prompt {
                    PromptField::Text(text) => self.encode(&text, true),
                    PromptField::Ids(ids) => Ok(ids),
                    PromptField::Other(_) => Err(Unrendered::Failed),
                }
            }
            _ => Err(Unrendered::Api),
        }
    }

    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, Unrendered> {
        let encoding = self
            .tokenizer
            .encode_fast(text, special)
            .map_err(|_| Unrendered::Failed)?;
        Ok(encoding.get_ids().to_vec())
    }

    fn render_chat(&self, body: ChatBody) -> Result<String, Unrendered> {
        if body.cache_salt.is_some() {
            return Err(Unrendered::Salted);
        }
        if body.tools.is_some() {
            return Err(Unrendered::Tools);
        }
        let template = self.template.as_ref().ok_or(Unrendered::Failed)?;
        let messages = body
            .messages
            .into_iter()
            .map(Message::flattened)
            .collect::<Result<Vec<_>, _>>()?;
        let mut context: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.specials {
            context.insert(k.clone(), Value::from(v.as_str()));
        }
        for (k, v) in body.chat_template_kwargs.unwrap_or_default() {
            context.insert(k, Value::from(Serde(&v)));
        }
        context.insert("messages".into(), Value::from(Serde(&messages)));
        let generation = body.add_generation_prompt.unwrap_or(true);
        context.insert("add_generation_prompt".into(), Value::from(generation));
        let cont = body.continue_final_message.unwrap_or(false);
        context.insert("continue_final_message".into(), Value::from(cont));
        template
            .get_template("chat")
            .and_then(|t| t.render(Value::from(context)))
            .map_err(|_| Unrendered::Failed)
    }
}

/// An environment with `source` as template `chat`, configured as
/// transformers renders chat templates.
fn environment(source: String) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, _> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_template_owned("chat", source)?;
    Ok(env)
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    tools: Option<IgnoredAny>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    cache_salt: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<IgnoredAny>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// A message as the template sees it.
#[derive(serde::Serialize)]
struct Flat {
    role: String,
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
}

impl Message {
    fn flattened(self) -> Result<Flat, Unrendered> {
        if self.tool_calls.is_some() {
            return Err(Unrendered::Tools);
        }
        let content = match self.content {
            None => None,
            Some(Content::Text(t)) => Some(t),
            Some(Content::Parts(parts)) => {
                let texts = parts
                    .into_iter()
                    .map(|p| match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => Ok(t),
                        _ => Err(Unrendered::NotText),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some(texts.join("\n"))
            }
        };
        Ok(Flat {
            role: self.role,
            content,
            name: self.name,
            tool_call_id: self.tool_call_id,
        })
    }
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: PromptField,
    cache_salt: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Other(IgnoredAny),
}

#[cfg(test)]
mod tests;
