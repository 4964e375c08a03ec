//! Inputs: chat prompts as Qwen3's (or Llama 3.1's) chat template renders
//! them, built from real text on this machine (the Rust sources and
//! READMEs under ~/.cargo/registry/src, JSON test data found there) plus a
//! few multilingual lines; a 1 MB text; short prompts; random Unicode.
//! Deterministic for a given registry content and seed.

use std::path::{Path, PathBuf};

/// SplitMix64: small, seeded, good enough to pick files and characters.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Which chat template to render with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen,
    Llama3,
}

impl Family {
    /// From the tokenizer's added tokens.
    pub fn of(dir: &Path) -> Family {
        let text = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap_or_default();
        if text.contains("<|start_header_id|>") {
            Family::Llama3
        } else {
            Family::Qwen
        }
    }
}

pub struct Corpus {
    /// (path relative to the registry's source directory, text)
    pub code: Vec<(String, String)>,
    pub prose: Vec<String>,
    pub json: Vec<String>,
}

/// Lines in other scripts and with emoji, written for this benchmark.
pub const MULTILINGUAL: &[&str] = &[
    "请帮我检查这个函数为什么在高并发下会死锁，并给出修改建议。",
    "这个配置文件里的超时时间单位是毫秒还是秒？文档里没有写清楚。",
    "我们的网关在每秒一万个请求时，CPU 占用率达到了百分之九十五。",
    "分词器的速度决定了首个令牌的延迟，所以我们需要一个更快的实现。",
    "このエラーメッセージの意味を日本語で説明してください。",
    "テストが失敗した原因は、タイムゾーンの設定が違うからだと思います。",
    "캐시 적중률이 낮은 이유를 분석해 주세요. 로그를 첨부했습니다.",
    "Пожалуйста, объясни, почему этот тест падает только на CI.",
    "Η συνάρτηση επιστρέφει λάθος αποτέλεσμα όταν η είσοδος είναι κενή.",
    "La función devuelve un error cuando el archivo no existe — ¿por qué?",
    "Können Sie mir erklären, warum dieser Schlüssel nicht gefunden wird?",
    "Đây là lỗi khi biên dịch dự án với phiên bản Rust mới nhất.",
    "यह फ़ंक्शन खाली इनपुट पर गलत परिणाम क्यों देता है?",
    "هذا الاختبار يفشل فقط عندما يكون الإدخال فارغًا.",
    "Great, that fixed it 🎉🚀 thanks! 👍🏽 Next: the flaky test 🐛🔥",
    "Status: ✅ build, ❌ lint, ⚠️ 3 warnings — see below 👇",
    "Résumé: la requête a échoué (délai dépassé) après 30 s.",
    "emoji family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 and keycaps 1️⃣2️⃣ in one line",
];

/// Where cargo keeps crate sources: $CARGO_HOME/registry/src/<index>/.
pub fn registry_dirs() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

