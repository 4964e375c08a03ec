//! The tenants by name, bounded: listed tenants always have their own
//! budget, other names one each up to `max_tracked`, then a shared one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::{Spec, Tenant};

/// How many unlisted names get a budget (and a metric label) of their own.
pub const DEFAULT_MAX_TRACKED: usize = 100;

/// The budget and label shared by the unlisted names beyond `max_tracked`.
pub const OTHER: &str = "other";

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("tenant name `{OTHER}` is reserved for the unlisted names beyond max_tracked")]
pub struct ReservedName;

#[derive(Debug)]
pub struct Tenants {
    /// Fixed at start, so read without a lock.
    listed: HashMap<String, Arc<Tenant>>,
    /// Every unlisted name's, shared by replicas.
    unlisted: Spec,
    max_tracked: usize,
    /// Only grows, to `max_tracked`: written once per new name, else read.
    tracked: RwLock<HashMap<String, Arc<Tenant>>>,
    other: Arc<Tenant>,
    overflowed: AtomicBool,
}

/// A name resolved to its tenant.
#[derive(Debug)]
pub struct Lookup {
    pub tenant: Arc<Tenant>,
    /// True the first time an unlisted name found every tracked entry taken
    /// and was given [`OTHER`]: the caller logs it, once.
    pub first_overflow: bool,
}

impl Tenants {
    /// `listed`: each tenant's own weight and limits; `unlisted`: those of
    /// every other name (each tracked name, and [`OTHER`] as a whole). The
    /// limits are divided between `replicas` (at least 1, see
    /// [`super::Budget::shared_by`]).
    pub fn new(
        listed: HashMap<String, Spec>,
        unlisted: Spec,
        max_tracked: usize,
        replicas: usize,
    ) -> Result<Self, ReservedName> {
        if listed.contains_key(OTHER) {
            return Err(ReservedName);
        }
        let unlisted = Spec {
            limits: unlisted.limits.shared_by(replicas),
            ..unlisted
        };
        let listed = listed
            .into_iter()
            .map(|(name, spec)| {
                let tenant = Tenant::new(&name, spec.limits.shared_by(replicas), spec.weight);
                (name, tenant)
            })
            .collect();
        Ok(Tenants {
            listed,
            unlisted,
            max_tracked,
            tracked: RwLock::default(),
            other: Tenant::new(OTHER, unlisted.limits, unlisted.weight),
            overflowed: AtomicBool::new(false),
        })
    }

    /// The budget an authenticated `name` (a key's tenant, a JWT subject,
    /// a trusted header) counts against.
    pub fn get(&self, name: &str) -> Lookup {
        if let Some(tenant) = self.listed.get(name) {
            return found(tenant);
        }
        // An unlisted name that is the shared label shares its budget too.
        if name == OTHER {
            return found(&self.other);
        }
        // A poisoned map is still a consistent map: entries are only ever
        // inserted whole.
        let tracked = self.tracked.read().unwrap_or_else(|e| e.into_inner());
        if let Some(lookup) = self.tracked_or_full(&tracked, name) {
            return lookup;
        }
        drop(tracked);
        let mut tracked = self.tracked.write().unwrap_or_else(|e| e.into_inner());
        // Another request may have added the name, or filled the map,
        // between the two locks.
        if let Some(lookup) = self.tracked_or_full(&tracked, name) {
            return lookup;
        }
        let tenant = Tenant::new(name, self.unlisted.limits, self.unlisted.weight);
        tracked.insert(name.to_owned(), tenant.clone());
        found(&tenant)
    }

    /// The name's own entry, or [`OTHER`] if the map is full; None: there
    /// is room for it. The map never shrinks, so once full it is only read.
    fn tracked_or_full(
        &self,
        tracked: &HashMap<String, Arc<Tenant>>,
        name: &str,
    ) -> Option<Lookup> {
        if let Some(tenant) = tracked.get(name) {
            return Some(found(tenant));
        }
        (tracked.len() >= self.max_tracked).then(|| Lookup {
            tenant: self.other.clone(),
            first_overflow: !self.overflowed.swap(true, Ordering::Relaxed),
        })
    }
}

fn found(tenant: &Arc<Tenant>) -> Lookup {
    Lookup {
        tenant: tenant.clone(),
        first_overflow: false,
    }
}
