//! The emulated hosts: how many of each role (`--hosts scheduler=1,server=2,
//! worker=2`), whether the servers have hosts of their own or run beside the
//! workers (`--colocate`), the link rate each one gets (`--link`, and
//! `--link-for ROLE=RATE` or `--link-for HOST=RATE`), and the private address
//! each one has.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::rate::LinkRate;

/// What runs on a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `ps-scheduler`.
    Scheduler,
    /// `ps-server`.
    Server,
    /// `ps-worker`.
    Worker,
}

impl Role {
    const ALL: [Role; 3] = [Role::Scheduler, Role::Server, Role::Worker];

    fn name(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Server => "server",
            Role::Worker => "worker",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many hosts of each role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCounts {
    /// `ps-server`s: one on each server host, or, when `colocated`, one
    /// beside the worker on each of the first this many worker hosts.
    pub servers: usize,
    /// Worker hosts, one `ps-worker` each.
    pub workers: usize,
    /// The servers run on worker hosts instead of hosts of their own.
    pub colocated: bool,
}

/// Most hosts of one role: each is a namespace, a veth pair and processes on
/// two shared cores.
const MAX_PER_ROLE: usize = 32;

impl FromStr for HostCounts {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (mut servers, mut workers) = (None, None);
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (role, count) = item
                .split_once('=')
                .ok_or_else(|| format!("--hosts item {item:?} is not ROLE=COUNT"))?;
            let count: usize = count
                .trim()
                .parse()
                .map_err(|_| format!("--hosts item {item:?}: {count:?} is not a count"))?;
            match role.trim() {
                "scheduler" if count == 1 => {}
                "scheduler" => {
                    return Err(format!(
                        "--hosts: a cluster has exactly one scheduler host, not {count}"
                    ));
                }
                "server" => servers = Some(count),
                "worker" => workers = Some(count),
                other => {
                    return Err(format!(
                        "--hosts: unknown role {other:?} (scheduler, server or worker)"
                    ));
                }
            }
        }
        let counts = Self {
            servers: servers.ok_or("--hosts needs server=N")?,
            workers: workers.ok_or("--hosts needs worker=N")?,
            colocated: false,
        };
        for (role, count) in [("server", counts.servers), ("worker", counts.workers)] {
            if !(1..=MAX_PER_ROLE).contains(&count) {
                return Err(format!(
                    "--hosts: {role}={count} is outside 1..={MAX_PER_ROLE}"
                ));
            }
        }
        Ok(counts)
    }
}

/// `--link-for WHO=RATE`: a rate for every host of a role, or for one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOverride {
    /// A role (`server`) or a host name (`server1`).
    pub who: String,
    /// Its links' rate.
    pub rate: LinkRate,
}

impl FromStr for LinkOverride {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (who, rate) = text
            .split_once('=')
            .ok_or_else(|| format!("--link-for {text:?} is not WHO=RATE (server=2.5gbit)"))?;
        Ok(Self {
            who: who.trim().to_string(),
            rate: rate.parse()?,
        })
    }
}

/// One emulated host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// What runs on it.
    pub role: Role,
    /// Its name: the role and its number among them, `server1`; the scheduler's
    /// is `scheduler`.
    pub name: String,
    /// Its address on the emulated network.
    pub addr: Ipv4Addr,
    /// Its link's rate, each direction.
    pub rate: LinkRate,
    /// Whether a `ps-server` runs on it: every server host, and a worker
    /// host its server was placed beside.
    pub serves: bool,
}

impl Host {
    /// The name of the `ps-server` on this host (its log is `NAME.log`): the
    /// host's own on a server host, `worker1-server` beside a worker.
    pub fn server_name(&self) -> String {
        match self.role {
            Role::Server => self.name.clone(),
            _ => format!("{}-server", self.name),
        }
    }
}

