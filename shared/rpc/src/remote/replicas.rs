//! Calls spread over several replicas of a stage without a service mesh: `upstreams.<stage>` names
//! a list of addresses (`scorer-0:50054,scorer-1:50054`) or a DNS name re-resolved periodically
//! (`dns:///scorer-headless:50054`, a headless Service in Kubernetes: one address per ready pod).
//! Each call goes to one replica, chosen per call by tower's power-of-two-choices balancer (fewest
//! calls pending). Every replica is asked its gRPC health (the stage's service) every
//! [`PROBE_EVERY`]; one that fails it, or stops resolving, is taken out of the balancer and put
//! back once it answers SERVING again. The last replica is never taken out: with every replica
//! failing, calls fail with the replica's error instead of waiting for one to come back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use assay_domain::StageError;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::tls::ClientTls;

/// How often each replica's health is asked.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How often the names are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How long a health answer may take before the replica counts as failing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a stage's calls go: one address (a plain channel), or replicas to balance over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// One address, dialled as it is.
    Single(String),
    /// Replicas: each entry a `host:port` resolved again every [`RESOLVE_EVERY`].
    Replicas(Vec<(String, u16)>),
}

impl Upstream {
    /// `spec` as configured: `dns:///host:port`, or addresses separated by commas (each with an
    /// optional `http://` / `https://`), else a single address.
    pub fn parse(spec: &str) -> Result<Upstream, String> {
        let spec = spec.trim();
        let entries: Vec<&str> = match spec.strip_prefix("dns:///") {
            Some(name) => vec![name],
            None if spec.contains(',') => spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect(),
            None => return Ok(Upstream::Single(spec.to_string())),
        };
        if entries.is_empty() {
            return Err("names no address".into());
        }
        let mut out = Vec::new();
        for entry in entries {
            let bare = entry.strip_prefix("http://").or_else(|| entry.strip_prefix("https://")).unwrap_or(entry);
            let (host, port) = bare.rsplit_once(':').ok_or_else(|| format!("{entry:?}: expected host:port"))?;
            let port: u16 =
                port.parse().map_err(|_| format!("{entry:?}: the port must be a number from 1 to 65535"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() || port == 0 {
                return Err(format!("{entry:?}: expected host:port"));
            }
            out.push((host.to_string(), port));
        }
        Ok(Upstream::Replicas(out))
    }
}

/// A channel balancing calls over the replicas of `targets`, kept by a background task while the
/// channel lives. `service` is the gRPC service whose health decides a replica's place.
pub fn balanced(
    targets: Vec<(String, u16)>,
    tls: Option<&ClientTls>,
    service: &'static str,
) -> Result<Channel, StageError> {
    let (channel, changes) = Channel::balance_channel::<SocketAddr>(1024);
    let tls = tls.cloned();
    // Each endpoint is checked once here, so a bad setting fails at start, not in the task.
    for (host, _) in &targets {
        endpoint(host, SocketAddr::from(([127, 0, 0, 1], 1)), tls.as_ref())?;
    }
    tokio::spawn(keep(targets, tls, service, changes));
    Ok(channel)
}

/// The endpoint of one replica at `addr`, named `host` (the name TLS verifies).
fn endpoint(host: &str, addr: SocketAddr, tls: Option<&ClientTls>) -> Result<Endpoint, StageError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    let mut e = super::endpoint::endpoint(&url)?;
    if let Some(t) = tls {
        let config = t.config_for(host);
        e = e.tls_config(config).map_err(|e| StageError::Internal(format!("tls for upstream {host} ({addr}): {e}")))?;
    }
    Ok(e)
}

/// One replica as the task knows it.
struct Replica {
    host: String,
    probe: HealthClient<Channel>,
    /// In the balancer now.
    serving: bool,
}

/// Resolve, probe, and tell the balancer, until the channel is dropped.
async fn keep(
    targets: Vec<(String, u16)>,
    tls: Option<ClientTls>,
    service: &'static str,
    changes: tokio::sync::mpsc::Sender<Change<SocketAddr, Endpoint>>,
) {
    let mut replicas: BTreeMap<SocketAddr, Replica> = BTreeMap::new();
    let mut resolved_at: Option<tokio::time::Instant> = None;
    loop {
        if resolved_at.is_none_or(|t| t.elapsed() >= RESOLVE_EVERY) {
            resolved_at = Some(tokio::time::Instant::now());
            let found = resolve(&targets).await;
            // A name that resolves to nothing for a moment (DNS hiccup) keeps what it had.
            if !found.is_empty() {
                let gone: Vec<SocketAddr> = replicas.keys().filter(|a| !found.contains_key(a)).copied().collect();
                for addr in gone {
                    if replicas.remove(&addr).is_some_and(|r| r.serving)
                        && changes.send(Change::Remove(addr)).await.is_err()
                    {
                        return;
                    }
                    tracing::info!(replica = %addr, "replica no longer resolved; taken out");
                }
                for (addr, host) in found {
                    if replicas.contains_key(&addr) {
                        continue;
                    }
                    let Ok(e) = endpoint(&host, addr, tls.as_ref()) else { continue };
                    replicas.insert(addr, Replica { host, probe: HealthClient::new(e.connect_lazy()), serving: false });
                }
            }
        }
        let probes = replicas.iter().map(|(addr, r)| {
            let mut client = r.probe.clone();
            let addr = *addr;
            async move {
                let asked = client.check(HealthCheckRequest { service: service.to_string() });
                let ok = matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, asked).await,
                    Ok(Ok(reply)) if reply.get_ref().status == ServingStatus::Serving as i32
                );
                (addr, ok)
            }
        });
        let results: Vec<(SocketAddr, bool)> = futures::future::join_all(probes).await;
        let mut serving: BTreeSet<SocketAddr> = replicas.iter().filter(|(_, r)| r.serving).map(|(a, _)| *a).collect();
        for (addr, ok) in results {
            let Some(r) = replicas.get_mut(&addr) else { continue };
            if ok && !r.serving {
                let Ok(e) = endpoint(&r.host, addr, tls.as_ref()) else { continue };
                if changes.send(Change::Insert(addr, e)).await.is_err() {
                    return;
                }
                r.serving = true;
                serving.insert(addr);
                tracing::info!(replica = %addr, service, "replica serving; calls go to it");
            } else if !ok && r.serving && serving.len() > 1 {
                if changes.send(Change::Remove(addr)).await.is_err() {
                    return;
                }
                r.serving = false;
                serving.remove(&addr);
                tracing::warn!(replica = %addr, service, "replica failed its health check; taken out");
            }
        }
        // Nothing serving yet (every replica starting): let calls reach them and fail clearly.
        if serving.is_empty() {
            for (addr, r) in replicas.iter_mut() {
                let Ok(e) = endpoint(&r.host, *addr, tls.as_ref()) else { continue };
                if changes.send(Change::Insert(*addr, e)).await.is_err() {
                    return;
                }
                r.serving = true;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PROBE_EVERY) => {}
            () = changes.closed() => return,
        }
    }
}

