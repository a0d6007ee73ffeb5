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
        let mut cluster = self.cluster();
        let measured = self.measure(&mut cluster, &mut constants)?;
        let mut plan = plan(&model, &cluster, &self.choices(), &constants)?;
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
            cluster.compute = calibrate::measure_compute(&widths, self.batch_size as usize)?;
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
                "compute: {:.3} ms a step of {} with batches of {}, on this host ({made})",
                cluster.compute * 1e3,
                self.model,
                self.batch_size
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
