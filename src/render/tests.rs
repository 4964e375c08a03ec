use super::*;
use proptest::strategy::Strategy as _;
use tokenizers::Tokenizer;

/// The byte-level tokenizer and template of `bench/vllm-real`'s tiny
/// model (one token per byte, `role\ncontent\n` per message), the files
/// vLLM served when `tests/data/kv_events/tokenize.json` was recorded.
pub(super) fn byte_model() -> Renderer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/byte-model");
    Renderer::load(&dir).unwrap()
}

fn recorded() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/kv_events/tokenize.json"
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_chat_renders_to_the_ids_vllm_tokenized_it_to() {
    let t = recorded();
    let body = serde_json::to_vec(&t["chat_request"]["body"]).unwrap();
    let want: Vec<u32> = serde_json::from_value(t["tokenize_response"]["tokens"].clone()).unwrap();
    assert_eq!(byte_model().tokens(Api::ChatCompletions, &body), Ok(want));
}

#[test]
fn text_parts_join_with_newlines_and_completions_keep_ids() {
    let r = byte_model();
    let parts = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
    let ids = r.tokens(Api::ChatCompletions, parts).unwrap();
    assert_eq!(
        ids,
        b"user\na\nb\n"
            .iter()
            .map(|b| *b as u32)
            .collect::<Vec<_>>()
    );
    let text = br#"{"model":"m","prompt":"hi"}"#;
    assert_eq!(r.tokens(Api::Completions, text), Ok(vec![104, 105]));
    let ids = br#"{"model":"m","prompt":[7,8,9]}"#;
    assert_eq!(r.tokens(Api::Completions, ids), Ok(vec![7, 8, 9]));
}

#[test]
fn what_is_not_rendered_exactly_says_why() {
    let r = byte_model();
    let cases: [(&[u8], Unrendered); 5] = [
        (
            br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
            Unrendered::NotText,
        ),
        (
            br#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":NaN}"}}]}]}"#,
            Unrendered::Unsupported,
        ),
        (
            br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}]}"#,
            Unrendered::Failed,
        ),
        (
            br#"{"messages":[{"role":"user","content":"q"}],"cache_salt":"s"}"#,
            Unrendered::Salted,
        ),
        (br#"{"messages":"no"}"#, Unrendered::Failed),
    ];
    for (body, why) in cases {
        assert_eq!(r.tokens(Api::ChatCompletions, body), Err(why));
    }
    assert_eq!(r.tokens(Api::Embeddings, b"{}"), Err(Unrendered::Api));
}

#[test]
fn a_content_is_a_string_or_a_list_and_nothing_else() {
    let r = byte_model();
    let ids = |text: &str| text.bytes().map(u32::from).collect::<Vec<_>>();
    // A string with escapes, decoded.
    let escaped = br#"{"messages":[{"role":"user","content":"a\nb\u0009"}]}"#;
    assert_eq!(
        r.tokens(Api::ChatCompletions, escaped),
        Ok(ids("user\na\nb\t\n"))
    );
    let parts = br#"{"messages":[{"role":"user","content":["a",{"type":"text","text":"b"}]}]}"#;
    assert_eq!(
        r.tokens(Api::ChatCompletions, parts),
        Ok(ids("user\na\nb\n"))
    );
    let blocks = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}"#;
    assert_eq!(r.tokens(Api::Messages, blocks), Ok(ids("user\na\n")));
    let text = br#"{"messages":[{"role":"user","content":"a"}]}"#;
    assert_eq!(r.tokens(Api::Messages, text), Ok(ids("user\na\n")));
    let input = br#"{"input":"a"}"#;
    assert_eq!(r.tokens(Api::Responses, input), Ok(ids("user\na\n")));
    for (api, body) in [
        (
            Api::ChatCompletions,
            &br#"{"messages":[{"role":"user","content":5}]}"#[..],
        ),
        (
            Api::ChatCompletions,
            br#"{"messages":[{"role":"user","content":{"text":"a"}}]}"#,
        ),
        (
            Api::Messages,
            br#"{"messages":[{"role":"user","content":true}]}"#,
        ),
        (Api::Responses, br#"{"input":{"role":"user"}}"#),
    ] {
        assert_eq!(r.tokens(api, body), Err(Unrendered::Failed));
    }
}

#[test]
fn a_template_renders_as_transformers_does() {
    // trim_blocks and lstrip_blocks, Python's string methods, the special
    // tokens, the generation prompt and raise_exception.
    let source = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}\n[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}\n{% if add_generation_prompt %}[ASSISTANT]{% endif %}";
    let r = Renderer {
        dir: PathBuf::new(),
        encoder: byte_model().encoder,
        template: Some(Template::new(source.into()).unwrap()),
        tool_template: None,
        lists: tools::Lists::default(),
        specials: [("bos_token".to_string(), "<s>".to_string())].into(),
        probed: messages::Probed {
            merge_inline_system: true,
            disabled_effort: "low",
        },
        pieces: None,
    };
    let body = br#"{"messages":[{"role":"user","content":"  hi  "}]}"#;
    let text = r
        .render(chat::conversation(body, &r.lists).unwrap())
        .unwrap();
    // As jinja2 renders it (checked with the vLLM venv's jinja2).
    assert_eq!(text, "<s>\n[USER] hi\n[ASSISTANT]");
    let tool = br#"{"messages":[{"role":"tool","content":"x"}]}"#;
    assert_eq!(
        r.render(chat::conversation(tool, &r.lists).unwrap()),
        Err(Unrendered::Failed)
    );
}

