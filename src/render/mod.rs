//! A request's prompt as the token ids vLLM computes for it, from the
//! model's own files (`models[].kv_events.tokenizer`, the directory vLLM
//! serves): `tokenizer.json` (the Hugging Face `tokenizers` crate), the chat
//! template (`chat_template.jinja`, else `chat_template` in
//! `tokenizer_config.json`) and its special tokens.
//!
//! ```text
//! chat (/v1/chat/completions), and Messages and Responses as vLLM converts
//!     them to a chat (messages.rs, responses.rs): the template rendered as
//!     transformers' apply_chat_template does (trim_blocks, lstrip_blocks,
//!     loop controls, Python's string methods) with
//!       messages as vLLM parses them (chat.rs); developer messages as
//!         system ones, all merged into the first, if the template does
//!         not name the developer role
//!       add_generation_prompt, reasoning_effort (and enable_thinking with
//!         it), tools as vLLM dumps them (tools.rs), documents none,
//!       bos_token, eos_token, pad_token, unk_token, and chat_template_kwargs
//!       (the template named `tool_use`, if any, for a request with tools;
//!       `tojson` and printed values as Python writes them: python.rs)
//!     cut after the final message's text if continue_final_message, then
//!     tokenized without special tokens added
//! completions (/v1/completions): a string prompt tokenized with special
//!     tokens added; a prompt of token ids as it is
//! ```
//!
//! Anything else is not rendered ([`Unrendered`]), never guessed: the
//! other APIs, images and other non-text parts, what Python reads or prints
//! in a way not followed here (NaN, integers beyond 64 bits, a container's
//! repr), a `cache_salt` (vLLM keys its blocks apart), a stored response
//! continued, a template that fails.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::api::Api;
use chat::Conversation;
use encoder::Encoder;
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use serde::de::IgnoredAny;
use serde::Deserialize;

mod chat;
mod encoder;
mod messages;
mod pieces;
mod python;
mod responses;
mod tools;
mod workers;

pub use workers::Workers;

/// Why a request's prompt was not rendered: its routing then estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrendered {
    /// An API this module does not render (Messages, Responses, ...).
    Api,
    /// A part other than text (an image, audio).
    NotText,
    /// A `cache_salt`.
    Salted,
    /// A stored response or conversation continued.
    Stored,
    /// A field that changes the prompt in a way not rendered (documents, a
    /// template of the request's own, encrypted reasoning, a stored
    /// prompt).
    Unsupported,
    /// The body is not what the API takes, or the template failed.
    Failed,
    /// Every render thread and queue place was taken.
    Busy,
    /// The body is larger than `render.max_prompt_bytes`.
    TooLong,
}

impl Unrendered {
    pub fn as_str(self) -> &'static str {
        match self {
            Unrendered::Api => "api",
            Unrendered::NotText => "not_text",
            Unrendered::Salted => "salted",
            Unrendered::Stored => "stored",
            Unrendered::Unsupported => "unsupported",
            Unrendered::Failed => "failed",
            Unrendered::Busy => "busy",
            Unrendered::TooLong => "too_long",
        }
    }
}

/// A prompt rendered: the chain of its token ids (`routing::chain`), and
/// how many ids it has.
#[derive(Debug, PartialEq)]
pub struct Rendered {
    pub links: Vec<u64>,
    pub tokens: u64,
}

