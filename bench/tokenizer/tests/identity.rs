//! Identity: every candidate gives the Hugging Face crate's ids (tokenizers
//! 0.23, fancy-regex, `encode_fast(text, false)`, as the gateway calls it).
//!
//! - one property test per (model, candidate) over random strings: ASCII,
//!   arbitrary Unicode, text-like Unicode, strings made of added tokens (and
//!   pieces of them), whitespace runs, digit runs, combining characters and
//!   other text NFC changes, contractions (with Unicode case folding);
//! - one test per model on the benchmark's big inputs (64 KB chat prompts,
//!   1 MB text, 64 KB random Unicode, 1 KB prompts).
//!
//! `PROPTEST_CASES` sets the cases per property test (default 3000). A model
//! whose directory (models/, see setup.sh) is missing is skipped.

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokbench::inputs::{self, Corpus, Family};
use tokbench::Candidate;

struct Set {
    names: Vec<&'static str>,
    cands: Vec<Box<dyn Candidate>>,
    reference: tokenizers::Tokenizer,
    family: Family,
}

fn set(model: &str) -> Option<&'static Set> {
    static QWEN: OnceLock<Option<Set>> = OnceLock::new();
    static LLAMA: OnceLock<Option<Set>> = OnceLock::new();
    let cell = match model {
        "qwen3" => &QWEN,
        "llama3_1" => &LLAMA,
        _ => panic!("unknown model {model}"),
    };
    cell.get_or_init(|| {
        tokbench::single_threaded();
        let dir = tokbench::model_dir(model);
        if !dir.join("tokenizer.json").exists() {
            eprintln!("{}: missing, skipped (run setup.sh)", dir.display());
            return None;
        }
        let mut names = Vec::new();
        let mut cands = Vec::new();
        for name in tokbench::names() {
            match tokbench::load(name, &dir) {
                Ok(c) => {
                    names.push(name);
                    cands.push(c);
                }
                Err(e) => eprintln!("{model}/{name}: does not load: {e}"),
            }
        }
        let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        Some(Set {
            names,
            cands,
            reference,
            family: Family::of(&dir),
        })
    })
    .as_ref()
}

const SPECIAL: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "<|fim_prefix|>",
    "<|vision_pad|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_7|>",
    "<|python_tag|>",
    "<|im_start",
    "im_end|>",
    "<|",
    "|>",
    "<",
    ">",
    "</",
    "tool_call",
    "<<",
    "||",
    " ",
    "  ",
    "\n",
    "\n\n",
    "system",
    "user",
    "assistant",
    "Hello",
    " world",
    "世界",
    "{\"a\": 1}",
    "é",
    "e\u{301}",
    "😀",
    "12",
    "'s",
    "\t",
];
const WHITESPACE: &[&str] = &[
    " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2003}", "\u{85}",
    "\u{2028}", "\u{2029}", "\u{200b}", "\u{feff}", "\u{b}", "\u{c}", "\u{1680}", "\u{202f}",
    "\u{205f}", "\u{180e}", "\u{1c}", "\u{1f}", "\u{0}", "a", "word", "x1", ".", "!", "'s", "é",
    "中", "😀", "-", "()", "{", "}",
];
const DIGITS: &[&str] = &[
    "0", "1", "7", "12", "345", "6789", "00000", "٣", "३", "３", "Ⅻ", "½", "²", "①", "𝟘", "〇",
    "1,000", ".5", " 42", "-7", "a1b2", "x", " ", "\n", "e", "百", "$", "%",
];
const NFC: &[&str] = &[
    "e",
    "a",
    "o",
    "A",
    "n",
    "u",
    " ",
    "\n",
    "x",
    "\u{301}",
    "\u{300}",
    "\u{308}",
    "\u{327}",
    "\u{323}\u{302}",
    "\u{302}\u{323}",
    "\u{1100}",
    "\u{1161}",
    "\u{11a8}",
    "\u{212b}",
    "\u{2126}",
    "\u{f900}",
    "\u{fa10}",
    "\u{958}",
    "\u{344}",
    "\u{1e9b}\u{323}",
    "ñ",
    "n\u{303}",
    "か",
    "\u{3099}",
    "\u{ff76}\u{ff9e}",
    "\u{1f1}",
    "\u{fb01}",
    "\u{2fa1d}",
    "\u{f951}",
    "\u{cd}",
    "I\u{307}",
    "\u{5d9}\u{5b4}",
    "\u{915}\u{93c}",
    "'s",
    "1",
    "<|im_end|>",
];
const CONTRACTIONS: &[&str] = &[
    "'s",
    "'S",
    "'t",
    "'T",
    "'re",
    "'RE",
    "'Re",
    "'ve",
    "'VE",
    "'m",
    "'M",
    "'ll",
    "'LL",
    "'lL",
    "'d",
    "'D",
    "'\u{17f}",
    "'\u{212a}",
    "'",
    "''",
    "\u{2019}s",
    "it",
    "don",
    " ",
    "I",
    "we",
    "\n",
    "x",
    "\u{1c7}",
    "'\u{3a3}",
    "'ﬅ",
    "'st",
    "'re'",
    "1",
    ".",
];

