//! The emulated network: one namespace per host, each with a veth link to a
//! shared switch namespace holding a bridge, every link shaped by `tc tbf` in
//! both directions. Made with the `ip` and `tc` tools; removed when dropped
//! (deleting a namespace deletes the links in it), and by [`sweep`] when a run
//! was killed before it could remove its own.
//!
//! Namespaces are named `PREFIX-PID-HOST` (and `PREFIX-PID-switch`), so runs
//! with different prefixes (a developer's and CI's) or from different processes
//! never share one, and a leftover's owner can be checked.

use std::path::Path;
use std::process::{Command, Output};

use crate::hosts::Host;

/// What went wrong building or reading the network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Not root.
    #[error(
        "the testbed makes network namespaces and shapes links, which needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run it with sudo"
    )]
    NotRoot,
    /// A tool is missing.
    #[error(
        "`{0}` is not installed; the testbed needs iproute2's `ip` and `tc` (apt-get install iproute2)"
    )]
    Missing(&'static str),
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it said.
        stderr: String,
    },
    /// A link's counters could not be read.
    #[error("reading the counters of {host}: {reason}")]
    Counters {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
}

/// The interface name of each host's end of its link, inside its namespace.
pub const HOST_DEVICE: &str = "eth0";

/// The emulated network, removed when dropped.
#[derive(Debug)]
pub struct Network {
    prefix: String,
    namespaces: Vec<String>,
    hosts: Vec<Host>,
}

/// Checks what the testbed needs before anything is made.
///
/// # Errors
/// [`NetError::NotRoot`] or [`NetError::Missing`].
pub fn preflight() -> Result<(), NetError> {
    for tool in ["ip", "tc"] {
        let found = Command::new(tool).arg("-V").output();
        if found.is_err() {
            return Err(NetError::Missing(tool));
        }
    }
    if effective_uid() != Some(0) {
        return Err(NetError::NotRoot);
    }
    Ok(())
}