/// One model's tokenizer and chat template.
pub struct Renderer {
    dir: PathBuf,
    encoder: Encoder,
    template: Option<Template>,
    /// The template named `tool_use`, for requests with tools, if the
    /// model names one.
    tool_template: Option<Template>,
    /// The special tokens a template may name, by name.
    specials: BTreeMap<String, String>,
    /// What vLLM learns from the template for Messages requests.
    probed: messages::Probed,
    /// The ids of the text between special tokens, where the tokenizer
    /// allows keeping them.
    pieces: Option<pieces::Pieces>,
    /// Recent requests' tool lists, converted.
    lists: tools::Lists,
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

/// A request's prompt rendered, not yet all tokenized ([`Renderer::prepare`]).
pub struct Prepared(Stage);

enum Stage {
    /// A conversation not rendered yet (too many messages, or a tool list
    /// still to convert, to render where it was prepared).
    Conversation(Conversation),
    /// Given as token ids.
    Ids(Vec<u32>),
    /// Text tokenized whole, with the special tokens added if true.
    Whole(String, bool),
    /// Text cut at its added tokens, some pieces' ids known.
    Split(pieces::Split),
}

impl Prepared {
    /// Bytes of text still to tokenize; `None` if it is still to render.
    pub fn new_bytes(&self) -> Option<usize> {
        match &self.0 {
            Stage::Conversation(_) => None,
            Stage::Ids(_) => Some(0),
            Stage::Whole(text, _) => Some(text.len()),
            Stage::Split(split) => Some(split.new_bytes()),
        }
    }
}

impl Renderer {
    /// Load the files of model directory `dir`.
    pub fn load(dir: &Path) -> Result<Renderer, String> {
        let (encoder, apart) = Encoder::load(dir)?;
        let config_file = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = match std::fs::read(&config_file) {
            Ok(text) => serde_json::from_slice(&text)
                .map_err(|e| format!("{}: {e}", config_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenizerConfig::default(),
            Err(e) => return Err(format!("{}: {e}", config_file.display())),
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, tool_source) = match std::fs::read_to_string(&jinja) {
            Ok(s) => (Some(s), None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match config.chat_template {
                Some(TemplateField::One(s)) => (Some(s), None),
                Some(TemplateField::Named(mut list)) => {
                    let mut take = |name: &str| {
                        let at = list.iter().position(|t| t.name == name)?;
                        Some(list.swap_remove(at).template)
                    };
                    (take("default"), take("tool_use"))
                }
                None => (None, None),
            },
            Err(e) => return Err(format!("{}: {e}", jinja.display())),
        };
        let compile = |source: Option<String>| {
            source
                .map(|s| {
                    Template::new(s).map_err(|e| format!("{}: chat template: {e}", dir.display()))
                })
                .transpose()
        };
        let template = compile(source)?;
        let tool_template = compile(tool_source)?;
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
        let mut renderer = Renderer {
            dir: dir.to_path_buf(),
            pieces: apart.then(pieces::Pieces::new),
            lists: tools::Lists::default(),
            encoder,
            template,
            tool_template,
            specials,
            probed: messages::Probed {
                merge_inline_system: true,
                disabled_effort: "low",
            },
        };
        renderer.probed = renderer.probe();
        Ok(renderer)
    }

    /// The template's answers to vLLM's two probes of it: whether it takes
    /// a system message after the first (rendered bare, without the
    /// special tokens), and whether `reasoning_effort: none` renders a
    /// prompt of its own (else `thinking: disabled` stands for `low`).
    fn probe(&self) -> messages::Probed {
        let system_later = self.template.as_ref().is_some_and(|t| {
            let turns: Vec<_> = ["system", "user", "system", "user"]
                .iter()
                .map(|role| serde_json::json!({"role": role, "content": "t"}))
                .collect();
            let context = minijinja::context! {
                messages => Value::from(Serde(&turns)),
                add_generation_prompt => false,
            };
            t.render(context).is_ok()
        });
        let hi = |effort: &str| {
            self.render(Conversation {
                messages: vec![chat::Message::text("user", "Hi".into())],
                add_generation_prompt: true,
                reasoning_effort: Some(effort.into()),
                ..Conversation::default()
            })
        };
        let disabled_effort = match hi("none") {
            Ok(none) if EFFORTS.iter().all(|e| hi(e).as_ref() != Ok(&none)) => "none",
            _ => "low",
        };
        messages::Probed {
            merge_inline_system: !system_later,
            disabled_effort,
        }
    }

    /// The prompt of a request of `api` with `body` as the chain of its
    /// token ids, `block` of them a link.
    pub fn chain(&self, api: Api, body: &[u8], block: usize) -> Result<Rendered, Unrendered> {
        self.finish(self.prepare(api, body, usize::MAX)?, block)
    }

    /// The token ids of the prompt of a request of `api` with `body`.
    #[cfg(test)]
    pub fn tokens(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, Unrendered> {
        self.ids(self.prepare(api, body, usize::MAX)?)
    }

    /// The prompt of a request of `api` with `body`, rendered and cut at
    /// its added tokens, the pieces already tokenized looked up: all but
    /// tokenizing its new text ([`Prepared::new_bytes`]); only parsed if it
    /// has more than `max_messages` messages (the template's work grows
    /// with them, not only with the bytes) or a tool list not converted
    /// before (tens of KB to parse and dump).
    pub fn prepare(
        &self,
        api: Api,
        body: &[u8],
        max_messages: usize,
    ) -> Result<Prepared, Unrendered> {
        let conversation = match api {
            Api::ChatCompletions => chat::conversation(body, &self.lists)?,
            Api::Messages => messages::conversation(body, &self.probed, &self.lists)?,
            Api::Responses => responses::conversation(body, &self.lists)?,
            Api::Completions => return self.completion(body),
            _ => return Err(Unrendered::Api),
        };
        let new_tools = conversation
            .tools
            .as_ref()
            .is_some_and(tools::Tools::is_new);
        if conversation.messages.len() > max_messages || new_tools {
            return Ok(Prepared(Stage::Conversation(conversation)));
        }
        Ok(self.cut(self.render(conversation)?, false))
    }

    /// `prepared`'s chain, its new text tokenized.
    pub fn finish(&self, prepared: Prepared, block: usize) -> Result<Rendered, Unrendered> {
        let ids = self.ids(prepared)?;
        Ok(Rendered {
            links: crate::routing::chain::of_tokens(&ids, block),
            tokens: ids.len() as u64,
        })
    }

    fn completion(&self, body: &[u8]) -> Result<Prepared, Unrendered> {
        let body: CompletionBody = serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
        if body.cache_salt.is_some() {
            return Err(Unrendered::Salted);
        }
        match body.prompt {
            PromptField::Text(text) => Ok(self.cut(text, true)),
            PromptField::Ids(ids) => Ok(Prepared(Stage::Ids(ids))),
            PromptField::Other(_) => Err(Unrendered::Failed),
        }
    }

    /// `text` in pieces where its pieces are kept apart; with the special
    /// tokens added (a BOS) if `special`, whole.
    fn cut(&self, text: String, special: bool) -> Prepared {
        let split = (self.pieces.as_ref())
            .filter(|_| !special)
            .and_then(|pieces| pieces.split(&self.encoder, &text));
        Prepared(match split {
            Some(split) => Stage::Split(split),
            None => Stage::Whole(text, special),
        })
    }

    fn ids(&self, prepared: Prepared) -> Result<Vec<u32>, Unrendered> {
        let ids = match prepared.0 {
            Stage::Conversation(c) => return self.ids(self.cut(self.render(c)?, false)),
            Stage::Ids(ids) => Some(ids),
            Stage::Whole(text, special) => self.encoder.encode(&text, special),
            Stage::Split(split) => {
                (self.pieces.as_ref()).and_then(|p| p.finish(&self.encoder, split))
            }
        };
        ids.ok_or(Unrendered::Failed)
    }

    /// The prompt text of `conversation`, as vLLM's chat parameters
    /// override the request's `chat_template_kwargs` and transformers
    /// continues a final message.
    fn render(&self, conversation: Conversation) -> Result<String, Unrendered> {
        let template = match (&conversation.tools, &self.tool_template) {
            (Some(_), Some(t)) => t,
            _ => self.template.as_ref().ok_or(Unrendered::Failed)?,
        };
        let cont = conversation.continue_final_message;
        if (cont && conversation.add_generation_prompt) || conversation.messages.is_empty() {
            return Err(Unrendered::Failed);
        }
        let mut messages = conversation
            .messages
            .into_iter()
            .map(chat::Message::flattened)
            .collect::<Result<Vec<_>, _>>()?;
        if !template.developer && messages.iter().any(|m| m.role == "developer") {
            messages = chat::developer_as_system(messages);
        }
        let mut final_text = String::new();
        if cont {
            if !template.content {
                return Err(Unrendered::Failed);
            }
            if let Some(last) = messages.last_mut() {
                final_text = last.content.trim().to_string();
                last.content.push_str(CONTINUE_TAG);
            }
        }
        let mut context: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.specials {
            context.insert(k.clone(), Value::from(v.as_str()));
        }
        let tools = conversation
            .tools
            .map(|t| t.converted(&self.lists))
            .transpose()?;
        let tools = tools.map(|t| Value::from(t.to_vec()));
        context.insert("tools".into(), tools.unwrap_or(Value::from(())));
        context.insert("documents".into(), Value::from(()));
        let thinking_set = conversation.kwargs.contains_key("enable_thinking");
        for (k, v) in conversation.kwargs {
            context.insert(k, Value::from(Serde(&v)));
        }
        let messages: Vec<Value> = messages.into_iter().map(chat::Flat::value).collect();
        context.insert("messages".into(), Value::from(messages));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(conversation.add_generation_prompt),
        );
        if let Some(effort) = conversation.reasoning_effort {
            if !thinking_set {
                context.insert("enable_thinking".into(), Value::from(effort != "none"));
            }
            if effort != "auto" {
                context.insert("reasoning_effort".into(), Value::from(effort));
            }
        }
        let mut text = template
            .render(Value::from(context))
            .map_err(|_| Unrendered::Failed)?;
        if cont {
            let tag = CONTINUE_TAG.trim();
            let at = text.rfind(tag).ok_or(Unrendered::Failed)?;
            if !text.contains(&final_text) {
                return Err(Unrendered::Failed);
            }
            let spaced = text[at..].starts_with(CONTINUE_TAG);
            text.truncate(at);
            if !spaced {
                text.truncate(text.trim_end().len());
            }
        }
        Ok(text)
    }
}

/// What transformers appends to the message it continues, to cut the
/// prompt after it (`continue_final_message`).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The efforts vLLM's probe compares `none` with (`AnthropicEffort`).
const EFFORTS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

/// A chat template, configured as transformers renders chat templates.
struct Template {
    env: Environment<'static>,
    /// It names the developer role (else vLLM makes those messages system).
    developer: bool,
    /// It names `content` (else transformers refuses to continue a message).
    content: bool,
}

impl Template {
    fn new(source: String) -> Result<Template, minijinja::Error> {
        let developer = source.contains("\"developer\"") || source.contains("'developer'");
        let content = source.contains("content");
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        python::install(&mut env);
        env.add_function("raise_exception", |message: String| -> Result<Value, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source)?;
        Ok(Template {
            env,
            developer,
            content,
        })
    }

    fn render(&self, context: Value) -> Result<String, minijinja::Error> {
        self.env.get_template("chat")?.render(context)
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
