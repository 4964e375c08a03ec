//! The tokenizers compared (each behind one small trait) and the inputs they
//! are compared on. The benchmark is src/main.rs; the identity property test
//! is tests/identity.rs.

use std::path::{Path, PathBuf};

pub mod inputs;

/// A global allocator that counts live heap bytes; a binary opts in with
/// `#[global_allocator] static A: tokbench::alloc::Counting = tokbench::alloc::Counting;`.
pub mod alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

    /// Counts live heap bytes while `ON` (and their peak while `PEAK_ON`):
    /// off while timing, where the atomic counts would tax the candidates
    /// that allocate most. A delta of `live()` over a window where it is on
    /// is what was allocated in the window and is still held, less what
    /// was freed in the window of what came before it.
    pub struct Counting;
    pub static ON: AtomicBool = AtomicBool::new(true);
    static LIVE: AtomicIsize = AtomicIsize::new(0);
    pub static PEAK: AtomicIsize = AtomicIsize::new(0);
    pub static PEAK_ON: AtomicBool = AtomicBool::new(false);

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let p = System.alloc(l);
            if !p.is_null() {
                grew(l.size() as isize);
            }
            p
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            let p = System.alloc_zeroed(l);
            if !p.is_null() {
                grew(l.size() as isize);
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            System.dealloc(p, l);
            if ON.load(Relaxed) {
                LIVE.fetch_sub(l.size() as isize, Relaxed);
            }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            let q = System.realloc(p, l, new);
            if !q.is_null() {
                grew(new as isize - l.size() as isize);
            }
            q
        }
    }

    #[inline]
    fn grew(by: isize) {
        if !ON.load(Relaxed) {
            return;
        }
        let now = LIVE.fetch_add(by, Relaxed) + by;
        if PEAK_ON.load(Relaxed) {
            PEAK.fetch_max(now, Relaxed);
        }
    }

    pub fn live() -> isize {
        LIVE.load(Relaxed)
    }
}

/// One implementation: the ids of `text`, added tokens in it recognised (as
/// the gateway's `encode_fast(text, false)`: no BOS/EOS added by a
/// post-processor).
pub trait Candidate: Send + Sync {
    fn encode(&self, text: &str) -> Vec<u32>;
    /// With the post-processor's special tokens (`encode_fast(text, true)`,
    /// the gateway's call for a completion's text prompt), where offered.
    fn encode_post(&self, _text: &str) -> Option<Vec<u32>> {
        None
    }
}

/// The candidates this build has, reference first.
pub fn names() -> Vec<&'static str> {
    let mut v = vec!["hf-fancy", "hf-pieces", "hf-pieces-norm"];
    if cfg!(feature = "onig") {
        v.push("hf-onig");
    }
    if cfg!(feature = "fastokens") {
        v.push("fastokens");
        v.push("fast-pieces");
        v.push("fast-split");
    }
    if cfg!(feature = "hf1") {
        v.push("hf-1.0rc3");
    }
    if cfg!(feature = "tokie") {
        v.push("tokie");
    }
    if cfg!(feature = "kitoken") {
        v.push("kitoken");
    }
    if cfg!(feature = "splintr") {
        v.push("splintr");
    }
    v
}

/// `models/<name>` beside this crate (setup.sh fills it), or `TOKBENCH_MODELS`.
pub fn model_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("TOKBENCH_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"));
    root.join(name)
}

/// The command line's arguments, and the model a leading `--model NAME`
/// names (default `qwen3`) taken out of them.
pub fn model_and_args() -> (String, Vec<String>) {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut model = "qwen3".to_string();
    if args.first().map(String::as_str) == Some("--model") && args.len() > 1 {
        model = args[1].clone();
        args.drain(..2);
    }
    (model, args)
}

/// Threads: every candidate single-threaded, whatever it would do alone
/// (fastokens and tokie fan a long input out over all cores by default).
/// To be called first thing, before any candidate is loaded.
pub fn single_threaded() {
    std::env::set_var("FASTOKENS_BPE_THREADS", "1");
    std::env::set_var("RAYON_NUM_THREADS", "1");
    std::env::set_var("RAYON_RS_NUM_THREADS", "1");
    std::env::set_var("TOKENIZERS_PARALLELISM", "false");
}

