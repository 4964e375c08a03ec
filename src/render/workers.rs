//! Rendering and tokenizing off the proxy's threads. A Pingora worker
//! thread runs many connections; a prompt tokenized on it (a new 64 KB
//! conversation takes milliseconds) would hold every other one. A few
//! threads of their own take prompts from a bounded queue instead, and a
//! request awaits its own prompt only. When the queue is full, or a body
//! is larger than a set size, the request is routed by the estimate of its
//! text at once ([`Unrendered::Busy`], [`Unrendered::TooLong`]): nothing
//! waits without bound.
//!
//! A conversation's next turn is mostly text tokenized before: rendering it
//! and looking its pieces up is cheap (tens of microseconds for a small
//! one) next to waiting for a render thread busy with someone's new long
//! prompt, and to the two thread wake-ups of the hand-off. So a body whose
//! messages are small (`render.inline_bytes`, its tool list aside: kept
//! converted, `tools.rs`) and messages few ([`INLINE_MESSAGES`]) is
//! rendered on the proxy's thread, and its new text tokenized there too
//! when it is short ([`INLINE_NEW_BYTES`]); more new text goes to the
//! render threads, and so does a tool list not converted before.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{Rendered, Renderer, Unrendered};
use crate::api::Api;

type Job = Box<dyn FnOnce() + Send>;

/// New text tokenized on the proxy's thread at most: about 60 us of
/// Qwen3's tokenizer (bench/results/tokenizer.md).
pub const INLINE_NEW_BYTES: usize = 4096;

/// Messages rendered on the proxy's thread at most: a template's work
/// grows with them (Qwen3's loops over them twice), and a small body can
/// hold a thousand tiny ones.
pub const INLINE_MESSAGES: usize = 128;

pub struct Workers {
    jobs: SyncSender<Job>,
    max_bytes: usize,
    inline_bytes: usize,
}

/// Every thread and queue place is taken.
#[derive(Debug, PartialEq, Eq)]
pub struct Busy;

impl Workers {
    /// `threads` threads, at most `queue` jobs waiting for them, bodies of
    /// at most `max_bytes` rendered, those of at most `inline_bytes` (their
    /// tool list aside) on the caller's thread. Without threads, every job
    /// is refused.
    pub fn start(threads: usize, queue: usize, max_bytes: usize, inline_bytes: usize) -> Workers {
        let queue = if threads == 0 { 0 } else { queue };
        let (jobs, waiting) = sync_channel::<Job>(queue);
        let waiting = Arc::new(Mutex::new(waiting));
        for i in 0..threads {
            let waiting = waiting.clone();
            std::thread::Builder::new()
                .name(format!("poimen-render-{i}"))
                .spawn(move || work(&waiting))
                .expect("a render thread starts");
        }
        Workers {
            jobs,
            max_bytes,
            inline_bytes,
        }
    }

    /// The prompt of a request of `api` with `body` (`tool_bytes` of it its
    /// tool list) as the chain of its token ids, `block` of them a link:
    /// linked here too, a thousand links for a new 64 KB prompt that the
    /// proxy's thread need not make.
    pub async fn chain(
        &self,
        renderer: Arc<Renderer>,
        api: Api,
        body: Bytes,
        tool_bytes: usize,
        block: usize,
    ) -> Result<Rendered, Unrendered> {
        if body.len() > self.max_bytes {
            return Err(Unrendered::TooLong);
        }
        let done = if body.len().saturating_sub(tool_bytes) <= self.inline_bytes {
            let prepared = guarded(|| renderer.prepare(api, &body, INLINE_MESSAGES))?;
            if prepared.new_bytes().is_some_and(|n| n <= INLINE_NEW_BYTES) {
                return guarded(|| renderer.finish(prepared, block));
            }
            self.run(move || renderer.finish(prepared, block))
        } else {
            self.run(move || renderer.chain(api, &body, block))
        };
        // A render that panicked drops its sender.
        done.map_err(|Busy| Unrendered::Busy)?
            .await
            .unwrap_or(Err(Unrendered::Failed))
    }

    /// Run `f` on a thread of the pool, if one is free or a queue place is.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<oneshot::Receiver<T>, Busy> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            if let Ok(value) = catch_unwind(AssertUnwindSafe(f)) {
                let _ = done.send(value);
            }
        });
        self.jobs.try_send(job).map_err(|_| Busy)?;
        Ok(result)
    }
}

/// `f`'s result; a panic (a template's bug) fails this render only.
fn guarded<T>(f: impl FnOnce() -> Result<T, Unrendered>) -> Result<T, Unrendered> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(Unrendered::Failed))
}

