//! Cross-check of the benchmark with the system allocator (no counting):
//! median CPU time of `--only`'s candidates (default all) on N new 64 KB
//! chat prompts, alternating. `plain [--model NAME] [N]`
use tokbench::inputs::{self, Corpus, Family};

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    tokbench::single_threaded();
    let (model, args) = tokbench::model_and_args();
    let n: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(15);
    let dir = tokbench::model_dir(&model);
    let corpus = Corpus::load();
    let f = Family::of(&dir);
    let cands: Vec<_> = tokbench::names()
        .into_iter()
        .filter_map(|nm| tokbench::load(nm, &dir).ok().map(|c| (nm, c)))
        .collect();
    for (_, c) in &cands {
        for s in 900..903 {
            c.encode(&inputs::chat_prompt(&corpus, f, s, 65536));
        }
    }
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); cands.len()];
    for r in 0..n {
        let text = inputs::chat_prompt(&corpus, f, 1000 + r, 65536);
        for (i, (_, c)) in cands.iter().enumerate() {
            let c0 = cpu_ns();
            drop(c.encode(&text));
            t[i].push((cpu_ns() - c0) as f64 / 1e6);
        }
    }
    for (i, (nm, _)) in cands.iter().enumerate() {
        t[i].sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{nm:10} median {:.3} ms CPU per 64 KB chat prompt (min {:.3})",
            t[i][t[i].len() / 2],
            t[i][0]
        );
    }
}
