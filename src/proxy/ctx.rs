//! What one request has decided so far, typed by what is known when: a
//! local answer knows nothing, an unserved request its model, a routed one
//! its backend, slot, body and accounting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::tenant;
use crate::accounting::{Tracker, Usage};
use crate::admission::{Demand, Permit, Reported};
use crate::errors::ApiError;
use crate::pool::{Members, ModelPool};
use crate::routing::{Candidate, Routable};
use crate::tenants::Tenant;
use crate::trace::RequestSpan;

/// What one request has decided so far, carried across Pingora's phases.
/// Dropped by Pingora at the end of every request, which frees whatever it
/// still holds.
pub struct RequestCtx {
    pub(super) started: Instant,
    /// Known once the request is authenticated.
    pub(super) tenant: Option<Arc<Tenant>>,
    pub(super) phase: Phase,
    /// Time to the first response body byte.
    pub(super) first_byte: Option<Duration>,
    /// An error decided by the gateway, rendered by `fail_to_proxy`.
    pub(super) error: Option<ApiError>,
    /// Its span, when tracing is on and it is an API request. Boxed: Pingora
    /// keeps the context inline in every request's future, which it moves
    /// at each request of a connection.
    pub(super) trace: Option<Box<RequestSpan>>,
    /// The name the client asked for, when an alias of the served model.
    pub(super) asked_model: Option<String>,
    /// The learned model or adapter it asked for (its pool's name is a
    /// label).
    pub(super) learned_model: Option<Box<str>>,
}

/// How far a request got.
pub(super) enum Phase {
    /// Not routed: answered by the gateway itself, or refused before its
    /// model was known.
    Local,
    /// Its model is known, but no backend has it (refused, or the client
    /// left while it waited): counted under that model.
    Unserved(Arc<ModelPool>),
    /// A backend admitted it.
    Routed(Box<Routed>),
}

/// A request a backend admitted: what every later phase uses.
pub(super) struct Routed {
    pub(super) pool: Arc<ModelPool>,
    /// What routing reads of it, for a retry's routing and the log line.
    pub(super) input: Routable,
    /// The body read in `request_filter` (rewritten if the gateway added
    /// `stream_options`), emitted on every attempt.
    pub(super) body: Bytes,
    /// Usage accounting, for the APIs that report it.
    pub(super) tracker: Option<Tracker>,
    /// Its tenant's place in flight, until the response ends.
    pub(super) held: tenant::Held,
    /// What it asks of a backend that holds none of its prompt.
    pub(super) demand: Demand,
    /// The response's id was handed to routing (Responses API).
    pub(super) owner_noted: bool,
    pub(super) attempt: Attempt,
}

/// One try at one backend: where, why, and the slot it holds there.
pub(super) struct Attempt {
    /// The backend set it was routed in: it keeps the backend's state alive
    /// until the request ends, also when discovery removes the backend
    /// meanwhile.
    pub(super) members: Arc<Members>,
    pub(super) candidate: Candidate,
    /// Freed as soon as the backend is done with the request.
    pub(super) permit: Option<Permit>,
    /// Its backend failed: the next attempt goes elsewhere.
    pub(super) failed: bool,
    /// Time in the admission queue, this attempt's and its predecessors'.
    pub(super) queued: Duration,
    pub(super) response_started: bool,
    /// The prompt tokens the prefix index expected its backend to hold;
    /// `None` without an index.
    pub(super) expected_tokens: Option<u64>,
}

impl Routed {
    /// A response body chunk: accounted, and a stored response's id, once
    /// seen, tells routing where it is stored.
    pub(super) fn on_body(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        let Some(tracker) = &mut self.tracker else {
            return;
        };
        tracker.on_body(body, end_of_stream);
        if !self.owner_noted {
            if let Some(id) = tracker.response_id() {
                self.owner_noted = true;
                let addr = self.attempt.candidate.addr;
                self.pool.routing.owner_found(id, addr, Instant::now());
            }
        }
    }

    /// The backend is done with this request: free its slot, settling its
    /// fair share's charge by what the backend reported, and its tenant's
    /// place in flight, charging the tokens it used. Later calls do
    /// nothing.
    pub(super) fn end(&mut self) {
        let usage = self.usage();
        if let Some(permit) = self.attempt.permit.take() {
            let reported = Reported {
                prefill: usage
                    .prompt_tokens
                    .zip(usage.cached_tokens)
                    .map(|(p, c)| p.saturating_sub(c)),
                output: usage.completion_tokens,
            };
            let service = permit.finish(reported);
            self.held
                .tenant()
                .series()
                .service()
                .inc_by(service.round() as u64);
        }
        self.held.end(usage);
    }

    /// What the backend reported of its tokens, as far as it got.
    pub(super) fn usage(&self) -> Usage {
        self.tracker
            .as_ref()
            .map(Tracker::usage)
            .unwrap_or_default()
    }
}

impl RequestCtx {
    /// The model it is served as, for its metrics and logs: `pool`'s, or
    /// the learned name it asked for.
    pub(super) fn model<'a>(&'a self, pool: &'a ModelPool) -> &'a str {
        self.learned_model.as_deref().unwrap_or(&pool.name)
    }

    pub(super) fn routed(&self) -> Option<&Routed> {
        match &self.phase {
            Phase::Routed(r) => Some(r),
            _ => None,
        }
    }

    pub(super) fn routed_mut(&mut self) -> Option<&mut Routed> {
        match &mut self.phase {
            Phase::Routed(r) => Some(r),
            _ => None,
        }
    }

    pub(super) fn response_started(&self) -> bool {
        self.routed().is_some_and(|r| r.attempt.response_started)
    }

    /// The backend is done with this request (see [`Routed::end`]).
    pub(super) fn end(&mut self) {
        if let Some(r) = self.routed_mut() {
            r.end();
        }
    }
}
