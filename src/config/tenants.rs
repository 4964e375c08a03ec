//! `tenants`: who shares the GPUs, with what weight and what budgets. A
//! tenant is named by its credential (an API key's name, a JWT claim) or,
//! without authentication, by a header a proxy in front sets.

use serde::Deserialize;

use crate::admission::Fairness;
use crate::field::{invalid, Bound, Invalid};
use crate::tenants::{Budget, Spec};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TenantsFile {
    /// Every tenant not listed: its weight and budgets. Default weight 1,
    /// no budgets.
    #[serde(default)]
    defaults: TenantFields,
    /// Tenants with a weight or budgets of their own. Default [].
    #[serde(default)]
    list: Vec<TenantFile>,
    /// Without `auth`: the request header that names the tenant, set by an
    /// authenticating proxy in front (the gateway must then never be
    /// reachable directly). Removed before the request goes upstream.
    /// Default none: every request is tenant `default`.
    header: Option<String>,
    /// Distinct unlisted names (JWT subjects, header values) tracked each
    /// on its own; past this many they share the budget and metric label
    /// `other`. Default 100.
    #[serde(default = "default_max_tracked")]
    max_tracked: u64,
    /// What a backend's slots are shared in: `tokens`, the GPU work a
    /// request costs (uncached prompt tokens and output tokens, weighted),
    /// or `requests`, one a request however long. Default tokens.
    #[serde(default)]
    fairness: FairnessFile,
    /// With `fairness: tokens`: an output token's cost in prefill tokens.
    /// Default none: learnt from each backend's responses (its slot time
    /// against its uncached prompt and completion tokens), 100 until then.
    output_token_cost: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
enum FairnessFile {
    #[default]
    Tokens,
    Requests,
}

impl Default for TenantsFile {
    fn default() -> Self {
        TenantsFile {
            defaults: TenantFields::default(),
            list: Vec::new(),
            header: None,
            max_tracked: default_max_tracked(),
            fairness: FairnessFile::default(),
            output_token_cost: None,
        }
    }
}

fn default_max_tracked() -> u64 {
    crate::tenants::DEFAULT_MAX_TRACKED as u64
}

/// A listed tenant: its name and the fields `defaults` has.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct TenantFile {
    /// `[A-Za-z0-9_.-]{1,64}`: the name the credential gives.
    name: String,
    #[serde(flatten)]
    fields: TenantFields,
}

/// A tenant's weight and budgets. Unknown keys are collected and refused by
/// `validate` (serde cannot deny them itself beside a flattened struct).
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct TenantFields {
    /// Share of each backend's slots and queue places against the other
    /// tenants waiting there. Default 1.
    #[serde(default = "default_weight")]
    weight: u64,
    /// Requests holding a slot or a queue place at once, all backends.
    /// Default none (no limit).
    max_in_flight: Option<u64>,
    /// Requests started a minute (a token bucket: this many at once after a
    /// minute idle, then one every 60/N s). Default none.
    requests_per_minute: Option<u64>,
    /// Prompt plus completion tokens a minute, as vLLM reported them,
    /// charged when a response ends. Default none.
    tokens_per_minute: Option<u64>,
    #[serde(flatten)]
    #[cfg_attr(test, schemars(skip))]
    unknown: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

impl Default for TenantFields {
    fn default() -> Self {
        TenantFields {
            weight: default_weight(),
            max_in_flight: None,
            requests_per_minute: None,
            tokens_per_minute: None,
            unknown: Default::default(),
        }
    }
}

fn default_weight() -> u64 {
    1
}

#[derive(Debug, Clone)]
pub struct TenantsConfig {
    /// Every unlisted tenant's weight and budgets (before they are shared
    /// by replicas).
    pub defaults: Spec,
    /// Listed tenants, by name, in file order.
    pub list: Vec<(String, Spec)>,
    pub header: Option<http::HeaderName>,
    pub max_tracked: usize,
    pub fairness: Fairness,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            defaults: Spec::default(),
            list: Vec::new(),
            header: None,
            max_tracked: crate::tenants::DEFAULT_MAX_TRACKED,
            fairness: Fairness::Tokens { output_cost: None },
        }
    }
}

pub const WEIGHT: Bound<u64> = Bound::new(
    &[
        "gateway.tenants.defaults.weight",
        "gateway.tenants.list[].weight",
    ],
    1,
    crate::admission::MAX_WEIGHT as u64,
);
pub const MAX_IN_FLIGHT: Bound<u64> = Bound::new(
    &[
        "gateway.tenants.defaults.max_in_flight",
        "gateway.tenants.list[].max_in_flight",
    ],
    1,
    1_000_000,
);
pub const REQUESTS_PER_MINUTE: Bound<u64> = Bound::new(
    &[
        "gateway.tenants.defaults.requests_per_minute",
        "gateway.tenants.list[].requests_per_minute",
    ],
    1,
    100_000_000,
);
pub const TOKENS_PER_MINUTE: Bound<u64> = Bound::new(
    &[
        "gateway.tenants.defaults.tokens_per_minute",
        "gateway.tenants.list[].tokens_per_minute",
    ],
    1,
    1_000_000_000_000,
);
pub const MAX_TRACKED: Bound<u64> = Bound::new(&["gateway.tenants.max_tracked"], 1, 100_000);
pub const OUTPUT_TOKEN_COST: Bound<u64> =
    Bound::new(&["gateway.tenants.output_token_cost"], 1, 10_000);