impl Corpus {
    /// The registry's files, sorted, then shuffled by a fixed seed.
    pub fn load() -> Corpus {
        let mut files = Vec::new();
        for d in registry_dirs() {
            walk(&d, &mut files);
        }
        let base = registry_dirs().into_iter().next().unwrap_or_default();
        let (mut code, mut prose, mut json) = (Vec::new(), Vec::new(), Vec::new());
        for p in files {
            let Ok(meta) = std::fs::metadata(&p) else {
                continue;
            };
            let len = meta.len();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            let want = match ext {
                "rs" => (2_000..40_000).contains(&len),
                "md" => (1_000..60_000).contains(&len),
                "json" => (500..200_000).contains(&len),
                _ => false,
            };
            if !want {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            match ext {
                "rs" => {
                    let rel = p
                        .strip_prefix(&base)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned();
                    code.push((rel, text));
                }
                "md" => prose.push(text),
                _ => json.push(text),
            }
        }
        let mut rng = Rng::new(7);
        shuffle(&mut code, &mut rng);
        shuffle(&mut prose, &mut rng);
        shuffle(&mut json, &mut rng);
        assert!(
            code.len() > 200 && prose.len() > 20 && !json.is_empty(),
            "too little text under ~/.cargo/registry/src: {} .rs, {} .md, {} .json",
            code.len(),
            prose.len(),
            json.len()
        );
        Corpus { code, prose, json }
    }

    /// A paragraph or so of English prose (from a README), about `len` bytes.
    pub fn prose_piece(&self, rng: &mut Rng, len: usize) -> String {
        let doc = rng.pick(&self.prose);
        let start = floor_char(doc, rng.below(doc.len().saturating_sub(len).max(1)));
        let end = floor_char(doc, (start + len).min(doc.len()));
        doc[start..end].to_string()
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}

/// The largest char boundary <= `i`.
pub fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// JSON string content (as Python's json.dumps / Jinja's tojson writes it,
/// ensure_ascii off).
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The tools of the prompts, each as `tojson` writes it (", " and ": ").
const TOOLS: &[&str] = &[
    r#"{"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository. Returns its content as text, with line numbers when `numbered` is set. Use it before editing a file; do not guess a file's content.", "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Path relative to the repository root, e.g. src/main.rs"}, "numbered": {"type": "boolean", "description": "Prefix each line with its number", "default": false}, "start_line": {"type": "integer", "minimum": 1}, "end_line": {"type": "integer", "minimum": 1}}, "required": ["path"]}}}"#,
    r#"{"type": "function", "function": {"name": "write_file", "description": "Create or overwrite a file with the given content. The parent directory must exist.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string", "description": "The whole new content of the file"}}, "required": ["path", "content"]}}}"#,
    r#"{"type": "function", "function": {"name": "apply_patch", "description": "Apply a unified diff to the working tree. Fails without changing anything if a hunk does not apply.", "parameters": {"type": "object", "properties": {"patch": {"type": "string", "description": "A unified diff, paths relative to the repository root (a/ and b/ prefixes)"}}, "required": ["patch"]}}}"#,
    r#"{"type": "function", "function": {"name": "run_command", "description": "Run a shell command in the repository root and return its exit status, standard output and standard error (each truncated to 20000 bytes). Network access is disabled.", "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command line, run by /bin/sh -c"}, "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600, "default": 120}, "env": {"type": "object", "additionalProperties": {"type": "string"}}}, "required": ["command"]}}}"#,
    r#"{"type": "function", "function": {"name": "search_code", "description": "Search the repository for a regular expression (ripgrep syntax). Returns matching lines as JSON objects with path, line number and text.", "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "glob": {"type": "string", "description": "Only files matching this glob, e.g. **/*.rs"}, "max_results": {"type": "integer", "default": 50}, "case_sensitive": {"type": "boolean", "default": true}}, "required": ["pattern"]}}}"#,
    r#"{"type": "function", "function": {"name": "list_directory", "description": "List the entries of a directory: name, kind (file, dir, symlink) and size in bytes.", "parameters": {"type": "object", "properties": {"path": {"type": "string", "default": "."}, "recursive": {"type": "boolean", "default": false}, "max_depth": {"type": "integer", "minimum": 1, "maximum": 8}}, "required": []}}}"#,
    r#"{"type": "function", "function": {"name": "fetch_url", "description": "Fetch a documentation page (HTTP GET) from an allow-listed host and return it converted to Markdown.", "parameters": {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}, "max_bytes": {"type": "integer", "default": 100000}}, "required": ["url"]}}}"#,
];

struct Msg {
    role: &'static str,
    content: String,
    /// Assistant tool calls: (name, arguments as tojson writes them).
    calls: Vec<(&'static str, String)>,
}

/// The messages of one agentic coding conversation of about `target` bytes.
fn conversation(c: &Corpus, rng: &mut Rng, target: usize) -> (String, Vec<Msg>) {
    let system = format!(
        "You are a senior software engineer working in a Rust repository. Answer precisely, cite file paths, and prefer small, reviewed changes.\n\n{}",
        c.prose_piece(rng, 600)
    );
    let mut msgs = vec![Msg {
        role: "user",
        content: format!(
            "{}\n\n{}\n\nThe failing code is in `{}`; please read it and fix the bug.",
            c.prose_piece(rng, 400),
            rng.pick(MULTILINGUAL),
            rng.pick(&c.code).0
        ),
        calls: vec![],
    }];
    let mut size = system.len() + msgs[0].content.len() + 4000;
    while size < target {
        let (path, text) = rng.pick(&c.code);
        let (call, result) = match rng.below(6) {
            0 | 1 | 2 => (
                ("read_file", format!("{{\"path\": {}}}", json_str(path))),
                text.clone(),
            ),
            3 => {
                let j = rng.pick(&c.json);
                let end = floor_char(j, 6000);
                (
                    (
                        "fetch_url",
                        format!(
                            "{{\"url\": \"https://docs.example.org/{}\"}}",
                            rng.below(1000)
                        ),
                    ),
                    j[..end].to_string(),
                )
            }
            4 => {
                // search results, one JSON object per line
                let word = text
                    .split(|ch: char| !ch.is_alphanumeric() && ch != '_')
                    .filter(|w| w.len() > 5)
                    .nth(rng.below(20))
                    .unwrap_or("unwrap")
                    .to_string();
                let mut out = String::new();
                for (n, line) in text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| l.contains(&word))
                    .take(40)
                {
                    out.push_str(&format!(
                        "{{\"path\": {}, \"line\": {}, \"text\": {}}}\n",
                        json_str(path),
                        n + 1,
                        json_str(line.trim())
                    ));
                }
                (
                    (
                        "search_code",
                        format!(
                            "{{\"pattern\": {}, \"glob\": \"**/*.rs\"}}",
                            json_str(&word)
                        ),
                    ),
                    out,
                )
            }
            _ => {
                let head: String = text
                    .lines()
                    .take(30)
                    .map(|l| format!("warning: {}\n", l.trim()))
                    .collect();
                (
                    ("run_command", "{\"command\": \"cargo build --release 2>&1 | tail -n 60\"}".to_string()),
                    format!("exit status: 101\nstdout:\n\nstderr:\n   Compiling gateway v0.1.0\n{head}error: could not compile `gateway` (lib) due to 2 previous errors\n"),
                )
            }
        };
        let tlen = 150 + rng.below(300);
        let mut thought = c.prose_piece(rng, tlen);
        if rng.below(4) == 0 {
            thought.push_str("\n\n");
            thought.push_str(*rng.pick(MULTILINGUAL));
        }
        size += thought.len() + call.1.len() + result.len() + 120;
        msgs.push(Msg {
            role: "assistant",
            content: thought,
            calls: vec![call],
        });
        msgs.push(Msg {
            role: "tool",
            content: result,
            calls: vec![],
        });
    }
    (system, msgs)
}

/// Qwen3's chat template (tokenizer_config.json), with tools, generation prompt.
fn render_qwen(system: &str, msgs: &[Msg]) -> String {
    let mut s = String::new();
    s.push_str("<|im_start|>system\n");
    s.push_str(system);
    s.push_str("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for t in TOOLS {
        s.push('\n');
        s.push_str(t);
    }
    s.push_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    for (i, m) in msgs.iter().enumerate() {
        match m.role {
            "user" => {
                s.push_str("<|im_start|>user\n");
                s.push_str(&m.content);
                s.push_str("<|im_end|>\n");
            }
            "assistant" => {
                s.push_str("<|im_start|>assistant\n");
                s.push_str(&m.content);
                for (k, (name, args)) in m.calls.iter().enumerate() {
                    if k > 0 || !m.content.is_empty() {
                        s.push('\n');
                    }
                    s.push_str("<tool_call>\n{\"name\": \"");
                    s.push_str(name);
                    s.push_str("\", \"arguments\": ");
                    s.push_str(args);
                    s.push_str("}\n</tool_call>");
                }
                s.push_str("<|im_end|>\n");
            }
            _ => {
                if i == 0 || msgs[i - 1].role != "tool" {
                    s.push_str("<|im_start|>user");
                }
                s.push_str("\n<tool_response>\n");
                s.push_str(&m.content);
                s.push_str("\n</tool_response>");
                if i + 1 == msgs.len() || msgs[i + 1].role != "tool" {
                    s.push_str("<|im_end|>\n");
                }
            }
        }
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

/// Llama 3.1's template (tools in the first user message, `ipython` results).
fn render_llama(system: &str, msgs: &[Msg]) -> String {
    let mut s = String::from("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    s.push_str(system);
    s.push_str("<|eot_id|>");
    for (i, m) in msgs.iter().enumerate() {
        match m.role {
            "user" => {
                s.push_str("<|start_header_id|>user<|end_header_id|>\n\n");
                if i == 0 {
                    s.push_str("Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
                    for t in TOOLS {
                        s.push_str(t);
                        s.push_str("\n\n");
                    }
                }
                s.push_str(&m.content);
                s.push_str("<|eot_id|>");
            }
            "assistant" => {
                s.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                let (name, args) = &m.calls[0];
                s.push_str(&format!("{{\"name\": \"{name}\", \"parameters\": {args}}}"));
                s.push_str("<|eot_id|>");
            }
            _ => {
                s.push_str("<|start_header_id|>ipython<|end_header_id|>\n\n");
                s.push_str(&m.content);
                s.push_str("<|eot_id|>");
            }
        }
    }
    s.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
    s
}

fn render(f: Family, system: &str, msgs: &[Msg]) -> String {
    match f {
        Family::Qwen => render_qwen(system, msgs),
        Family::Llama3 => render_llama(system, msgs),
    }
}

/// A rendered agentic conversation of exactly `len` bytes or just under
/// (the last tool result cut at a char boundary), ending with the
/// generation prompt.
pub fn chat_prompt(c: &Corpus, f: Family, seed: u64, len: usize) -> String {
    let mut rng = Rng::new(seed);
    let (system, mut msgs) = conversation(c, &mut rng, len + 2000);
    loop {
        let text = render(f, &system, &msgs);
        if text.len() <= len {
            return text;
        }
        let over = text.len() - len;
        let last = msgs
            .iter()
            .rposition(|m| m.role == "tool")
            .expect("a tool message");
        let content = &msgs[last].content;
        if over < content.len() {
            let cut = floor_char(content, content.len() - over);
            msgs[last].content.truncate(cut);
        } else {
            msgs.truncate(last.saturating_sub(1).max(1));
        }
    }
}

/// A short prompt (~1 KB): system, one user question, generation prompt.
pub fn short_prompt(c: &Corpus, f: Family, seed: u64) -> String {
    let mut rng = Rng::new(seed ^ 0x5151);
    let system = "You are a helpful assistant.".to_string();
    let mut q = c.prose_piece(&mut rng, 500);
    q.push_str("\n\n");
    if rng.below(3) == 0 {
        q.push_str(*rng.pick(MULTILINGUAL));
        q.push('\n');
    }
    let (_, code) = rng.pick(&c.code);
    let start = floor_char(code, rng.below(code.len().saturating_sub(400).max(1)));
    q.push_str("```rust\n");
    q.push_str(&code[start..floor_char(code, start + 350)]);
    q.push_str("\n```\nWhat does this do?");
    let msgs = [Msg {
        role: "user",
        content: q,
        calls: vec![],
    }];
    match f {
        Family::Qwen => format!(
            "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
            msgs[0].content
        ),
        Family::Llama3 => format!(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            msgs[0].content
        ),
    }
}

/// About `len` bytes of plain text (no added tokens): source files, README
/// prose and multilingual lines, in turn.
pub fn big_text(c: &Corpus, seed: u64, len: usize) -> String {
    let mut rng = Rng::new(seed ^ 0xB16);
    let mut s = String::with_capacity(len + 50_000);
    while s.len() < len {
        match rng.below(4) {
            0 | 1 => s.push_str(&rng.pick(&c.code).1),
            2 => s.push_str(&c.prose_piece(&mut rng, 3000)),
            _ => {
                for _ in 0..5 {
                    s.push_str(*rng.pick(MULTILINGUAL));
                    s.push('\n');
                }
            }
        }
        s.push_str("\n\n");
    }
    s.truncate(floor_char(&s, len));
    s
}

/// One random char, from a mix weighted toward text-like ranges.
pub fn random_char(rng: &mut Rng) -> char {
    random_char_in(rng, false)
}

/// `old_only`: leave out the "anything" range (whose characters may be
/// assigned in a recent Unicode version only).
pub fn random_char_in(rng: &mut Rng, old_only: bool) -> char {
    let ranges: &[(u32, u32)] = &[
        (0x20, 0x7E),       // ASCII printable
        (0x09, 0x0D),       // tab, newlines, CR
        (0xA0, 0x24F),      // Latin-1, Latin Extended
        (0x300, 0x36F),     // combining diacritics
        (0x370, 0x52F),     // Greek, Cyrillic
        (0x590, 0x6FF),     // Hebrew, Arabic
        (0x900, 0x97F),     // Devanagari
        (0x1100, 0x11FF),   // Hangul Jamo (NFC composes them)
        (0x2000, 0x206F),   // general punctuation, spaces, ZWJ
        (0x3000, 0x30FF),   // CJK punctuation, kana
        (0x4E00, 0x9FFF),   // CJK ideographs
        (0xAC00, 0xD7A3),   // Hangul syllables
        (0xF900, 0xFAFF),   // CJK compatibility (NFC maps them)
        (0xFF00, 0xFFEF),   // full-width forms
        (0x1F300, 0x1FAFF), // emoji
        (0x0, 0x10FFFF),    // anything
    ];
    let n = if old_only {
        ranges.len() - 1
    } else {
        ranges.len()
    };
    loop {
        let (lo, hi) = ranges[rng.below(n)];
        let cp = lo + (rng.next() % (hi - lo + 1) as u64) as u32;
        if let Some(ch) = char::from_u32(cp) {
            return ch;
        }
    }
}

/// `len` bytes (or just under) of random Unicode, in "words" split by spaces.
pub fn random_unicode(seed: u64, len: usize) -> String {
    random_unicode_in(seed, len, false)
}

pub fn random_unicode_in(seed: u64, len: usize, old_only: bool) -> String {
    let mut rng = Rng::new(seed ^ 0xDEC0DE);
    let mut s = String::with_capacity(len + 8);
    while s.len() < len {
        let ch = if rng.below(6) == 0 {
            ' '
        } else {
            random_char_in(&mut rng, old_only)
        };
        if s.len() + ch.len_utf8() > len {
            break;
        }
        s.push(ch);
    }
    s
}
