//! First-call costs and per-thread memory: for each candidate (loaded alone,
//! in this order, in one process), the load, then the first and second
//! encode of a 1 KB prompt on the loading thread, then the same on three new
//! threads (per-thread caches and tables), each of which then encodes three
//! new 64 KB conversations before it ends. Memory as heap (counted by the
//! allocator) and RSS (which also sees tables mapped with mmap).
//! `firstcall [--model NAME]`; run under `taskset -c 1` like the benchmark.
use std::time::Instant;
use tokbench::alloc::live;
use tokbench::inputs::{self, Corpus, Family};

#[global_allocator]
static ALLOC: tokbench::alloc::Counting = tokbench::alloc::Counting;

fn rss() -> isize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<isize>().ok())
        .unwrap_or(0)
        * 4096
}

fn mib(b: isize) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

fn main() {
    tokbench::single_threaded();
    let (model, _) = tokbench::model_and_args();
    let dir = tokbench::model_dir(&model);
    let corpus = Corpus::load();
    let f = Family::of(&dir);
    let texts: Vec<String> = (0..8)
        .map(|s| inputs::short_prompt(&corpus, f, 777 + s))
        .collect();
    let convs: Vec<String> = (0..9)
        .map(|s| inputs::chat_prompt(&corpus, f, 7000 + s, 65536))
        .collect();
    println!("| candidate | load ms | heap / RSS after load (MiB) | main thread: 1st, 2nd encode (µs) | heap / RSS growth, main thread's 1st encodes (MiB) | new threads: 1st, 2nd encode (µs) | heap / RSS growth while a new thread lives, after 3×64 KB (MiB) | heap / RSS left after 3 threads ended (MiB) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for name in tokbench::names() {
        let (h0, r0) = (live(), rss());
        let t = Instant::now();
        let Ok(c) = tokbench::load(name, &dir) else {
            continue;
        };
        let load = t.elapsed().as_millis();
        let (h1, r1) = (live(), rss());
        let two = |a: &str, b: &str| {
            let t = Instant::now();
            drop(c.encode(a));
            let x = t.elapsed().as_micros();
            let t = Instant::now();
            drop(c.encode(b));
            (x, t.elapsed().as_micros())
        };
        let main = two(&texts[0], &texts[1]);
        let (h2, r2) = (live(), rss());
        let mut firsts = Vec::new();
        let mut grow = Vec::new();
        for k in 1..4 {
            let (hb, rb) = (live(), rss());
            let (r, g) = std::thread::scope(|s| {
                s.spawn(|| {
                    let r = two(&texts[2 * k], &texts[2 * k + 1]);
                    for t in &convs[3 * (k - 1)..3 * k] {
                        drop(c.encode(t));
                    }
                    (r, (live() - hb, rss() - rb))
                })
                .join()
                .unwrap()
            });
            firsts.push(format!("{}, {}", r.0, r.1));
            grow.push(format!("{} / {}", mib(g.0), mib(g.1)));
        }
        let (h3, r3) = (live(), rss());
        println!(
            "| {name} | {load} | {} / {} | {}, {} | {} / {} | {} | {} | {} / {} |",
            mib(h1 - h0),
            mib(r1 - r0),
            main.0,
            main.1,
            mib(h2 - h1),
            mib(r2 - r1),
            firsts.join("; "),
            grow.join("; "),
            mib(h3 - h2),
            mib(r3 - r2)
        );
    }
}
