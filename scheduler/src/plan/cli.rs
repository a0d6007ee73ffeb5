//! The `ps-scheduler plan` command's flags, and running it: read the
//! inputs, plan, print the table (or JSON, or the explanation), and write
//! the plan file.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ps_common::rate::LinkRate;

use super::{Choices, Cluster, Constants, ModelShapes, Plan, calibrate, explain, plan};

/// `ps-scheduler plan`'s flags.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The model: resnet50, bert-base, mlp:IN,HIDDEN...,OUT, a JSON list of
    /// {"name", "shape"}, or a .safetensors file.
    #[arg(long, default_value = "mlp:784,128,10")]
    pub model: String,
    /// Worker hosts, one worker each.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Each worker host's link rate, each way (kbit, mbit, gbit).
    #[arg(long, default_value = "1gbit")]
    pub link: LinkRate,
    /// Each server host's link rate, when servers have hosts of their own
    /// (default: --link).
    #[arg(long)]
    pub server_link: Option<LinkRate>,
    /// Round-trip time between hosts, for example 200us.
    #[arg(long, default_value = "100us", value_parser = humantime::parse_duration)]
    pub rtt: Duration,
    /// A worker's compute per step (forward and backward), for example 40ms.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub compute: Duration,
    /// Measure the link instead of taking --link, --rtt and the request,
    /// per-byte and link-efficiency constants: runs ps-microbench against
    /// the `ps-microbench serve` at this address (start it on a server host).
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["link", "rtt"])]
    pub measure_link: Option<String>,
    /// Measure the compute per step instead of taking --compute (the MLP of
    /// --model mlp:..., a --batch-size batch on this host, by ps-worker),
    /// and the optimizer's apply rate on one core (by ps-microbench).
    #[arg(long, conflicts_with = "compute")]
    pub measure_compute: bool,
    /// The device --measure-compute times a step on: cpu, cuda:N (a GPU
    /// worker host) or metal:N.
    #[arg(long, default_value = "cpu", env = "PS_DEVICE")]
    pub device: String,
    /// Cores of each host (default: this host's). A server serves its
    /// workers' connections on half of them.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub cores: Option<u32>,
    /// The cluster from a JSON file instead of the flags, for example
    /// {"workers": 4, "link": "10gbit", "server_link": "25gbit", "rtt":
    /// "200us", "compute": "40ms", "server_hosts": 2, "cores": 16}; all but
    /// workers and link may be left out.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["workers", "link", "server_link", "rtt", "compute", "server_hosts", "cores"])]
    pub resources: Option<PathBuf>,
    /// Examples per worker step, for --measure-compute.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..), requires = "measure_compute")]
    pub batch_size: u64,
    /// The most servers to consider.
    #[arg(long, default_value_t = 4)]
    pub max_servers: u32,
    /// Hosts the servers may have to themselves (0: servers only beside
    /// workers).
    #[arg(long, default_value_t = 0)]
    pub server_hosts: u32,
    /// Let the plan put bf16 on the wire (half the bytes, rounded values).
    #[arg(long)]
    pub allow_bf16: bool,
    /// Let workers read values up to this many steps stale (SSP); 0 keeps BSP.
    #[arg(long, default_value_t = 0)]
    pub staleness: u32,
    /// Each server's memory budget, for example 16GiB.
    #[arg(long, default_value = "16GiB", value_parser = ps_common::size::parse_size)]
    pub server_memory: usize,
    /// The optimizer, for its state per value: sgd, momentum or adam.
    #[arg(long, default_value = "sgd", value_parser = ["sgd", "momentum", "adam"])]
    pub optimizer: String,
    /// Constants measured elsewhere (a plan file's "constants"), instead of
    /// this machine's defaults.
    #[arg(long)]
    pub constants: Option<PathBuf>,
    /// Candidates to list, fastest first.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print the plan as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also print the formulas, the constants and where they came from.
    #[arg(long)]
    pub explain: bool,
    /// Write the plan file here (for `ps-local --plan FILE`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl PlanArgs {
    /// Plans as the flags say, and prints and writes the result.
    ///
    /// # Errors
    /// A model or constants file that cannot be read, inputs out of range,
    /// or no setup that fits.
    pub fn run(&self) -> anyhow::Result<()> {
        let model = ModelShapes::from_spec(&self.model).map_err(anyhow::Error::msg)?;
        let mut constants = match &self.constants {
            Some(path) => read_constants(path)?,
            None => Constants::default(),
        };
        let resources = self.resources.as_deref().map(read_resources).transpose()?;
        let mut choices = self.choices();
        let mut cluster = match resources {
            Some(given) => {
                choices.server_hosts = given.server_hosts.unwrap_or(choices.server_hosts);
                given.cluster
            }
            None => self.cluster(),
        };
        let measured = self.measure(&mut cluster, &mut constants)?;
        let mut plan = plan(&model, &cluster, &choices, &constants)?;
        plan.made = made_note();
        plan.measured = measured;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            print!("{}", explain::table(&plan, self.top));
            if self.explain {
                print!("\n{}", explain::explanation(&plan));
            }
        }
        if let Some(out) = &self.out {
            write_plan(&plan, out)?;
        }
        Ok(())
    }

    /// Runs the measurements asked for, putting what they found into
    /// `cluster` and `constants`; a line on each, for the plan file.
    fn measure(
        &self,
        cluster: &mut Cluster,
        constants: &mut Constants,
    ) -> anyhow::Result<Vec<String>> {
        let mut measured = Vec::new();
        let made = made_note();
        if let Some(addr) = &self.measure_link {
            eprintln!("measuring the link to {addr} (ps-microbench latency and bandwidth)...");
            let link = calibrate::measure_link(addr)?;
            cluster.rtt = link.rtt;
            cluster.worker_link = link.link_bytes_per_sec;
            cluster.server_link = self
                .server_link
                .map_or(link.link_bytes_per_sec, LinkRate::bytes_per_sec);
            constants.request_seconds = link.request_seconds;
            constants.worker_bytes_per_sec = link.worker_bytes_per_sec;
            constants.link_efficiency = link.link_efficiency;
            let source = format!("--measure-link {addr}");
            set_source(
                constants,
                0,
                format!("a 64 B gRPC round trip less the raw TCP one ({source})"),
            );
            set_source(
                constants,
                1,
                format!("the sender's CPU per byte of a 4 MiB gRPC stream ({source})"),
            );
            set_source(
                constants,
                3,
                format!("a 4 MiB gRPC stream's rate over raw TCP's ({source})"),
            );
            match link.server_bytes_per_sec {
                Some(rate) => {
                    constants.server_bytes_per_sec = rate;
                    set_source(
                        constants,
                        4,
                        format!("the receiver's CPU per byte of a 4 MiB gRPC stream ({source})"),
                    );
                }
                None => eprintln!(
                    "the ps-microbench serve at {addr} reported no CPU of its own; the server rate stays the built-in one"
                ),
            }
            measured.push(format!(
                "link: raw TCP {} each way and a {:.0} us round trip, against {addr} ({made})",
                ps_common::size::format_rate(link.link_bytes_per_sec),
                link.rtt * 1e6
            ));
        }
        if self.measure_compute {
            let widths = calibrate::mlp_widths(&self.model)?;
            eprintln!(
                "measuring a step's compute (ps-worker --probe-compute) and the apply rate (ps-microbench apply)..."
            );
            cluster.compute =
                calibrate::measure_compute(&widths, self.batch_size as usize, &self.device)?;
            constants.apply_bytes_per_sec = calibrate::measure_apply(&self.optimizer)?;
            set_source(
                constants,
                2,
                format!(
                    "a memcpy then {} over 64 MiB, one core (--measure-compute)",
                    self.optimizer
                ),
            );
            measured.push(format!(
                "compute: {:.3} ms a step of {} with batches of {}, on this host's {} ({made})",
                cluster.compute * 1e3,
                self.model,
                self.batch_size,
                self.device
            ));
        }
        Ok(measured)
    }

    fn cluster(&self) -> Cluster {
        Cluster {
            workers: self.workers,
            worker_link: self.link.bytes_per_sec(),
            server_link: self.server_link.unwrap_or(self.link).bytes_per_sec(),
            rtt: self.rtt.as_secs_f64(),
            compute: self.compute.as_secs_f64(),
            cores: self.cores.unwrap_or_else(this_hosts_cores),
        }
    }

    fn choices(&self) -> Choices {
        Choices {
            max_servers: self.max_servers,
            server_hosts: self.server_hosts,
            allow_bf16: self.allow_bf16,
            staleness: self.staleness,
            server_memory: self.server_memory as u64,
            optimizer_state: match self.optimizer.as_str() {
                "momentum" => 1,
                "adam" => 2,
                _ => 0,
            },
        }
    }
}