/// Every host: the scheduler, then the servers, then the workers, numbered
/// from 1 in `10.77.0.0/24` (which exists only inside the namespaces). Each
/// gets `rate` unless an override names its role or, taking precedence, it.
/// With `counts.colocated` there are no server hosts: the first
/// `counts.servers` worker hosts each run a server too.
///
/// # Errors
/// When an override names neither a role nor a host, or more servers are to
/// run beside workers than there are worker hosts.
pub fn plan(
    counts: HostCounts,
    rate: LinkRate,
    overrides: &[LinkOverride],
) -> Result<Vec<Host>, String> {
    if counts.colocated && counts.servers > counts.workers {
        return Err(format!(
            "{} servers beside {} workers: at most one server fits on each worker host",
            counts.servers, counts.workers
        ));
    }
    let server_hosts = if counts.colocated { 0 } else { counts.servers };
    let mut hosts = Vec::new();
    let roles = [
        (Role::Scheduler, 1),
        (Role::Server, server_hosts),
        (Role::Worker, counts.workers),
    ];
    for (role, count) in roles {
        for number in 1..=count {
            let name = match role {
                Role::Scheduler => role.to_string(),
                _ => format!("{role}{number}"),
            };
            let host_number = u8::try_from(hosts.len() + 1).map_err(|_| "too many hosts")?;
            let serves = match role {
                Role::Scheduler => false,
                Role::Server => true,
                Role::Worker => counts.colocated && number <= counts.servers,
            };
            hosts.push(Host {
                role,
                name,
                addr: Ipv4Addr::new(10, 77, 0, host_number),
                rate,
                serves,
            });
        }
    }
    // Role overrides first, so that one naming a host is applied after them.
    for by_role in [true, false] {
        for o in overrides {
            let is_role = Role::ALL.iter().any(|r| r.name() == o.who);
            if is_role != by_role {
                continue;
            }
            let mut matched = false;
            for host in &mut hosts {
                if host.name == o.who || host.role.name() == o.who {
                    host.rate = o.rate;
                    matched = true;
                }
            }
            if !matched && counts.colocated && o.who == Role::Server.name() {
                return Err(format!(
                    "--link-for {}: the servers run beside the workers and share their links; give worker=RATE or a worker host",
                    o.who
                ));
            }
            if !matched {
                let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
                return Err(format!(
                    "--link-for {}: no such role or host (roles: scheduler, server, worker; hosts: {})",
                    o.who,
                    names.join(", ")
                ));
            }
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gbit(n: &str) -> LinkRate {
        format!("{n}gbit").parse().unwrap()
    }

    #[test]
    fn hosts_are_numbered_by_role_with_overrides_by_role_then_name() {
        let counts: HostCounts = "scheduler=1, server=2, worker=3".parse().unwrap();
        let overrides = [
            "server1=4gbit".parse().unwrap(),
            "server=2gbit".parse().unwrap(),
        ];
        let hosts = plan(counts, gbit("1"), &overrides).unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "scheduler",
                "server1",
                "server2",
                "worker1",
                "worker2",
                "worker3"
            ]
        );
        assert_eq!(hosts[0].addr, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(hosts[5].addr, Ipv4Addr::new(10, 77, 0, 6));
        let rates: Vec<LinkRate> = hosts.iter().map(|h| h.rate).collect();
        let (one, two, four) = (gbit("1"), gbit("2"), gbit("4"));
        assert_eq!(
            rates,
            [one, four, two, one, one, one],
            "the host's own rate wins"
        );
    }

    #[test]
    fn colocated_servers_run_on_the_first_worker_hosts() {
        let mut counts: HostCounts = "server=2,worker=3".parse().unwrap();
        counts.colocated = true;
        let hosts = plan(counts, gbit("1"), &[]).unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["scheduler", "worker1", "worker2", "worker3"]);
        let serving: Vec<String> = hosts
            .iter()
            .filter(|h| h.serves)
            .map(Host::server_name)
            .collect();
        assert_eq!(serving, ["worker1-server", "worker2-server"]);
        counts.colocated = false;
        let own = plan(counts, gbit("1"), &[]).unwrap();
        let serving: Vec<String> = own
            .iter()
            .filter(|h| h.serves)
            .map(Host::server_name)
            .collect();
        assert_eq!(serving, ["server1", "server2"]);
        counts.colocated = true;
        counts.servers = 4;
        let error = plan(counts, gbit("1"), &[]).unwrap_err();
        assert!(error.contains("at most one server fits"), "{error}");
        counts.servers = 2;
        let shared = plan(counts, gbit("1"), &["server=2gbit".parse().unwrap()]).unwrap_err();
        assert!(shared.contains("share their links"), "{shared}");
    }

    #[test]
    fn bad_hosts_and_overrides_say_what_is_wrong() {
        let counts = |t: &str| t.parse::<HostCounts>().unwrap_err();
        assert!(counts("server=2").contains("worker=N"));
        assert!(counts("server=2,worker=x").contains("not a count"));
        assert!(counts("server=0,worker=1").contains("outside"));
        assert!(counts("scheduler=2,server=1,worker=1").contains("exactly one"));
        assert!(counts("gpu=1").contains("unknown role"));
        let ok: HostCounts = "server=1,worker=1".parse().unwrap();
        let unknown = plan(ok, gbit("1"), &["server9=1gbit".parse().unwrap()]).unwrap_err();
        assert!(
            unknown.contains("server9") && unknown.contains("worker1"),
            "{unknown}"
        );
        assert!(
            "server"
                .parse::<LinkOverride>()
                .unwrap_err()
                .contains("WHO=RATE")
        );
    }
}
