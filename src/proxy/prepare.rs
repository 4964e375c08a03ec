//! Preparing a request before a backend takes it: its body read, its
//! model (or its stored response's owner) found, its tenant's budgets
//! checked, what routing reads of it; then routed and admitted
//! (`admit.rs`), in one place for every kind of request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::HeaderValue;
use pingora::proxy::Session;

use super::ctx::{Phase, Routed};
use super::respond::{until_client_leaves, Stop};
use super::{admit, body_reader, headers, tenant, Gateway, RequestCtx};
use crate::accounting::Tracker;
use crate::admission::Demand;
use crate::api::{Api, BodyFormat};
use crate::body::{self, Prompt};
use crate::catalog::{Failed, Loaded, FAILED_LOAD_KEPT};
use crate::errors::ApiError;
use crate::pool::ModelPool;
use crate::routing::{chain, Routable};
use crate::tenants::Tenant;

/// The model a request names, found.
struct Resolved {
    pool: Arc<ModelPool>,
    /// Its body names an alias: renamed to the pool's model.
    renamed: bool,
    /// A learned name: the pool's backends that serve it.
    only: Option<Arc<[SocketAddr]>>,
}

impl Resolved {
    fn named(pool: Arc<ModelPool>) -> Self {
        Resolved {
            pool,
            renamed: false,
            only: None,
        }
    }
}

/// A request ready to be routed.
struct Prepared {
    pool: Arc<ModelPool>,
    input: Routable,
    body: Bytes,
    tracker: Option<Tracker>,
    held: tenant::Held,
    demand: Demand,
}

impl Gateway {
    /// Read the body, resolve the model, delay a warmup, take a slot.
    pub(super) async fn prepare(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        api: Api,
        tenant: &Arc<Tenant>,
    ) -> Result<(), Stop> {
        let req = session.req_header();
        let cache_key = headers::cache_key(req)?;
        let warmup = headers::is_warmup(req, api);
        let raw = body_reader::read_whole(session, self.config.max_request_body_bytes).await?;
        let described = api.describe();
        let facts = match described.body {
            BodyFormat::Json => body::inspect(&raw),
            BodyFormat::Multipart => {
                let content_type = session.req_header().headers.get(http::header::CONTENT_TYPE);
                body::inspect_multipart(content_type.map_or(&[][..], |v| v.as_bytes()), &raw)
            }
        }
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let resolved = match self.pool_for(ctx, &facts.model) {
            Err(ApiError::UnknownModel(_)) if self.catalog.loadable(&facts.model).is_some() => {
                let request = (cache_key.clone(), api, &facts.prompt);
                // Boxed: a load's state (a client session to the backend)
                // would otherwise enlarge every request's future, which
                // Pingora moves into a box of its own.
                let load = Box::pin(self.load_adapter(&facts.model, request));
                until_client_leaves(session, load).await??;
                self.pool_for(ctx, &facts.model)
            }
            resolved => resolved,
        };
        let Resolved {
            pool,
            renamed,
            only,
        } = resolved?;
        // A turn that continues a stored response goes where it is stored.
        let continues = (described.continues_stored)
            .then(|| {
                facts
                    .previous_response_id
                    .filter(|id| crate::api::valid_response_id(id))
            })
            .flatten()
            .map(|id| id.into_owned());
        let policy = pool.routing.policy();
        let rendered = match policy.renders() {
            Some(renderer) => {
                let block = policy.block_tokens() as usize;
                let tool_bytes = facts.prompt.tools.map_or(0, |t| t.get().len());
                let chain =
                    (self.renders).chain(renderer.clone(), api, raw.clone(), tool_bytes, block);
                Some(chain.await)
            }
            None => None,
        };
        let mut chain = policy.chain(api, &facts.prompt, rendered);
        if let Some(rendered) = chain.rendered {
            let result = rendered.map_or_else(|why| why.as_str(), |_| "rendered");
            crate::metrics::PROMPTS_RENDERED
                .with_label_values(&[&pool.name, result])
                .inc();
        }
        let mut input = pool.routing.input(cache_key, warmup, api, &facts.prompt);
        if let Some(only) = only {
            // Another model's or adapter's blocks of the pool never match.
            chain::namespace(&mut chain.links, &facts.model);
            input = input.with_only(only);
        }
        let input = input.with_stored(continues).with_chain(chain);
        let demand = Demand {
            prefill: (pool.routing).text_tokens(chain::prompt_bytes(api, &facts.prompt)),
            max_output: facts.max_output,
        };
        let held = self.serve(ctx, &pool, tenant)?;
        // A stream whose client did not ask for usage: ask for it, and hide
        // the extra chunk from the client.
        let add_usage = described.completion
            && self.config.stream_usage
            && facts.stream
            && !facts.stream_options;
        let tracker = described.dialect.map(|d| Tracker::new(d, add_usage));
        // The served name in place of an alias, then the usage asked for.
        let raw: Bytes = match renamed {
            true => body::with_model(&raw, facts.model_at, &pool.name, described.body).into(),
            false => raw,
        };
        let body: Bytes = if add_usage {
            body::with_stream_usage(&raw).into()
        } else {
            raw
        };
        if warmup {
            admit::warmup_delay(session, self.config.warmup.delay).await?;
        }
        let request = Prepared {
            pool,
            input,
            body,
            tracker,
            held,
            demand,
        };
        self.enter(session, ctx, request, tenant).await
    }