/// This host's cores (2 where they cannot be read).
pub fn this_hosts_cores() -> u32 {
    std::thread::available_parallelism().map_or(2, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// The cluster a `--resources` file describes, and the hosts it gives the
/// servers.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// The cluster.
    pub cluster: Cluster,
    /// Hosts the servers may have to themselves, when the file says.
    pub server_hosts: Option<u32>,
}

/// A `--resources` file as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesFile {
    workers: u32,
    link: String,
    server_link: Option<String>,
    rtt: Option<String>,
    compute: Option<String>,
    server_hosts: Option<u32>,
    cores: Option<u32>,
}

/// Reads a `--resources` file (see `--help`): the workers and their link,
/// and optionally the servers' link, the round trip (100us), the compute per
/// step (10ms), the servers' own hosts and each host's cores (this host's).
///
/// # Errors
/// The file cannot be read, is not such a JSON object, or holds a rate, a
/// time or a count that does not read; each message names the field.
pub fn read_resources(path: &std::path::Path) -> anyhow::Result<Resources> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading --resources {shown}"))?;
    let file: ResourcesFile = serde_json::from_str(&text).with_context(|| {
        format!("--resources {shown}: give a JSON object with workers and link, and optionally server_link, rtt, compute, server_hosts and cores")
    })?;
    let rate = |field: &str, text: &str| -> anyhow::Result<f64> {
        let rate: LinkRate = text
            .parse()
            .map_err(|e| anyhow::anyhow!("--resources {shown}: {field} {text:?}: {e}"))?;
        Ok(rate.bytes_per_sec())
    };
    let time = |field: &str, text: Option<&str>, default: &str| -> anyhow::Result<f64> {
        let text = text.unwrap_or(default);
        let time = humantime::parse_duration(text)
            .map_err(|e| anyhow::anyhow!("--resources {shown}: {field} {text:?}: {e}"))?;
        Ok(time.as_secs_f64())
    };
    anyhow::ensure!(
        file.workers > 0,
        "--resources {shown}: workers must be at least 1"
    );
    anyhow::ensure!(
        file.cores != Some(0),
        "--resources {shown}: cores must be at least 1"
    );
    let worker_link = rate("link", &file.link)?;
    let cluster = Cluster {
        workers: file.workers,
        worker_link,
        server_link: match &file.server_link {
            Some(text) => rate("server_link", text)?,
            None => worker_link,
        },
        rtt: time("rtt", file.rtt.as_deref(), "100us")?,
        compute: time("compute", file.compute.as_deref(), "10ms")?,
        cores: file.cores.unwrap_or_else(this_hosts_cores),
    };
    Ok(Resources {
        cluster,
        server_hosts: file.server_hosts,
    })
}

