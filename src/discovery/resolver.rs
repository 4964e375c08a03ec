//! DNS lookups: hickory's resolver, reading /etc/resolv.conf and /etc/hosts
//! as libc does, or asking the configured `discovery.nameservers`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;

use crate::config::DiscoveryConfig;

/// A resolver for one round of lookups. A new one per round, so that edits
/// of /etc/resolv.conf and /etc/hosts are seen (hickory reads them when it
/// is built), and its connections belong to the runtime that uses them.
pub struct Resolver {
    /// One per family: hickory's both-families lookup answers with one
    /// family when the other's query fails, which would drop the other
    /// family's backends on a transient error.
    v4: TokioResolver,
    v6: TokioResolver,
    /// No lookup takes longer, so a round ends before the next is due.
    deadline: Duration,
}

impl Resolver {
    pub fn new(config: &DiscoveryConfig) -> Result<Self, String> {
        Ok(Resolver {
            v4: build(config, LookupIpStrategy::Ipv4Only)?,
            v6: build(config, LookupIpStrategy::Ipv6Only)?,
            deadline: config.refresh,
        })
    }

    /// Every address `host` has (A and AAAA records, /etc/hosts), with
    /// `port`, sorted. None is an error: an empty answer never empties a set;
    /// nor does a failed query for one family (only "no such records" counts
    /// as an empty family).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let both = async { tokio::try_join!(family(&self.v4, host), family(&self.v6, host)) };
        let (v4, v6) = tokio::time::timeout(self.deadline, both)
            .await
            .map_err(|_| format!("no answer within {:?}", self.deadline))??;
        let mut addrs: Vec<SocketAddr> = v4
            .into_iter()
            .chain(v6)
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        addrs.sort();
        addrs.dedup();
        if addrs.is_empty() {
            return Err("no A or AAAA record".into());
        }
        Ok(addrs)
    }
}

/// A resolver asking for one family (`strategy`), from the system
/// configuration or the configured `discovery.nameservers`.
fn build(config: &DiscoveryConfig, strategy: LookupIpStrategy) -> Result<TokioResolver, String> {
    let mut builder = if config.nameservers.is_empty() {
        TokioResolver::builder_tokio().map_err(|e| format!("system DNS configuration: {e}"))?
    } else {
        let servers = config
            .nameservers
            .iter()
            .map(|ns| {
                let mut udp = ConnectionConfig::udp();
                udp.port = ns.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = ns.port();
                NameServerConfig::new(ns.ip(), true, vec![udp, tcp])
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(servers),
            TokioRuntimeProvider::default(),
        )
    };
    builder.options_mut().ip_strategy = strategy;
    builder.build().map_err(|e| format!("DNS resolver: {e}"))
}

/// The addresses of one family `resolver` finds for `host`: none when the
/// name has no such records, an error when the query failed.
async fn family(resolver: &TokioResolver, host: &str) -> Result<Vec<IpAddr>, String> {
    match resolver.lookup_ip(host).await {
        Ok(lookup) => Ok(lookup.iter().collect()),
        Err(e) if e.is_no_records_found() => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}