/// Blocks of recent Unicode versions (14 to 17): where the Unicode tables of
/// regex engines, scanners and normalizers of different ages disagree.
const RECENT: &[(u32, u32)] = &[
    (0x0870, 0x089F),
    (0x10780, 0x107BF),
    (0x11AB0, 0x11ABF),
    (0x1DF00, 0x1DFFF),
    (0x1E290, 0x1E2BF),
    (0x1E7E0, 0x1E7FF),
    (0x1E030, 0x1E08F),
    (0x11F00, 0x11F5F),
    (0x1E4D0, 0x1E4FF),
    (0x31350, 0x323AF),
    (0x2EBF0, 0x2EE5F),
    (0x105C0, 0x105FF),
    (0x10D40, 0x10D8F),
    (0x11380, 0x113FF),
    (0x16D40, 0x16D7F),
    (0x1E5D0, 0x1E5FF),
    (0x16100, 0x1613F),
    (0x11BC0, 0x11BFF),
    (0x1CC00, 0x1CEBF),
    (0x10EC0, 0x10EFF),
    (0x1FA70, 0x1FAFF),
    (0x10940, 0x1099F),
    (0x11DB0, 0x11DEF),
    (0x16EA0, 0x16EDF),
    (0x1E6C0, 0x1E6FF),
    (0x1F8B0, 0x1F8FF),
    (0x0C5C, 0x0C5D),
    (0x0CDC, 0x0CDD),
];

fn recent() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        3 => select(RECENT).prop_flat_map(|(lo, hi)| lo..=hi)
            .prop_filter_map("unassigned", |cp| char::from_u32(cp).map(String::from)),
        1 => select(&[" ", "a", "1", "'s", "\n", "\u{301}", "中"][..]).prop_map(String::from),
    ];
    prop::collection::vec(ch, 0..40).prop_map(|v| v.concat())
}

/// One piece repeated up to 5000 times, between two short random strings:
/// long whitespace runs, long words, long CJK runs without spaces.
const RUNS: &[&str] = &[
    " ",
    "\n",
    "\t",
    "a",
    "1",
    "中",
    "😀",
    "ab",
    " a",
    "\u{301}",
    "e\u{301}",
    "'s",
    "<|im_end|>",
    "\r\n",
    "  \n",
    "!",
    "ア",
    "한",
    " \u{a0}",
    "xY",
    ".",
    "_",
    "ـ",
];

fn runs() -> impl Strategy<Value = String> {
    let all = every_piece(NFC);
    (pieces(all), select(RUNS), 1usize..5000, pieces(all))
        .prop_map(|(a, p, n, b)| a + &p.repeat(n) + &b)
}

