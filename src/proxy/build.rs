//! Building the gateway: a pool per model over what discovery found at
//! start, the metrics that read them, the stored-response lookup, the
//! tenants and the tracer; and the services that run beside it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::lb::HealthCheckService;

use super::{stored, Gateway};
use crate::aliases::Aliases;
use crate::auth::jwt::Verifier;
use crate::auth::Reason;
use crate::catalog::{Catalog, Learn, Loader};
use crate::config::{GatewayConfig, JwksSource};
use crate::discovery::{AtStart, Discovery};
use crate::metrics;
use crate::pool::{ModelPool, Refresh, Subscribe};
use crate::render::Workers;
use crate::routing::{owners, Owners};
use crate::tenants::Tenants;
use crate::tls;
use crate::trace::Traces;
use crate::upstream;

impl Gateway {
    /// The gateway over the backends resolved at start, and the
    /// health-check services to run beside it. `jwt` verifies tokens when
    /// `config.jwt` is set (its keys already loaded).
    pub fn new(
        config: GatewayConfig,
        jwt: Option<Verifier>,
        resolved: AtStart,
    ) -> (Self, Vec<(String, HealthCheckService)>) {
        let owners = Arc::new(Owners::new(
            owners::DEFAULT_MAX_ENTRIES,
            owners::DEFAULT_MAX_AGE,
        ));
        let (pools, services) = pools(&config, resolved, &owners);
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let readings = |read: fn(&ModelPool) -> metrics::Reading| {
            let pools = pools.values();
            pools.map(|p| (p.name.clone(), read(p))).collect()
        };
        metrics::register_exclusions(readings(ModelPool::exclusion_reading));
        metrics::register_slot_limits(readings(ModelPool::slot_limit_reading));
        let indexed = pools.values();
        let indexed = indexed.filter_map(|p| Some((p.name.clone(), p.prefix_index_reading()?)));
        metrics::register_prefix_index(indexed.collect());
        if config.api_keys.is_some() || jwt.is_some() {
            let fetched = config
                .jwt
                .as_ref()
                .is_some_and(|j| matches!(j.jwks, JwksSource::Url { .. }));
            metrics::init_auth(Reason::ALL.map(Reason::as_str), fetched);
        }
        // Its own connector: a question or two per unknown id needs no pool.
        let options = tls::trusting(ConnectorOptions::new(0), config.upstream_ca_file.as_deref());
        let lookup = stored::Lookup::new(
            Connector::new(Some(options)),
            config.upstream_api_key.as_deref(),
            config.stored_responses.lookup_timeout,
        );
        let t = &config.tenants;
        let listed = t.list.iter().cloned().collect();
        let tenants = Tenants::new(listed, t.defaults, t.max_tracked, config.replicas)
            .expect("the configuration refuses a tenant named `other`");
        let traces = config.tracing.clone().map(Traces::new);
        let aliases = Aliases::new(&config.models);
        let catalog = Arc::new(catalog(&config, &pools));
        let options = tls::trusting(ConnectorOptions::new(0), config.upstream_ca_file.as_deref());
        let loader = Loader::new(
            Connector::new(Some(options)),
            upstream::authorization(config.upstream_api_key.as_deref()),
            config.queue_timeout,
        );
        // Threads only where a model's events need its prompts' tokens.
        let r = config.render;
        let exact = pools
            .values()
            .any(|p| p.routing.policy().renders().is_some());
        let renders = Workers::start(
            if exact { r.threads } else { 0 },
            r.queue,
            r.max_prompt_bytes,
            r.inline_bytes,
        );
        let gateway = Gateway {
            renders,
            traces,
            config: Arc::new(config),
            pools,
            aliases,
            catalog,
            loader,
            jwt,
            owners,
            lookup,
            tenants,
            started,
        };
        (gateway, services)
    }

    /// Its request tracer, if tracing is on: to export what is left when
    /// the server has stopped.
    pub fn traces(&self) -> Option<Traces> {
        self.traces.clone()
    }

    /// The service that learns the models of the pools configured without
    /// a name, if any is.
    pub fn learn_service(&self) -> Option<Learn> {
        learn(
            &self.config,
            self.catalog.clone(),
            self.config.discovery.refresh,
        )
    }

    /// The service that subscribes to the backends' KV-cache events, if any
    /// model has `kv_events`.
    pub fn subscribe_service(&self) -> Option<Subscribe> {
        Subscribe::of(self.pools.values().cloned())
    }

    /// The service that re-resolves the models' DNS names, if any has one.
    pub fn refresh_service(&self) -> Option<Refresh> {
        let pools: Vec<Arc<ModelPool>> = self
            .config
            .models
            .iter()
            .filter(|m| m.uses_names())
            .map(|m| self.pools[&m.name].clone())
            .collect();
        (!pools.is_empty()).then(|| Refresh {
            pools,
            every: self.config.discovery.refresh,
        })
    }
}

/// The learned pools' model-list service alone, for `-t` (no proxy, tracer
/// or tenants): each backend's answer within `timeout`.
pub fn learn_check(config: &GatewayConfig, resolved: AtStart, timeout: Duration) -> Option<Learn> {
    let owners = Arc::new(Owners::new(1, owners::DEFAULT_MAX_AGE));
    let (pools, _) = pools(config, resolved, &owners);
    learn(config, Arc::new(catalog(config, &pools)), timeout)
}

/// The pools by model name.
type Pools = HashMap<String, Arc<ModelPool>>;

/// A pool per model over the backends resolved at start, and the
/// health-check services to run beside them.
fn pools(
    config: &GatewayConfig,
    resolved: AtStart,
    owners: &Arc<Owners>,
) -> (Pools, Vec<(String, HealthCheckService)>) {
    let mut services = Vec::new();
    let mut pools = HashMap::new();
    for (m, (_, entries)) in config.models.iter().zip(resolved.models) {
        let discovery = Discovery::new(&m.name, &config.discovery, entries);
        let (pool, health) = ModelPool::new(
            m,
            discovery,
            config.failure_exclusion,
            config.health_check.as_ref(),
            config.upstream_ca_file.as_deref(),
            owners.clone(),
            config.tenants.fairness,
        );
        services.extend(health.map(|h| (format!("health check {}", m.name), h)));
        pools.insert(m.name.clone(), Arc::new(pool));
    }
    (pools, services)
}

/// The learned pools, in configuration order, beside the configured names.
fn catalog(config: &GatewayConfig, pools: &Pools) -> Catalog {
    let learned = config.models.iter().filter(|m| m.learned);
    let learned = learned.map(|m| pools[&m.name].clone()).collect();
    let configured = config.models.iter().filter(|m| !m.learned);
    let configured = configured.map(|m| m.name.clone()).collect();
    let dirs = config.models.iter().filter(|m| m.learned);
    let dirs = dirs.map(|m| m.load_adapters_from.clone()).collect();
    Catalog::new(learned, configured).with_adapter_dirs(dirs)
}

/// The service that learns `catalog`'s pools' models, if it has any, each
/// answer within `every`.
fn learn(config: &GatewayConfig, catalog: Arc<Catalog>, every: Duration) -> Option<Learn> {
    let options = tls::trusting(ConnectorOptions::new(0), config.upstream_ca_file.as_deref());
    (!catalog.pools().is_empty()).then(|| Learn {
        catalog,
        connector: Arc::new(Connector::new(Some(options))),
        authorization: upstream::authorization(config.upstream_api_key.as_deref()),
        every,
    })
}
