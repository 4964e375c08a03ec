//! One request's life on the simulated GPU: wait for a batch slot, look up
//! the prefix cache, prefill, then decode one token per step.
//!
//! Cache lookup happens at admission (not arrival), as in vLLM, so two
//! identical requests that arrive together both miss. The prompt's blocks
//! are inserted when prefill ends. A `Job` holds its batch slot and KV
//! reservation until dropped, which is what frees them when a client
//! disconnects mid-request.
//!
//! Each step ends at a deadline the last one set, not a sleep from when
//! the last one woke: a timer's lateness (up to a millisecond a sleep)
//! would otherwise add up over the steps and make a token cost more than
//! `--decode-us-per-token`. A step that starts more than its own length
//! late (a stream's reader was slow) starts from now: it owes nothing.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::app::App;
use crate::batch::RunningGuard;
use crate::lora::Served;
use crate::shapes::Usage;
use crate::tokenize::{block_hashes, count_tokens};

#[derive(Debug)]
pub struct Job {
    app: Arc<App>,
    hashes: Vec<u64>,
    /// The prompt's bytes and adapter, kept only to publish KV events.
    for_events: Option<(Box<[u8]>, Option<String>)>,
    kv_reserved: usize,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
    /// When the step under way ends.
    due: Mutex<Instant>,
    _slot: RunningGuard,
}

/// Waits (FIFO) for a running slot, then queries the prefix cache for
/// `served`'s blocks of the prompt.
pub async fn admit(app: &Arc<App>, served: &Served, prompt: &str, output_tokens: usize) -> Job {
    let prompt_tokens = count_tokens(prompt);
    let hashes = block_hashes(served.kv_namespace, prompt, app.block_size);
    let slot = app.sched.admit().await;
    // As vLLM: the last token is computed whatever is cached, so a prompt
    // of exactly k blocks finds at most k - 1 of them.
    let servable = prompt_tokens.saturating_sub(1) / app.block_size;
    let hit_blocks =
        (app.cache.lock().expect("cache lock")).lookup(&hashes[..hashes.len().min(servable)]);
    let cached_tokens = hit_blocks * app.block_size;
    app.metrics.add_prefix_query(prompt_tokens, cached_tokens);
    // Reserve whole blocks for prompt + output, as the KV allocator would.
    let kv_reserved = (prompt_tokens + output_tokens).div_ceil(app.block_size) * app.block_size;
    app.kv_tokens_in_use
        .fetch_add(kv_reserved, Ordering::Relaxed);
    log::debug!(
        "admitted: prompt {prompt_tokens} tokens, {cached_tokens} cached, {output_tokens} out"
    );
    let for_events = app.kv_events.as_ref().map(|_| {
        // Only an adapter's chain is seeded (`Served`).
        let adapter = (served.kv_namespace != 0).then(|| served.name.clone());
        (prompt.as_bytes().into(), adapter)
    });
    Job {
        app: Arc::clone(app),
        hashes,
        for_events,
        kv_reserved,
        prompt_tokens,
        cached_tokens,
        output_tokens,
        due: Mutex::new(Instant::now()),
        _slot: slot,
    }
}

impl Job {
    /// Computes the uncached part of the prompt, then caches all its blocks.
    pub async fn prefill(&self) {
        let uncached = self.prompt_tokens - self.cached_tokens;
        let d = (self.app.timing).prefill(uncached, self.app.faults.delay_factor());
        self.step(d).await;
        {
            let mut cache = self.app.cache.lock().expect("cache lock");
            match (&self.app.kv_events, &self.for_events) {
                (Some(p), Some((prompt, lora))) => {
                    p.insert(&mut cache, &self.hashes, prompt, lora.as_deref())
                }
                _ => drop(cache.insert(&self.hashes)),
            }
        }
        // vLLM counts these when the first token comes out, i.e. after
        // prefill, not at admission like the prefix-cache counters.
        self.app
            .metrics
            .add_prefilled(self.prompt_tokens, self.cached_tokens);
    }

    /// Prefill, then every decode step: a whole non-streamed answer.
    pub async fn run_to_end(&self) {
        self.prefill().await;
        for _ in 0..self.output_tokens {
            self.decode_step().await;
        }
    }

    /// Prompt tokens written to the prefix cache by this request, as vLLM
    /// reports them (`PrefillStats.finalize`): the prompt's full blocks,
    /// cached once prefill is done, less the ones it hit.
    pub fn created_tokens(&self) -> usize {
        let full = self.prompt_tokens / self.app.block_size * self.app.block_size;
        full.saturating_sub(self.cached_tokens)
    }

