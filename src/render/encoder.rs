//! A model's tokenizer.json as token ids: by fastokens where it loads the
//! tokenizer and gives the Hugging Face crate's ids for a set of probe
//! texts (about 70x faster on Qwen3's: 0.5 ms for a 64 KB chat, against
//! 38; bench/results/tokenizer.md), else by the Hugging Face crate, whose
//! ids vLLM's are. fastokens reads fewer kinds of tokenizer (BPE with the
//! common normalizers and pre-tokenizers); the probe catches a pattern it
//! runs otherwise than the reference.

use std::path::Path;

use fastokens::added_tokens::Segment;
use tokenizers::{OffsetReferential, OffsetType, Tokenizer};

pub(super) enum Encoder {
    Fast(Box<fastokens::Tokenizer>),
    Hf(Box<Tokenizer>),
}

/// A part of a text split at the tokenizer's added tokens.
pub(super) enum Piece<'t> {
    /// An added token's ids.
    Added(Vec<u32>),
    /// Text between added tokens, tokenized on its own.
    Text(std::borrow::Cow<'t, str>),
}

impl Encoder {
    /// The tokenizer of `dir/tokenizer.json`, and whether the text between
    /// its added tokens tokenizes the same wherever it stands (`pieces.rs`).
    pub fn load(dir: &Path) -> Result<(Encoder, bool), String> {
        let file = dir.join("tokenizer.json");
        let hf = Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let apart = super::pieces::splits_apart(&hf);
        let encoder = match fastokens::Tokenizer::from_file(&file) {
            Ok(fast) if agrees(&fast, &hf) => Encoder::Fast(Box::new(fast)),
            _ => Encoder::Hf(Box::new(hf)),
        };
        Ok((encoder, apart))
    }

    /// The ids of `text`, its added tokens recognised; with the tokenizer's
    /// special tokens added (a BOS) if `special`.
    pub fn encode(&self, text: &str, special: bool) -> Option<Vec<u32>> {
        match self {
            Encoder::Fast(t) => t.encode_with_special_tokens(text, special).ok(),
            Encoder::Hf(t) => Some(t.encode_fast(text, special).ok()?.get_ids().to_vec()),
        }
    }

    /// `text` split at its added tokens.
    pub fn split<'t>(&self, text: &'t str) -> Vec<Piece<'t>> {
        match self {
            Encoder::Fast(t) => match t.added_tokens() {
                Some(added) => (added.split(text).into_iter())
                    .map(|s| match s {
                        Segment::Token(id) => Piece::Added(vec![id]),
                        Segment::Text(p) => Piece::Text(p.into()),
                    })
                    .collect(),
                None => vec![Piece::Text(text.into())],
            },
            Encoder::Hf(t) => {
                let split =
                    (t.get_added_vocabulary()).extract_and_normalize(t.get_normalizer(), text);
                let splits = split.get_splits(OffsetReferential::Original, OffsetType::Byte);
                // A piece as normalized: its original offsets leave out a
                // mark the normalizer composed into its last character.
                (splits.into_iter())
                    .map(|(piece, _, added)| match added {
                        Some(tokens) => Piece::Added(tokens.iter().map(|t| t.id).collect()),
                        None => Piece::Text(piece.to_string().into()),
                    })
                    .collect()
            }
        }
    }

    /// The ids of text between added tokens.
    pub fn encode_piece(&self, piece: &str) -> Option<Vec<u32>> {
        match self {
            Encoder::Fast(t) => t.encode_ordinary(piece).ok(),
            Encoder::Hf(t) => Some(t.encode_fast(piece, false).ok()?.get_ids().to_vec()),
        }
    }
}

/// `t` read by each: the Hugging Face crate, and fastokens (from its
/// JSON).
#[cfg(test)]
pub(super) fn both(t: &Tokenizer) -> [Encoder; 2] {
    let json = serde_json::from_str(&t.to_string(false).unwrap()).unwrap();
    let fast = fastokens::Tokenizer::from_json(json).unwrap();
    [
        Encoder::Hf(Box::new(t.clone())),
        Encoder::Fast(Box::new(fast)),
    ]
}

/// Whether fastokens gives `hf`'s ids for the probe texts (and the texts
/// with the tokenizer's added tokens between them), with and without the
/// special tokens added. Its first encode also builds its tables, here
/// rather than in a request.
fn agrees(fast: &fastokens::Tokenizer, hf: &Tokenizer) -> bool {
    let added: Vec<String> = hf
        .get_added_tokens_decoder()
        .values()
        .map(|t| t.content.clone())
        .collect();
    let mut texts: Vec<String> = PROBES.iter().map(|p| p.to_string()).collect();
    for (i, token) in added.iter().enumerate() {
        let (a, b) = (PROBES[i % PROBES.len()], PROBES[(i + 1) % PROBES.len()]);
        texts.push(format!("{a}{token}{b}"));
    }
    texts.push(texts.concat());
    texts.iter().all(|text| {
        [false, true].into_iter().all(|special| {
            let want = hf
                .encode_fast(text.as_str(), special)
                .map(|e| e.get_ids().to_vec());
            let got = fast.encode_with_special_tokens(text, special);
            matches!((want, got), (Ok(w), Ok(g)) if w == g)
        })
    })
}

/// Texts that tell tokenizers apart: code, prose, numbers, whitespace
/// runs, contractions, scripts, emoji, marks NFC composes.
const PROBES: [&str; 16] = [
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n",
    "The quick brown fox jumps over the lazy dog. It's what they'd've said, we'll see.",
    "HELLO World 12345678901234567890 3.14159 -0.5e-10 0x1F",
    "   leading spaces\n\n\n  \t trailing   \n",
    "{\"type\": \"function\", \"function\": {\"name\": \"read\", \"parameters\": {}}}",
    "東京タワーは高い。北京欢迎你！서울은 아름답다.",
    "Crème brûlée, naïve café, Zürich, São Paulo, Ελληνικά, русский",
    "Cafe\u{301} e\u{301}te\u{301} A\u{30a} \u{1100}\u{1161}\u{11a8}",
    "emoji: 🦀🚀👩‍💻 🇫🇷 ✅ ❤️",
    "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
    "$ ls -la /tmp && grep -rn 'pattern' src/ | head -20",
    "مرحبا بالعالم हिन्दी ภาษาไทย",
    "a\r\nb\rc\u{b}d\u{c}e\u{a0}f\u{2028}g",
    "    def f(self, *args, **kwargs):\n        return None  # comment\n",
    "1,000,000 and 2'500 and ٣٤٥ and ①②③",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];
