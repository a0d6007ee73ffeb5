//! The `ps-scheduler plan` command's flags, and running it: read the
//! inputs, plan, print the table (or JSON, or the explanation), and write
//! the plan file.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ps_common::rate::LinkRate;

use super::{Choices, Cluster, Constants, ModelShapes, Plan, explain, plan};

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
        let constants = match &self.constants {
            Some(path) => read_constants(path)?,
            None => Constants::default(),
        };
        let mut plan = plan(&model, &self.cluster(), &self.choices(), &constants)?;
        plan.made = made_note();
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

/// The constants of a plan file (or a file holding only them).
fn read_constants(path: &PathBuf) -> anyhow::Result<Constants> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --constants {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--constants {}: not JSON", path.display()))?;
    let constants = value.get("constants").cloned().unwrap_or(value);
    serde_json::from_value(constants).with_context(|| {
        format!(
            "--constants {}: not a plan file's constants (request_seconds, worker_bytes_per_sec, apply_bytes_per_sec, link_efficiency, sources)",
            path.display()
        )
    })
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
    serde_json::from_str(&text).with_context(|| format!("{} is not a plan file", path.display()))
}

/// When and on which host the plan was made.
fn made_note() -> String {
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{date} on {}", host.trim())
}