/// `authenticated`: `auth` names the tenants, so a header is not trusted.
pub fn validate(t: TenantsFile, authenticated: bool) -> Result<TenantsConfig, Invalid> {
    let defaults = fields("gateway.tenants.defaults", t.defaults)?;
    let mut list: Vec<(String, Spec)> = Vec::new();
    for (i, tenant) in t.list.into_iter().enumerate() {
        let at = format!("gateway.tenants.list[{i}]");
        let name = tenant.name;
        if !crate::tenants::valid_name(&name) || name == crate::tenants::OTHER {
            let rule = "a name is 1 to 64 of A-Z a-z 0-9 _ . - (and not `other`)";
            return Err(invalid(format!("{at}.name"), &name, rule));
        }
        if list.iter().any(|(n, _)| *n == name) {
            return Err(invalid(format!("{at}.name"), &name, "listed twice"));
        }
        list.push((name, fields(&at, tenant.fields)?));
    }
    let header = match t.header {
        None => None,
        Some(_) if authenticated => {
            let rule = "the credential names the tenant when auth is configured; a header is trusted only without auth";
            return Err(invalid("gateway.tenants.header", "(set)", rule));
        }
        Some(h) => Some(
            http::HeaderName::try_from(h.as_str())
                .map_err(|_| invalid("gateway.tenants.header", &h, "not a header name"))?,
        ),
    };
    let key = "gateway.tenants.output_token_cost";
    let output_cost = t
        .output_token_cost
        .map(|c| OUTPUT_TOKEN_COST.check(key, c))
        .transpose()?;
    let fairness = match (t.fairness, output_cost) {
        (FairnessFile::Tokens, c) => Fairness::Tokens {
            output_cost: c.map(|c| c as u32),
        },
        (FairnessFile::Requests, None) => Fairness::Requests,
        (FairnessFile::Requests, Some(c)) => {
            return Err(invalid(key, c, "only with `fairness: tokens`"));
        }
    };
    Ok(TenantsConfig {
        defaults,
        list,
        header,
        max_tracked: MAX_TRACKED.check("gateway.tenants.max_tracked", t.max_tracked)? as usize,
        fairness,
    })
}

fn fields(at: &str, f: TenantFields) -> Result<Spec, Invalid> {
    let key = |k: &str| format!("{at}.{k}");
    if let Some(unknown) = f.unknown.keys().next() {
        return Err(invalid(key(unknown), "(set)", "unknown field"));
    }
    let opt =
        |bound: Bound<u64>, k: &str, v: Option<u64>| v.map(|v| bound.check(&key(k), v)).transpose();
    Ok(Spec {
        weight: WEIGHT.check(&key("weight"), f.weight)? as u32,
        limits: Budget {
            max_in_flight: opt(MAX_IN_FLIGHT, "max_in_flight", f.max_in_flight)?.map(|v| v as u32),
            requests_per_minute: opt(
                REQUESTS_PER_MINUTE,
                "requests_per_minute",
                f.requests_per_minute,
            )?
            .map(|v| v as u32),
            tokens_per_minute: opt(TOKENS_PER_MINUTE, "tokens_per_minute", f.tokens_per_minute)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<TenantsConfig, String> {
        let file: TenantsFile = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        validate(file, false).map_err(|e| e.to_string())
    }

    #[test]
    fn listed_tenants_and_defaults() {
        let t = parse("defaults: {weight: 2, requests_per_minute: 60}\nlist:\n  - {name: alice, weight: 3, max_in_flight: 16, tokens_per_minute: 500000}\n").unwrap();
        assert_eq!(t.defaults.weight, 2);
        assert_eq!(t.defaults.limits.requests_per_minute, Some(60));
        let (name, alice) = &t.list[0];
        assert_eq!((name.as_str(), alice.weight), ("alice", 3));
        assert_eq!(alice.limits.max_in_flight, Some(16));
        assert_eq!(alice.limits.tokens_per_minute, Some(500_000));
        assert_eq!(alice.limits.requests_per_minute, None);
        assert_eq!(t.fairness, Fairness::Tokens { output_cost: None });
        let set = parse("output_token_cost: 60").unwrap().fairness;
        assert_eq!(
            set,
            Fairness::Tokens {
                output_cost: Some(60)
            }
        );
        assert_eq!(
            parse("fairness: requests").unwrap().fairness,
            Fairness::Requests
        );
    }

    #[test]
    fn mistakes_name_the_field() {
        let err = |yaml: &str| parse(yaml).unwrap_err();
        assert!(
            err("list: [{name: a, wieght: 3}]").contains("wieght"),
            "{}",
            err("list: [{name: a, wieght: 3}]")
        );
        assert!(err("defaults: {name: a}").contains("name"));
        assert!(err("list: [{name: a}, {name: a}]").contains("gateway.tenants.list[1].name"));
        assert!(err("list: [{name: \"a b\"}]").contains("gateway.tenants.list[0].name"));
        assert!(err("list: [{name: other}]").contains("not `other`"));
        assert!(err("list: [{name: a, weight: 0}]").contains("gateway.tenants.list[0].weight"));
        assert!(err("defaults: {tokens_per_minute: 0}")
            .contains("gateway.tenants.defaults.tokens_per_minute"));
        assert!(err("header: \"bad header\"").contains("gateway.tenants.header"));
        assert!(err("fairness: tokenz").contains("fairness"));
        assert!(err("output_token_cost: 0").contains("gateway.tenants.output_token_cost"));
        assert!(err("fairness: requests\noutput_token_cost: 5").contains("only with"));
        let file: TenantsFile = serde_yaml::from_str("header: X-Tenant").unwrap();
        assert!(validate(file, true)
            .unwrap_err()
            .to_string()
            .contains("only without auth"));
    }
}