/// Every list of pieces, with `nfc` for the marks NFC changes.
fn every_piece(nfc: &[&'static str]) -> &'static [&'static str] {
    Box::leak(
        [SPECIAL, WHITESPACE, DIGITS, nfc, CONTRACTIONS]
            .concat()
            .into_boxed_slice(),
    )
}

fn pieces(list: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(select(list), 0..40).prop_map(|v| v.concat())
}

/// `TOKBENCH_OLD_UNICODE=1`: only characters of Unicode 9.0 and before
/// (nearly: no arbitrary code points, no RECENT blocks, no NFC entries of
/// later marks), to tell candidates' Unicode-version differences from
/// other ones.
fn old_only() -> bool {
    std::env::var_os("TOKBENCH_OLD_UNICODE").is_some()
}

fn any_input() -> BoxedStrategy<String> {
    if old_only() {
        return old_input().boxed();
    }
    let all = every_piece(NFC);
    prop_oneof![
        "[ -~\t\n\r]{0,160}",
        prop::collection::vec(any::<char>(), 0..80).prop_map(|v| v.into_iter().collect::<String>()),
        (any::<u64>(), 0usize..400).prop_map(|(seed, len)| inputs::random_unicode(seed, len)),
        pieces(SPECIAL),
        pieces(WHITESPACE),
        pieces(DIGITS),
        pieces(NFC),
        pieces(CONTRACTIONS),
        pieces(all),
        (pieces(all), any::<u64>(), 0usize..60)
            .prop_map(|(p, seed, len)| p + &inputs::random_unicode(seed, len)),
        recent(),
        runs(),
    ]
    .boxed()
}

fn old_input() -> impl Strategy<Value = String> {
    const NFC_OLD: &[&str] = &[
        "e",
        "a",
        "o",
        "A",
        "n",
        "u",
        " ",
        "\n",
        "x",
        "\u{301}",
        "\u{300}",
        "\u{308}",
        "\u{327}",
        "\u{323}\u{302}",
        "\u{302}\u{323}",
        "\u{1100}",
        "\u{1161}",
        "\u{11a8}",
        "\u{212b}",
        "\u{2126}",
        "\u{f900}",
        "\u{fa10}",
        "\u{958}",
        "\u{344}",
        "\u{1e9b}\u{323}",
        "ñ",
        "n\u{303}",
        "か",
        "\u{3099}",
        "\u{1f1}",
        "\u{fb01}",
        "\u{cd}",
        "I\u{307}",
        "\u{5d9}\u{5b4}",
        "\u{915}\u{93c}",
        "\u{5b0}\u{591}",
        "\u{64b}\u{650}\u{651}",
        "'s",
        "1",
    ];
    let all = every_piece(NFC_OLD);
    prop_oneof![
        "[ -~\t\n\r]{0,160}",
        (any::<u64>(), 0usize..400)
            .prop_map(|(seed, len)| inputs::random_unicode_in(seed, len, true)),
        pieces(SPECIAL),
        pieces(WHITESPACE),
        pieces(DIGITS),
        pieces(NFC_OLD),
        pieces(CONTRACTIONS),
        pieces(all),
        (pieces(all), any::<u64>(), 0usize..60)
            .prop_map(|(p, seed, len)| p + &inputs::random_unicode_in(seed, len, true)),
        runs(),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn run(model: &str, cand: &str) {
    let Some(set) = set(model) else { return };
    let Some(ci) = set.names.iter().position(|n| *n == cand) else {
        eprintln!("{model}/{cand}: not in this build or does not load, skipped");
        return;
    };
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&any_input(), |text| {
        let want = set.cands[0].encode(&text);
        let got = set.cands[ci].encode(&text);
        if let Some(m) = tokbench::mismatch(&set.reference, &want, &got) {
            return Err(TestCaseError::fail(format!("{m}\n  input: {text:?}")));
        }
        // With the post-processor's specials (BOS for Llama 3.1), where offered.
        if let (Some(want), Some(got)) = (
            set.cands[0].encode_post(&text),
            set.cands[ci].encode_post(&text),
        ) {
            if let Some(m) = tokbench::mismatch(&set.reference, &want, &got) {
                return Err(TestCaseError::fail(format!(
                    "add_special_tokens: {m}\n  input: {text:?}"
                )));
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{model}/{cand} differs from hf-fancy: {e}");
    }
}

macro_rules! identity {
    ($($test:ident: $model:literal, $cand:literal;)*) => {$(
        #[test]
        fn $test() {
            run($model, $cand);
        }
    )*};
}

identity! {
    qwen3_hf_pieces: "qwen3", "hf-pieces";
    qwen3_hf_pieces_norm: "qwen3", "hf-pieces-norm";
    llama3_1_hf_pieces_norm: "llama3_1", "hf-pieces-norm";
    qwen3_fast_pieces: "qwen3", "fast-pieces";
    qwen3_fast_split: "qwen3", "fast-split";
    llama3_1_hf_pieces: "llama3_1", "hf-pieces";
    llama3_1_fast_pieces: "llama3_1", "fast-pieces";
    llama3_1_fast_split: "llama3_1", "fast-split";
    qwen3_hf_onig: "qwen3", "hf-onig";
    qwen3_fastokens: "qwen3", "fastokens";
    qwen3_hf1: "qwen3", "hf-1.0rc3";
    qwen3_tokie: "qwen3", "tokie";
    qwen3_kitoken: "qwen3", "kitoken";
    qwen3_splintr: "qwen3", "splintr";
    llama3_1_hf_onig: "llama3_1", "hf-onig";
    llama3_1_fastokens: "llama3_1", "fastokens";
    llama3_1_hf1: "llama3_1", "hf-1.0rc3";
    llama3_1_tokie: "llama3_1", "tokie";
    llama3_1_kitoken: "llama3_1", "kitoken";
    llama3_1_splintr: "llama3_1", "splintr";
}

fn big(model: &str) {
    let Some(set) = set(model) else { return };
    let corpus = Corpus::load();
    let f = set.family;
    let mut texts: Vec<(String, String)> = Vec::new();
    for s in 0..8 {
        texts.push((
            format!("64 KB chat prompt {s}"),
            inputs::chat_prompt(&corpus, f, 1000 + s, 65536),
        ));
    }
    for s in 0..2 {
        texts.push((
            format!("1 MB text {s}"),
            inputs::big_text(&corpus, 2000 + s, 1 << 20),
        ));
    }
    for s in 0..4 {
        texts.push((
            format!("64 KB random Unicode {s}"),
            inputs::random_unicode(3000 + s, 65536),
        ));
    }
    for s in 0..100 {
        texts.push((
            format!("1 KB prompt {s}"),
            inputs::short_prompt(&corpus, f, s),
        ));
    }
    let mut bad = Vec::new();
    for (label, text) in &texts {
        let want = set.cands[0].encode(text);
        for (ci, c) in set.cands.iter().enumerate().skip(1) {
            let got =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.encode(text))) {
                    Ok(g) => g,
                    Err(_) => {
                        bad.push(format!("{}: {label}: panicked", set.names[ci]));
                        continue;
                    }
                };
            if let Some(m) = tokbench::mismatch(&set.reference, &want, &got) {
                bad.push(format!("{}: {label}: {m}", set.names[ci]));
            }
            if label.starts_with("1 KB") {
                if let (Some(want), Some(got)) =
                    (set.cands[0].encode_post(text), c.encode_post(text))
                {
                    if let Some(m) = tokbench::mismatch(&set.reference, &want, &got) {
                        bad.push(format!(
                            "{}: {label}, add_special_tokens: {m}",
                            set.names[ci]
                        ));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{model}: {} mismatches of {} inputs:\n{}",
        bad.len(),
        texts.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen3_big_inputs() {
    big("qwen3");
}

#[test]
fn llama3_1_big_inputs() {
    big("llama3_1");
}