/// The byte model with `template` (a file of `tests/data/render/`) as its
/// chat template.
fn byte_model_with(template: &str) -> Renderer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("poimen-render-{template}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(root.join("conf/byte-model").join(f), dir.join(f)).unwrap();
    }
    let source = root.join("tests/data/render").join(template);
    std::fs::copy(source, dir.join("chat_template.jinja")).unwrap();
    let r = Renderer::load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    r
}

/// The requests of `corpus` (`tests/data/render/`) that `r` does not
/// render to the ids vLLM 0.32 computed for them, and how many it checked.
/// Each body is given as the corpus has it, its keys in their order. One
/// the renderer refuses as `Unsupported` is not counted wrong if it is one
/// of `refused`.
fn mismatches(r: &Renderer, corpus: &str, refused: &[&str]) -> (usize, Vec<String>) {
    #[derive(serde::Deserialize)]
    struct Corpus {
        entries: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        name: String,
        api: String,
        body: Box<serde_json::value::RawValue>,
        token_ids: Option<Vec<u32>>,
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/render")
        .join(corpus);
    let corpus: Corpus = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let text = |ids: &[u32]| {
        String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned()
    };
    let mut checked = 0;
    let mut wrong = Vec::new();
    for e in corpus.entries {
        let api = match e.api.as_str() {
            "chat" => Api::ChatCompletions,
            "completions" => Api::Completions,
            "messages" => Api::Messages,
            "responses" => Api::Responses,
            other => panic!("api {other}"),
        };
        let Some(want) = e.token_ids else {
            continue;
        };
        let got = r.tokens(api, e.body.get().as_bytes());
        let excused = got == Err(Unrendered::Unsupported) && refused.contains(&e.name.as_str());
        if got.as_ref() != Ok(&want) && !excused {
            let got = got.map(|g| text(&g));
            wrong.push(format!("{}: got {got:?}, want {:?}", e.name, text(&want)));
        }
        checked += 1;
    }
    (checked, wrong)
}

/// Every request of the corpora recorded from vLLM 0.32 renders to the ids
/// vLLM computed for it: with the byte model's template (role and
/// content), with one that prints every field a message and the request
/// give the template (names, reasoning, the effort, thinking, kwargs), and
/// tool-using requests (hand-made, and captured from Claude Code and
/// Codex) with Qwen3's template (tools, tool calls, tool responses).
#[test]
fn chat_messages_and_responses_render_as_vllm_rendered_them() {
    // What vLLM renders with Python's own readings: NaN and 1e400 in
    // arguments, an integer beyond 64 bits, the repr of a list.
    let refused = [
        "chat-tool-call-args-nonfinite",
        "chat-tool-call-args-numbers",
        "msg-tool-result-in-assistant",
    ];
    for (r, corpus, least) in [
        (byte_model(), "corpus.json", 50),
        (byte_model_with("fields.jinja"), "fields.json", 50),
        (byte_model_with("qwen3.jinja"), "tools.json", 100),
        (byte_model_with("qwen3.jinja"), "agents.json", 6),
    ] {
        // Twice: the second time, the tool lists are the ones kept.
        let (_, first) = mismatches(&r, corpus, &refused);
        assert!(first.is_empty(), "{corpus}:\n{}", first.join("\n"));
        let (checked, wrong) = mismatches(&r, corpus, &refused);
        assert!(checked >= least, "{corpus}: {checked} entries");
        assert!(wrong.is_empty(), "{corpus}:\n{}", wrong.join("\n"));
    }
}

/// A byte-level BPE with a few merges and the special tokens of a chat
/// template, built in place (the shape of Llama 3's and Qwen's).
fn bpe_with_specials() -> Tokenizer {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::AddedToken;
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    let mut vocab: tokenizers::models::bpe::Vocab = alphabet
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i as u32))
        .collect();
    let merges: Vec<(String, String)> =
        [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "Ġ"), ("o", "n")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    for (a, b) in &merges {
        let n = vocab.len() as u32;
        vocab.insert(format!("{a}{b}"), n);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let mut t = Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    let specials: Vec<AddedToken> = ["<|start|>", "<|eot|>"]
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    t.add_special_tokens(specials).unwrap();
    t
}