/// Sets the source of constant `index` (in [`Constants`]'s order).
fn set_source(constants: &mut Constants, index: usize, source: String) {
    if constants.sources.len() <= index {
        constants.sources.resize(index + 1, "given".to_string());
    }
    constants.sources[index] = source;
}

/// The constants of a plan file (or a file holding only them).
///
/// # Errors
/// The file cannot be read, or holds no constants.
pub fn read_constants(path: &std::path::Path) -> anyhow::Result<Constants> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --constants {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--constants {}: not JSON", path.display()))?;
    let constants = value.get("constants").cloned().unwrap_or(value);
    let constants: Constants = serde_json::from_value(constants).with_context(|| {
        format!(
            "--constants {}: not a plan file's constants (request_seconds, worker_bytes_per_sec, apply_bytes_per_sec, link_efficiency, sources, and optionally server_bytes_per_sec)",
            path.display()
        )
    })?;
    Ok(constants.with_known_sources())
}

/// Writes `plan` as pretty JSON to `path`.
///
/// # Errors
/// The file cannot be written.
pub fn write_plan(plan: &Plan, path: &PathBuf) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(plan)?;
    std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Reads a plan file.
///
/// # Errors
/// The file cannot be read, or is not a plan.
pub fn read_plan(path: &std::path::Path) -> anyhow::Result<Plan> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the plan {}", path.display()))?;
    let mut plan: Plan = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a plan file", path.display()))?;
    plan.constants = plan.constants.with_known_sources();
    Ok(plan)
}

/// When and on which host the plan was made.
fn made_note() -> String {
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{date} on {}", host.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("resources.json");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_resources_file_reads_as_the_flags_would_and_bad_fields_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let given = r#"{"workers": 4, "link": "10gbit", "server_link": "25gbit",
            "rtt": "200us", "compute": "40ms", "server_hosts": 2, "cores": 16}"#;
        let read = read_resources(&file(&dir, given)).unwrap();
        assert_eq!(read.server_hosts, Some(2));
        let c = read.cluster;
        assert_eq!((c.workers, c.cores), (4, 16));
        assert!((c.worker_link - 1.25e9).abs() < 1.0 && (c.server_link - 3.125e9).abs() < 1.0);
        assert!((c.rtt - 200e-6).abs() < 1e-12 && (c.compute - 0.04).abs() < 1e-12);
        let least = read_resources(&file(&dir, r#"{"workers": 2, "link": "1gbit"}"#)).unwrap();
        assert_eq!(least.cluster.server_link, least.cluster.worker_link);
        assert_eq!(least.server_hosts, None);
        for (text, named) in [
            (r#"{"workers": 2, "link": "fast"}"#, "link \"fast\""),
            (r#"{"workers": 2, "link": "1gbit", "rtt": "soon"}"#, "rtt"),
            (r#"{"workers": 0, "link": "1gbit"}"#, "workers"),
            (
                r#"{"workers": 2, "link": "1gbit", "gpus": 1}"#,
                "server_hosts and cores",
            ),
        ] {
            let error = format!("{:#}", read_resources(&file(&dir, text)).unwrap_err());
            assert!(error.contains(named), "{text}: {error}");
        }
    }
}