/// Take jobs until the pool is dropped. One thread at a time waits on the
/// queue (holding the lock); the others wait for the lock.
fn work(waiting: &Mutex<Receiver<Job>>) {
    loop {
        let job = match waiting.lock().map(|queue| queue.recv()) {
            Ok(Ok(job)) => job,
            _ => return,
        };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[tokio::test]
    async fn a_full_pool_refuses_at_once_and_takes_work_again_when_free() {
        let pool = Workers::start(1, 1, 1 << 20, 0);
        let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (s, r) = (started.clone(), release.clone());
        let running = pool
            .run(move || {
                s.wait();
                r.wait();
                1
            })
            .unwrap();
        started.wait();
        // The thread is busy: one job may wait, the next is refused.
        let queued = pool.run(|| 2).unwrap();
        assert_eq!(pool.run(|| 3).err(), Some(Busy));
        release.wait();
        assert_eq!(running.await, Ok(1));
        assert_eq!(queued.await, Ok(2));
        assert_eq!(pool.run(|| 4).unwrap().await, Ok(4));
    }

    #[tokio::test]
    async fn a_panic_fails_its_own_job_only() {
        let pool = Workers::start(1, 1, 1 << 20, 0);
        let panicked = pool.run(|| -> u32 { panic!("a template bug") });
        assert!(panicked.unwrap().await.is_err());
        let mut next = pool.run(|| 5);
        // The thread may still be unwinding: wait for it to take work.
        while next.is_err() {
            tokio::task::yield_now().await;
            next = pool.run(|| 5);
        }
        assert_eq!(next.unwrap().await, Ok(5));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_not_rendered() {
        let pool = Workers::start(1, 1, 8, 0);
        let renderer = Arc::new(super::super::tests::byte_model());
        let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"hi"}]}"#);
        let chain = pool
            .chain(renderer, Api::ChatCompletions, body, 0, 16)
            .await;
        assert_eq!(chain, Err(Unrendered::TooLong));
    }

    /// A pool whose one thread is held until the barrier is passed twice,
    /// with no queue place: any job sent to it now is refused.
    fn saturated(inline_bytes: usize) -> (Workers, Arc<Barrier>) {
        let pool = Workers::start(1, 0, 1 << 20, inline_bytes);
        let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (s, r) = (started.clone(), release.clone());
        pool.jobs
            .send(Box::new(move || {
                s.wait();
                r.wait();
            }))
            .unwrap();
        started.wait();
        (pool, release)
    }

    fn chat(content: &str) -> Bytes {
        let content = serde_json::to_string(content).unwrap();
        Bytes::from(format!(
            r#"{{"messages":[{{"role":"user","content":{content}}}]}}"#
        ))
    }

    #[tokio::test]
    async fn a_small_prompt_is_rendered_on_the_callers_thread_whatever_the_pool_does() {
        let renderer = Arc::new(super::super::tests::byte_model());
        let (pool, release) = saturated(1 << 10);
        let body = chat("hi there");
        let want = renderer.chain(Api::ChatCompletions, &body, 16);
        assert!(want.is_ok());
        let got = pool.chain(renderer.clone(), Api::ChatCompletions, body.clone(), 0, 16);
        assert_eq!(got.await, want);
        // Its tool list aside: a body of 2 KiB with 1.5 KiB of tools.
        let got = pool.chain(
            renderer.clone(),
            Api::ChatCompletions,
            body.clone(),
            1536,
            16,
        );
        assert_eq!(got.await, want);
        release.wait();
        // Inline rendering off: the pool's.
        let (pool, release) = saturated(0);
        let got = pool.chain(renderer, Api::ChatCompletions, body, 0, 16);
        assert_eq!(got.await, Err(Unrendered::Busy));
        release.wait();
    }

    #[tokio::test]
    async fn a_small_body_with_much_new_text_is_tokenized_by_the_pool() {
        let renderer = Arc::new(super::super::tests::byte_model());
        let body = chat(&"new text ".repeat(INLINE_NEW_BYTES / 8));
        let (pool, release) = saturated(1 << 20);
        let got = pool.chain(renderer.clone(), Api::ChatCompletions, body.clone(), 0, 16);
        assert_eq!(got.await, Err(Unrendered::Busy));
        release.wait();
        let pool = Workers::start(1, 1, 1 << 20, 1 << 20);
        let got = pool.chain(renderer.clone(), Api::ChatCompletions, body.clone(), 0, 16);
        assert_eq!(got.await, renderer.chain(Api::ChatCompletions, &body, 16));
    }

    #[tokio::test]
    async fn a_tool_list_not_converted_before_is_converted_by_the_pool() {
        let renderer = Arc::new(super::super::tests::byte_model());
        let tools = r#"[{"type":"function","function":{"name":"read","parameters":{}}}]"#;
        let body = Bytes::from(format!(
            r#"{{"tools":{tools},"messages":[{{"role":"user","content":"q"}}]}}"#
        ));
        // A Messages request whose blocks change its tools: the list they
        // make is kept by the changes too.
        let changed = |added: &str| {
            Bytes::from(format!(
                r#"{{"tools":[{{"name":"read","input_schema":{{}},"defer_loading":true}}],
                "messages":[{{"role":"user","content":[{{"type":"{added}",
                    "tool":{{"type":"tool_reference","name":"read"}}}},{{"type":"text","text":"q"}}]}}]}}"#
            ))
        };
        let requests = [
            (Api::ChatCompletions, body, tools.len()),
            (Api::Messages, changed("tool_addition"), 0),
            (Api::Messages, changed("tool_removal"), 0),
        ];
        for (api, body, tool_bytes) in requests {
            let (pool, release) = saturated(1 << 20);
            let got = pool.chain(renderer.clone(), api, body.clone(), tool_bytes, 16);
            assert_eq!(got.await, Err(Unrendered::Busy));
            release.wait();
            // Converted once (by the pool) and kept: then rendered where it is.
            let want = renderer.chain(api, &body, 16);
            assert!(want.is_ok());
            let (pool, release) = saturated(1 << 20);
            let got = pool.chain(renderer.clone(), api, body, tool_bytes, 16);
            assert_eq!(got.await, want);
            release.wait();
        }
    }

    #[tokio::test]
    async fn a_small_body_of_many_messages_is_rendered_by_the_pool() {
        let renderer = Arc::new(super::super::tests::byte_model());
        let message = r#"{"role":"user","content":"hi"}"#;
        let messages = vec![message; INLINE_MESSAGES + 1].join(",");
        let body = Bytes::from(format!(r#"{{"messages":[{messages}]}}"#));
        assert!(body.len() < 8 << 10);
        let (pool, release) = saturated(1 << 20);
        let got = pool.chain(renderer.clone(), Api::ChatCompletions, body.clone(), 0, 16);
        assert_eq!(got.await, Err(Unrendered::Busy));
        release.wait();
    }
}