#[test]
fn a_prompt_tokenized_by_its_pieces_is_tokenized_as_a_whole() {
    let mut t = bpe_with_specials();
    // NFC composes a mark into a piece's last character.
    t.with_normalizer(Some(tokenizers::normalizers::NFC))
        .unwrap();
    assert!(pieces::splits_apart(&t));
    // Pieces that meet spaces, newlines, other pieces and the text's ends,
    // each text twice (the second from the kept pieces).
    let words = [
        "the",
        " the",
        "  ",
        "\n\n",
        "on",
        "é",
        "<|eot|>",
        "<|start|>",
        "x  ",
        " 42",
        " Cafe\u{301}",
    ];
    let mut seed = 7u64;
    let mut cases = Vec::new();
    for _ in 0..300 {
        let mut text = String::new();
        for _ in 0..12 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.push_str(words[(seed >> 33) as usize % words.len()]);
        }
        cases.push(text);
    }
    for encoder in encoder::both(&t) {
        let pieces = pieces::Pieces::new();
        for text in cases.iter().chain(&cases) {
            let whole = t
                .encode_fast(text.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(encoder.encode(text, false), Some(whole.clone()));
            match pieces.split(&encoder, text) {
                Some(split) => {
                    let ids = pieces.finish(&encoder, split);
                    assert_eq!(ids, Some(whole), "{text:?}");
                    // Every piece is kept now: nothing is new the next time.
                    assert_eq!(pieces.split(&encoder, text).unwrap().new_bytes(), 0);
                }
                None => assert!(!text.contains("<|"), "{text:?}"),
            }
        }
    }
}

#[test]
fn pieces_are_kept_only_where_the_tokenizer_splits_them_apart() {
    use tokenizers::normalizers::NFKC;
    use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
    let mut t = bpe_with_specials();
    t.with_normalizer(Some(NFKC)).unwrap();
    assert!(!pieces::splits_apart(&t));
    let mut t = bpe_with_specials();
    t.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::First, true)));
    assert!(!pieces::splits_apart(&t));
    t.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    assert!(pieces::splits_apart(&t));
    // The byte model has no special tokens between messages: nothing kept.
    assert!(pieces::Pieces::new()
        .split(&byte_model().encoder, "user\nhi\n")
        .is_none());
}

#[test]
fn tools_and_tool_calls_render_alike_through_every_api() {
    // The byte model's template shows tools and tool calls as vllm-sim
    // renders them (sim/src/conversation.rs).
    let r = byte_model();
    let want = "tools\nread: None\nuser\nq\nassistant\n\ncall read\nB: x\npath: a\ntool\nr\n";
    let chat = br#"{"tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
        "messages": [{"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "read", "arguments": "{\"path\": \"a\", \"n\": 1, \"B\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r"}]}"#;
    let messages = br#"{"tools": [{"name": "read", "input_schema": {}}],
        "messages": [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "read", "input": {"path": "a", "n": 1, "B": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "r"}]}]}"#;
    let responses = br#"{"tools": [{"type": "function", "name": "read", "parameters": {}}, {"type": "web_search"}],
        "input": [{"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "read", "arguments": "{\"path\": \"a\", \"n\": 1, \"B\": \"x\"}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"}]}"#;
    for (api, body) in [
        (Api::ChatCompletions, &chat[..]),
        (Api::Messages, &messages[..]),
        (Api::Responses, &responses[..]),
    ] {
        let ids = r.tokens(api, body).unwrap();
        let text = String::from_utf8(ids.iter().map(|&i| i as u8).collect()).unwrap();
        assert_eq!(text, want, "{api:?}");
    }
}

#[test]
fn the_byte_model_is_tokenized_by_fastokens() {
    // It loads and agrees with the Hugging Face crate on the probes.
    assert!(matches!(byte_model().encoder, Encoder::Fast(_)));
}

proptest::proptest! {
    /// Any text, with special tokens, marks NFC composes, scripts and
    /// whitespace among it: fastokens and the kept pieces give the Hugging
    /// Face crate's ids for it.
    #[test]
    fn every_encoder_gives_the_hugging_face_crates_ids(
        parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::string::string_regex("\\PC{0,12}").unwrap(),
                proptest::string::string_regex("[ \t\n]{1,4}|[0-9]{1,5}|'[a-z]{1,2}").unwrap(),
                proptest::sample::select(vec![
                    "<|start|>", "<|eot|>", "e\u{301}", "\u{1100}\u{1161}", "東京", "🦀", " the",
                ]).prop_map(str::to_string),
            ],
            0..12,
        )
    ) {
        let mut t = bpe_with_specials();
        t.with_normalizer(Some(tokenizers::normalizers::NFC)).unwrap();
        let text = parts.concat();
        let whole = t.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
        for encoder in encoder::both(&t) {
            proptest::prop_assert_eq!(encoder.encode(&text, false), Some(whole.clone()));
            let pieces = pieces::Pieces::new();
            if let Some(split) = pieces.split(&encoder, &text) {
                proptest::prop_assert_eq!(pieces.finish(&encoder, split), Some(whole.clone()));
            }
        }
    }
}