/// Load candidate `name` from `dir/tokenizer.json`.
pub fn load(name: &str, dir: &Path) -> Result<Box<dyn Candidate>, String> {
    let path = dir.join("tokenizer.json");
    match name {
        "hf-fancy" => Ok(Box::new(HfFancy(
            tokenizers::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        "hf-pieces" => Ok(Box::new(HfPieces(
            tokenizers::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        "hf-pieces-norm" => Ok(Box::new(HfPiecesNorm(
            tokenizers::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "fastokens")]
        "fast-pieces" => Ok(Box::new(FastPieces {
            hf: tokenizers::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
            fast: fastokens::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        })),
        #[cfg(feature = "fastokens")]
        "fast-split" => Ok(Box::new(FastSplit(
            fastokens::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "onig")]
        "hf-onig" => Ok(Box::new(HfOnig(
            tokenizers_onig::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "fastokens")]
        "fastokens" => Ok(Box::new(Fastokens(
            fastokens::Tokenizer::from_file(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "hf1")]
        "hf-1.0rc3" => {
            // A tokenizer.json of format 1.0 (all of the Hub's) must first be
            // rewritten to the 2.0 form the reader takes.
            let canonical = tokenizers1::canonicalize_file(&path).map_err(|e| e.to_string())?;
            Ok(Box::new(Hf1(
                tokenizers1::from_json(&canonical).map_err(|e| e.to_string())?
            )))
        }
        #[cfg(feature = "tokie")]
        "tokie" => Ok(Box::new(Tokie(
            tokie::Tokenizer::from_json(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "kitoken")]
        "kitoken" => Ok(Box::new(Kitoken(
            kitoken::Kitoken::from_tokenizers_file(&path).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "splintr")]
        "splintr" => Ok(Box::new(Splintr(
            splintr::from_json_path(&path).map_err(|e| e.to_string())?,
        ))),
        _ => Err(format!("{name}: not in this build")),
    }
}

/// (a) The gateway's: tokenizers 0.23 with fancy-regex.
pub struct HfFancy(pub tokenizers::Tokenizer);

impl Candidate for HfFancy {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0
            .encode_fast(text, false)
            .expect("hf-fancy encode")
            .get_ids()
            .to_vec()
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        Some(
            self.0
                .encode_fast(text, true)
                .expect("hf-fancy encode")
                .get_ids()
                .to_vec(),
        )
    }
}

/// (a') The gateway's path for a new conversation (src/render/pieces.rs,
/// without its store): the text split at added tokens by
/// `extract_and_normalize`, each piece by `encode_fast`.
pub struct HfPieces(pub tokenizers::Tokenizer);

impl Candidate for HfPieces {
    fn encode(&self, text: &str) -> Vec<u32> {
        use tokenizers::{OffsetReferential, OffsetType};
        let t = &self.0;
        let split = t
            .get_added_vocabulary()
            .extract_and_normalize(t.get_normalizer(), text);
        let mut ids = Vec::new();
        for (_, (start, end), added) in
            split.get_splits(OffsetReferential::Original, OffsetType::Byte)
        {
            match added {
                Some(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                None => ids
                    .extend_from_slice(t.encode_fast(&text[start..end], false).unwrap().get_ids()),
            }
        }
        ids
    }
}

/// (a'') As `HfPieces`, but each piece taken as its normalized text (the
/// `&str` of `get_splits`), not as the original text between the original
/// offsets: those offsets lose a combining mark that NFC composed into the
/// piece's last character ("Cafe\u{301}<|im_end|>" gives the piece "Cafe").
pub struct HfPiecesNorm(pub tokenizers::Tokenizer);

impl Candidate for HfPiecesNorm {
    fn encode(&self, text: &str) -> Vec<u32> {
        use tokenizers::{OffsetReferential, OffsetType};
        let t = &self.0;
        let split = t
            .get_added_vocabulary()
            .extract_and_normalize(t.get_normalizer(), text);
        let mut ids = Vec::new();
        for (piece, _, added) in split.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            match added {
                Some(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                None => ids.extend_from_slice(t.encode_fast(piece, false).unwrap().get_ids()),
            }
        }
        ids
    }
}

/// The gateway's path with fastokens for the pieces: split by the Hugging
/// Face crate as now, each piece by `fastokens::Tokenizer::encode_ordinary`.
#[cfg(feature = "fastokens")]
pub struct FastPieces {
    pub hf: tokenizers::Tokenizer,
    pub fast: fastokens::Tokenizer,
}

#[cfg(feature = "fastokens")]
impl Candidate for FastPieces {
    fn encode(&self, text: &str) -> Vec<u32> {
        use tokenizers::{OffsetReferential, OffsetType};
        let t = &self.hf;
        let split = t
            .get_added_vocabulary()
            .extract_and_normalize(t.get_normalizer(), text);
        let mut ids = Vec::new();
        for (_, (start, end), added) in
            split.get_splits(OffsetReferential::Original, OffsetType::Byte)
        {
            match added {
                Some(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                None => ids.extend(self.fast.encode_ordinary(&text[start..end]).unwrap()),
            }
        }
        ids
    }
}

/// All fastokens, split kept apart: `added_tokens().split(text)` (exact where
/// no added token is `normalized`, as in Qwen3's and Llama 3.1's), each
/// piece by `encode_ordinary`.
#[cfg(feature = "fastokens")]
pub struct FastSplit(pub fastokens::Tokenizer);

#[cfg(feature = "fastokens")]
impl Candidate for FastSplit {
    fn encode(&self, text: &str) -> Vec<u32> {
        use fastokens::added_tokens::Segment;
        let Some(added) = self.0.added_tokens() else {
            return self.0.encode_ordinary(text).unwrap();
        };
        let mut ids = Vec::new();
        for seg in added.split(text) {
            match seg {
                Segment::Token(id) => ids.push(id),
                Segment::Text(piece) => ids.extend(self.0.encode_ordinary(piece).unwrap()),
            }
        }
        ids
    }
}

/// (b) tokenizers 0.23 with onig.
#[cfg(feature = "onig")]
pub struct HfOnig(pub tokenizers_onig::Tokenizer);

#[cfg(feature = "onig")]
impl Candidate for HfOnig {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0
            .encode_fast(text, false)
            .expect("hf-onig encode")
            .get_ids()
            .to_vec()
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        Some(
            self.0
                .encode_fast(text, true)
                .expect("hf-onig encode")
                .get_ids()
                .to_vec(),
        )
    }
}

/// (c) fastokens: `encode` = added tokens recognised, no post-processor.
#[cfg(feature = "fastokens")]
pub struct Fastokens(pub fastokens::Tokenizer);

#[cfg(feature = "fastokens")]
impl Candidate for Fastokens {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode(text).expect("fastokens encode")
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        Some(
            self.0
                .encode_with_special_tokens(text, true)
                .expect("fastokens encode"),
        )
    }
}

/// (d) tokenizers 1.0.0-rc.3, `encode_into` with no post-processor specials.
#[cfg(feature = "hf1")]
pub struct Hf1(pub tokenizers1::pipeline::PipelineTokenizer);

#[cfg(feature = "hf1")]
impl Candidate for Hf1 {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.0
            .encode_into(
                text,
                &tokenizers1::pipeline::encode_options::EncodeOptions::no_specials(),
                &mut out,
            )
            .expect("hf1 encode");
        tokenizers1::pipeline::PipelineToken::cast_slice(&out).to_vec()
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        let options = tokenizers1::pipeline::encode_options::EncodeOptions::default();
        self.0
            .encode_into(text, &options, &mut out)
            .expect("hf1 encode");
        Some(tokenizers1::pipeline::PipelineToken::cast_slice(&out).to_vec())
    }
}

/// (d) tokie.
#[cfg(feature = "tokie")]
pub struct Tokie(pub tokie::Tokenizer);

#[cfg(feature = "tokie")]
impl Candidate for Tokie {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode_ids(text, false)
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        Some(self.0.encode_ids(text, true))
    }
}

/// (d) kitoken: `true` = special tokens in the text recognised.
#[cfg(feature = "kitoken")]
pub struct Kitoken(pub kitoken::Kitoken);

#[cfg(feature = "kitoken")]
impl Candidate for Kitoken {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode(text, true).expect("kitoken encode")
    }
}

/// (d) splintr: `encode_raw` = added tokens recognised, no post-processor.
#[cfg(feature = "splintr")]
pub struct Splintr(pub splintr::AnyTokenizer);

#[cfg(feature = "splintr")]
impl Candidate for Splintr {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode_raw(text)
    }
    fn encode_post(&self, text: &str) -> Option<Vec<u32>> {
        Some(self.0.encode(text))
    }
}

/// Where `got` first differs from `want`, told with the tokens around it
/// (decoded by the reference), or `None` when identical.
pub fn mismatch(reference: &tokenizers::Tokenizer, want: &[u32], got: &[u32]) -> Option<String> {
    if want == got {
        return None;
    }
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let show = |ids: &[u32]| -> String {
        let end = (at + 6).min(ids.len());
        ids[at.saturating_sub(3)..end]
            .iter()
            .map(|&id| {
                let t = reference
                    .decode(&[id], false)
                    .unwrap_or_else(|_| "?".into());
                format!("{id}:{t:?}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    Some(format!(
        "{} ids vs {} (reference); first difference at id {at}: got [{}] want [{}]",
        got.len(),
        want.len(),
        show(got),
        show(want)
    ))
}