    /// One decode step; its cost depends on how many requests run now.
    pub async fn decode_step(&self) {
        let d = self
            .app
            .timing
            .decode_step(self.app.sched.running(), self.app.faults.delay_factor());
        self.step(d).await;
    }

    /// Work for `d`, from the end of the last step (or from now, if that
    /// is more than `d` ago).
    async fn step(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let now = Instant::now();
        let due = {
            let mut due = self.due.lock().expect("due lock");
            if now.saturating_duration_since(*due) > d {
                *due = now;
            }
            *due += d;
            *due
        };
        tokio::time::sleep_until(due).await;
    }

    pub fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.output_tokens, self.cached_tokens)
    }

    /// Counts the request as successfully finished.
    pub fn succeed(self) {
        self.app.metrics.successes.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends a streamed request: a success if its stream ran to the end
    /// (dropping the job frees its slot either way).
    pub fn end_stream(self, finished: bool, id: &str) {
        if finished {
            self.succeed();
        } else {
            log::debug!("{id}: client went away mid-stream");
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.app
            .kv_tokens_in_use
            .fetch_sub(self.kv_reserved, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Args;
    use clap::Parser;

    #[tokio::test]
    async fn second_identical_request_hits_after_prefill() {
        let app = App::new(&Args::parse_from(["vllm-sim", "--time-scale", "0"]));
        let prompt = "p".repeat(40 * 4); // 40 tokens -> 2 full blocks
        let a = admit(&app, &app.base(), &prompt, 3).await;
        assert_eq!((a.prompt_tokens, a.cached_tokens), (40, 0));
        assert!(app.kv_cache_usage() > 0.0);
        a.prefill().await;
        assert_eq!(a.created_tokens(), 32);
        a.succeed();
        assert_eq!(app.kv_cache_usage(), 0.0);
        let b = admit(&app, &app.base(), &prompt, 3).await;
        assert_eq!(b.cached_tokens, 32);
        assert_eq!(b.created_tokens(), 0);
        assert_eq!(b.usage(), Usage::new(40, 3, 32));
        assert_eq!(app.metrics.cached_tokens.load(Ordering::Relaxed), 32);
        assert_eq!(app.metrics.prompt_tokens.load(Ordering::Relaxed), 80);
    }

    #[tokio::test]
    async fn the_block_of_a_prompts_last_token_is_computed_again() {
        let app = App::new(&Args::parse_from(["vllm-sim", "--time-scale", "0"]));
        let cached = |prompt: String| {
            let app = Arc::clone(&app);
            async move {
                let job = admit(&app, &app.base(), &prompt, 1).await;
                job.prefill().await;
                job.cached_tokens
            }
        };
        // 2 whole blocks of 16 tokens, sent twice: the second hits one, as
        // vLLM does; a token more and it hits both.
        let whole = "w".repeat(32 * 4);
        assert_eq!(cached(whole.clone()).await, 0);
        assert_eq!(cached(whole.clone()).await, 16);
        assert_eq!(cached(whole + "more").await, 32);
    }

    #[tokio::test]
    async fn blocks_of_one_adapter_never_hit_for_another() {
        let app = App::new(&Args::parse_from([
            "vllm-sim",
            "--time-scale",
            "0",
            "--lora-modules",
            "a=/p/a",
            "b=/p/b",
        ]));
        let (a, b) = (
            app.adapters.find("a").await.unwrap(),
            app.adapters.find("b").await.unwrap(),
        );
        let prompt = "p".repeat(33 * 4); // 2 full blocks and a token
        let cached = |served: Served| {
            let app = Arc::clone(&app);
            let prompt = prompt.clone();
            async move {
                let job = admit(&app, &served, &prompt, 1).await;
                job.prefill().await;
                job.cached_tokens
            }
        };
        assert_eq!(cached(a.clone()).await, 0);
        assert_eq!(cached(a.clone()).await, 32);
        assert_eq!(cached(b.clone()).await, 0);
        assert_eq!(cached(app.base()).await, 0);
        // Each now has its own copy of the prompt's blocks.
        assert_eq!((cached(b).await, cached(app.base()).await), (32, 32));
        assert_eq!(app.cache.lock().unwrap().len(), 6);
    }
}