/// Every address each target resolves to, with the host name it came from.
async fn resolve(targets: &[(String, u16)]) -> BTreeMap<SocketAddr, String> {
    let mut out = BTreeMap::new();
    for (host, port) in targets {
        match tokio::net::lookup_host((host.as_str(), *port)).await {
            Ok(addrs) => {
                for a in addrs {
                    out.entry(a).or_insert_with(|| host.clone());
                }
            }
            Err(e) => tracing::warn!(host = %host, error = %e, "cannot resolve an upstream replica"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_dns_names_are_replicas_and_one_address_is_not() {
        assert_eq!(
            Upstream::parse("http://127.0.0.1:50054").unwrap(),
            Upstream::Single("http://127.0.0.1:50054".into())
        );
        assert_eq!(
            Upstream::parse("scorer-0:50054, http://scorer-1:50054").unwrap(),
            Upstream::Replicas(vec![("scorer-0".into(), 50054), ("scorer-1".into(), 50054)])
        );
        assert_eq!(
            Upstream::parse("dns:///scorer-headless.assay.svc:50054").unwrap(),
            Upstream::Replicas(vec![("scorer-headless.assay.svc".into(), 50054)])
        );
        assert_eq!(
            Upstream::parse("[::1]:1,[::1]:2").unwrap(),
            Upstream::Replicas(vec![("::1".into(), 1), ("::1".into(), 2)])
        );
        for bad in ["a:1,b", "a:1,b:x", "dns:///host", "a:0,b:1", ","] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }
}