    /// The pool of the model a request names: a configured model's, a
    /// learned model's (its backends that list it), or an alias's.
    fn pool_for(&self, ctx: &mut RequestCtx, asked: &str) -> Result<Resolved, ApiError> {
        if let Some(pool) = self.pools.get(asked).filter(|p| !p.learned) {
            return Ok(Resolved::named(pool.clone()));
        }
        if let Some(served) = self.catalog.served(asked) {
            ctx.learned_model = Some(asked.into());
            return Ok(Resolved {
                pool: served.pool.clone(),
                renamed: false,
                only: Some(served.backends.clone()),
            });
        }
        let alias = (self.aliases.resolve(asked))
            .ok_or_else(|| ApiError::UnknownModel(asked.to_string()))?;
        crate::metrics::ALIAS_REQUESTS
            .with_label_values(&[alias.pattern, alias.served])
            .inc();
        ctx.asked_model = Some(asked.to_string());
        Ok(Resolved {
            renamed: true,
            ..Resolved::named(self.pools[alias.served].clone())
        })
    }

    /// Load adapter `name` (which a pool's adapter directory holds) on the
    /// backend routing picks for `request` (its key, API and prompt).
    async fn load_adapter(
        &self,
        name: &str,
        (cache_key, api, prompt): (Option<HeaderValue>, Api, &Prompt<'_>),
    ) -> Result<(), ApiError> {
        let Some((i, pool, path)) = self.catalog.loadable(name) else {
            return Err(ApiError::UnknownModel(name.to_string()));
        };
        let input = pool.routing.input(cache_key, false, api, prompt);
        let members = pool.members();
        let plan = (members.route(&pool.routing, &input, Instant::now())).map_err(|_| {
            ApiError::AdapterLoadFailed {
                message: format!("no backend to load adapter `{name}` on: every one is excluded"),
                retry_after: FAILED_LOAD_KEPT,
            }
        })?;
        let addr = plan.first().addr;
        let loaded = (self.loader)
            .load(&self.catalog, i, (addr, members.peer(addr)), name, &path)
            .await;
        // Counted once per load made, not per request that shared it.
        let made = match &loaded {
            Ok(Loaded::Now) => Some("loaded"),
            Err(failed) if failed.made => Some("failed"),
            Ok(Loaded::Already) | Err(_) => None,
        };
        if let Some(result) = made {
            let backend = members
                .series(&addr)
                .map_or(addr.to_string(), |s| s.label.clone());
            crate::metrics::ADAPTER_LOADS
                .with_label_values(&[&pool.name, &backend, result])
                .inc();
        }
        loaded.map(drop).map_err(adapter_load_failed)
    }

    /// The request is for `pool`: counted under its model from now on, and
    /// its tenant's budgets checked (429 at once when over one).
    fn serve(
        &self,
        ctx: &mut RequestCtx,
        pool: &Arc<ModelPool>,
        tenant: &Arc<Tenant>,
    ) -> Result<tenant::Held, ApiError> {
        ctx.phase = Phase::Unserved(pool.clone());
        ctx.tenant = Some(tenant.clone());
        self.hold(tenant)
    }

    /// A retrieve or cancel of stored response `id`: to the backend that
    /// stored it, whatever model that was, without a slot.
    pub(super) async fn prepare_stored(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        id: String,
        tenant: &Arc<Tenant>,
    ) -> Result<(), Stop> {
        let body = body_reader::read_whole(session, self.config.max_request_body_bytes).await?;
        let pools: Vec<&Arc<ModelPool>> = self.pools_in_order().collect();
        let pool = until_client_leaves(session, self.stored_owner(&id, &pools)).await??;
        let held = self.serve(ctx, &pool, tenant)?;
        let input = (pool
            .routing
            .input(None, false, Api::Stored, &Default::default()))
        .with_stored(Some(id));
        let request = Prepared {
            pool,
            input,
            body,
            tracker: None,
            held,
            demand: Demand::default(),
        };
        self.enter(session, ctx, request, tenant).await
    }

    /// Route the request and take a slot: from then on it is routed.
    async fn enter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        request: Prepared,
        tenant: &Arc<Tenant>,
    ) -> Result<(), Stop> {
        let Prepared {
            pool,
            input,
            body,
            tracker,
            held,
            demand,
        } = request;
        let attempt = (self.admit(session, &pool, &input, tenant.share(), demand)).await?;
        ctx.phase = Phase::Routed(Box::new(Routed {
            pool,
            input,
            body,
            tracker,
            held,
            demand,
            owner_noted: false,
            attempt,
        }));
        Ok(())
    }
}

fn adapter_load_failed(failed: Failed) -> ApiError {
    ApiError::AdapterLoadFailed {
        retry_after: failed.stands_for(),
        message: failed.message,
    }
}
