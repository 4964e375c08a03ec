use super::*;

/// The byte-level tokenizer and template of `bench/vllm-real`'s tiny
/// model (one token per byte, `role\ncontent\n` per message), the files
/// vLLM served when `tests/data/kv_events/tokenize.json` was recorded.
fn byte_model() -> Renderer {
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
            br#"{"messages":[{"role":"user","content":"q"}],"tools":[]}"#,
            Unrendered::Tools,
        ),
        (
            br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}"#,
            Unrendered::Tools,
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
    assert_eq!(r.tokens(Api::Messages, b"{}"), Err(Unrendered::Api));
}

#[test]
fn a_template_renders_as_transformers_does() {
    // trim_blocks and lstrip_blocks, Python's string methods, the special
    // tokens, the generation prompt and raise_exception.
    let source = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}\n[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}\n{% if add_generation_prompt %}[ASSISTANT]{% endif %}";
    let r = Renderer {
        dir: PathBuf::new(),
        tokenizer: byte_model().tokenizer,
        template: Some(environment(source.into()).unwrap()),
        specials: [("bos_token".to_string(), "<s>".to_string())].into(),
    };
    let body = br#"{"messages":[{"role":"user","content":"  hi  "}]}"#;
    let text = r
        .render_chat(serde_json::from_slice(body).unwrap())
        .unwrap();
    // As jinja2 renders it (checked with the vLLM venv's jinja2).
    assert_eq!(text, "<s>\n[USER] hi\n[ASSISTANT]");
    let tool = br#"{"messages":[{"role":"tool","content":"x"}]}"#;
    assert_eq!(
        r.render_chat(serde_json::from_slice(tool).unwrap()),
        Err(Unrendered::Failed)
    );
}
