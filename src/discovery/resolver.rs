//! DNS lookups: hickory's resolver, reading /etc/resolv.conf and /etc/hosts
//! as libc does, or asking the configured `discovery.nameservers`.

use std::net::SocketAddr;
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
    inner: TokioResolver,
    /// No lookup takes longer, so a round ends before the next is due.
    deadline: Duration,
}

impl Resolver {
    pub fn new(config: &DiscoveryConfig) -> Result<Self, String> {
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
        // Both families, always: every address is a backend.
        builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        let inner = builder.build().map_err(|e| format!("DNS resolver: {e}"))?;
        Ok(Resolver {
            inner,
            deadline: config.refresh,
        })
    }

    /// Every address `host` has (A and AAAA records, /etc/hosts), with
    /// `port`, sorted. None is an error: an empty answer never empties a set.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let lookup = tokio::time::timeout(self.deadline, self.inner.lookup_ip(host))
            .await
            .map_err(|_| format!("no answer within {:?}", self.deadline))?
            .map_err(|e| e.to_string())?;
        let mut addrs: Vec<SocketAddr> =
            lookup.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        addrs.sort();
        addrs.dedup();
        if addrs.is_empty() {
            return Err("no A or AAAA record".into());
        }
        Ok(addrs)
    }
}