/// The effective user id, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Runs `program args`, failing with what it printed.
fn run(program: &str, args: &[&str]) -> Result<Output, NetError> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|_| NetError::Missing(if program == "tc" { "tc" } else { "ip" }))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(NetError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// The namespace names on this machine.
fn namespaces() -> Result<Vec<String>, NetError> {
    let listed = run("ip", &["netns", "list"])?;
    Ok(String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Removes every namespace under `prefix` whose owning process is gone (a run
/// killed before it could clean up); the names removed.
///
/// # Errors
/// When `ip` fails.
pub fn sweep(prefix: &str) -> Result<Vec<String>, NetError> {
    let mut removed = Vec::new();
    for name in namespaces()? {
        let Some(pid) = owner(prefix, &name) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            run("ip", &["netns", "del", &name])?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The pid in a namespace name `PREFIX-PID-...`, when it is one of ours.
fn owner(prefix: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    rest.split_once('-')?.0.parse().ok()
}

/// How much a shaper may send at once: enough for a full-size GSO packet
/// (64 KiB) and for 4 ms at the rate, so that tbf neither drops large
/// packets nor starves a fast link between timer ticks.
fn burst_bytes(rate_bits: u64) -> u64 {
    (rate_bits / 8 / 250).max(128 << 10)
}

impl Network {
    /// Makes the switch and one namespace per host, links each host to the
    /// switch with a veth pair, gives it its address, and shapes both
    /// directions of its link to its rate. Whatever was made is removed again
    /// when a step fails.
    ///
    /// # Errors
    /// [`NetError`] naming the command that failed.
    pub fn build(prefix: &str, hosts: &[Host]) -> Result<Self, NetError> {
        let mut network = Self {
            prefix: format!("{prefix}-{}", std::process::id()),
            namespaces: Vec::new(),
            hosts: hosts.to_vec(),
        };
        network.make()?;
        Ok(network)
    }

    fn make(&mut self) -> Result<(), NetError> {
        let switch = self.add_namespace("switch")?;
        run(
            "ip",
            &["-n", &switch, "link", "add", "br0", "type", "bridge"],
        )?;
        run("ip", &["-n", &switch, "link", "set", "br0", "up"])?;
        for host in self.hosts.clone() {
            let ns = self.add_namespace(&host.name)?;
            let port = &host.name;
            run(
                "ip",
                &[
                    "link",
                    "add",
                    HOST_DEVICE,
                    "netns",
                    &ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    port,
                    "netns",
                    &switch,
                ],
            )?;
            run(
                "ip",
                &["-n", &switch, "link", "set", port, "master", "br0", "up"],
            )?;
            let addr = format!("{}/24", host.addr);
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", HOST_DEVICE])?;
            run("ip", &["-n", &ns, "link", "set", HOST_DEVICE, "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            // Upload: what leaves the host. Download: what the switch sends it.
            shape(&ns, HOST_DEVICE, host.rate.bits_per_sec())?;
            shape(&switch, port, host.rate.bits_per_sec())?;
        }
        Ok(())
    }

    fn add_namespace(&mut self, host: &str) -> Result<String, NetError> {
        let name = format!("{}-{host}", self.prefix);
        run("ip", &["netns", "add", &name])?;
        self.namespaces.push(name.clone());
        Ok(name)
    }

    /// The namespace of `host`.
    pub fn namespace(&self, host: &Host) -> String {
        format!("{}-{}", self.prefix, host.name)
    }

    /// The hosts, as planned.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Bytes each host has sent and received on its link so far.
    ///
    /// # Errors
    /// [`NetError::Counters`] when `ip` cannot show one.
    pub fn counters(&self) -> Result<Vec<LinkBytes>, NetError> {
        self.hosts
            .iter()
            .map(|host| {
                let failed = |reason: String| NetError::Counters {
                    host: host.name.clone(),
                    reason,
                };
                let ns = self.namespace(host);
                let shown = run(
                    "ip",
                    &["-n", &ns, "-j", "-s", "link", "show", "dev", HOST_DEVICE],
                )?;
                let json: serde_json::Value =
                    serde_json::from_slice(&shown.stdout).map_err(|e| failed(e.to_string()))?;
                let stats = &json[0]["stats64"];
                let read = |dir: &str| {
                    stats[dir]["bytes"]
                        .as_u64()
                        .ok_or_else(|| failed(format!("no {dir} byte count in `ip -s` output")))
                };
                Ok(LinkBytes {
                    sent: read("tx")?,
                    received: read("rx")?,
                })
            })
            .collect()
    }
}

/// Shapes what leaves `device` in namespace `ns` to `rate_bits` per second.
fn shape(ns: &str, device: &str, rate_bits: u64) -> Result<(), NetError> {
    let rate = format!("{rate_bits}bit");
    let burst = burst_bytes(rate_bits).to_string();
    let limit = queue_bytes(rate_bits).to_string();
    run(
        "tc",
        &[
            "-n", ns, "qdisc", "add", "dev", device, "root", "tbf", "rate", &rate, "burst", &burst,
            "limit", &limit,
        ],
    )?;
    Ok(())
}

/// How many bytes a shaper queues: 5 ms at the rate, and at least 1 MiB (a
/// switch port's buffer). A queue of a few packets at a slow rate drops the
/// bursts of several flows at once and halves their windows again and again;
/// a deep one (50 ms) delays the other direction's acknowledgements behind
/// it.
fn queue_bytes(rate_bits: u64) -> u64 {
    (rate_bits / 8 / 200).max(1 << 20)
}

/// A host link's byte counters, from the host's side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkBytes {
    /// Bytes the host sent (its uplink).
    pub sent: u64,
    /// Bytes the host received (its downlink).
    pub received: u64,
}

impl Drop for Network {
    fn drop(&mut self) {
        for name in self.namespaces.drain(..).rev() {
            if let Err(error) = run("ip", &["netns", "del", &name]) {
                tracing::warn!(%error, "could not remove a testbed namespace");
            }
        }
    }
}

/// The testbed's namespaces now on this machine under `prefix` (any owner).
///
/// # Errors
/// When `ip` fails.
pub fn leftovers(prefix: &str) -> Result<Vec<String>, NetError> {
    Ok(namespaces()?
        .into_iter()
        .filter(|n| owner(prefix, n).is_some())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_its_owner_only_under_its_prefix() {
        assert_eq!(owner("psbed", "psbed-4242-server1"), Some(4242));
        assert_eq!(owner("psbed", "psbed-4242-switch"), Some(4242));
        assert_eq!(owner("psci", "psbed-4242-server1"), None);
        assert_eq!(owner("psbed", "psbedx-4242-server1"), None);
        assert_eq!(owner("psbed", "psbed-main"), None);
    }

    #[test]
    fn a_burst_holds_a_full_gso_packet_and_four_milliseconds() {
        assert_eq!(burst_bytes(1_000_000), 128 << 10);
        assert_eq!(burst_bytes(10_000_000_000), 5_000_000);
    }
}
