//! The Kubernetes manifests (`deploy/kubernetes`), checked without a cluster:
//! both overlays render with `kubectl kustomize`, every container's flags and
//! `PS_*` variables are ones its binary accepts (read from its `--help`), and
//! ports, probes, Services and the addresses in arguments agree with each other.
//! Skipped, with a message, where `kubectl` is not installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};

use ps_common::processes::binary;
use serde_json::Value;

const OVERLAYS: [&str; 2] = ["cpu-small", "gpu"];

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn kubectl(args: &[&str], input: Option<&str>) -> String {
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    if let Some(input) = input {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write to kubectl");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl ran");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The objects an overlay renders to, as JSON (converted by `kubectl` itself,
/// offline, so no YAML parser is needed here).
fn rendered(overlay: &str) -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/overlays");
    let yaml = kubectl(&["kustomize", &root.join(overlay).to_string_lossy()], None);
    let json = kubectl(
        &["label", "--local", "-f", "-", "-o", "json", "rendered=yes"],
        Some(&yaml),
    );
    // One JSON object after another, or one List holding them.
    let mut objects = Vec::new();
    for value in serde_json::Deserializer::from_str(&json).into_iter::<Value>() {
        let value = value.expect("kubectl printed JSON");
        match value["kind"].as_str() {
            Some("List") => objects.extend(value["items"].as_array().expect("items").clone()),
            _ => objects.push(value),
        }
    }
    objects
}

/// The flags and `PS_*` variables a binary accepts, from its `--help`.
#[derive(Debug, Default)]
struct Accepted {
    flags: BTreeSet<String>,
    variables: BTreeSet<String>,
}

fn accepted(binary_name: &str) -> Accepted {
    let out = Command::new(binary(binary_name))
        .arg("--help")
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let mut accepted = Accepted::default();
    for word in help.split(|c: char| c.is_whitespace() || c == ',' || c == '[') {
        let word = word.trim_end_matches([']', '.']);
        if let Some(flag) = word.strip_prefix("--") {
            let flag = flag.split(['=', '<']).next().unwrap_or_default();
            accepted.flags.insert(flag.to_string());
        }
    }
    for piece in help.split("[env: ").skip(1) {
        let name = piece.split('=').next().unwrap_or_default();
        accepted.variables.insert(name.to_string());
    }
    accepted
}

/// The binary an image runs.
fn binary_of(image: &str) -> &'static str {
    let name = image.split(':').next().unwrap_or_default();
    match name {
        "candle-ps/scheduler" => "ps-scheduler",
        "candle-ps/server" => "ps-server",
        "candle-ps/worker" | "candle-ps/worker-cuda" => "ps-worker",
        other => panic!("no binary is known for image {other}"),
    }
}

/// The strings of a JSON array.
fn strings(value: &Value) -> Vec<String> {
    items(value)
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// The elements of a JSON array (none when `value` is not one).
fn items(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// The port of `HOST:PORT`.
fn port_of(addr: &str) -> Option<u64> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// The objects the checks look across.
struct Manifests<'a> {
    config_maps: BTreeMap<&'a str, Vec<String>>,
    services: Vec<&'a Value>,
    workloads: Vec<&'a Value>,
}

impl<'a> Manifests<'a> {
    fn of(objects: &'a [Value]) -> Self {
        let of_kind = |kinds: &[&str]| -> Vec<&'a Value> {
            objects
                .iter()
                .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
                .collect()
        };
        let config_maps = of_kind(&["ConfigMap"])
            .into_iter()
            .map(|o| {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let keys = o["data"].as_object().map(|d| d.keys().cloned().collect());
                (name, keys.unwrap_or_default())
            })
            .collect();
        Self {
            config_maps,
            services: of_kind(&["Service"]),
            workloads: of_kind(&["Deployment", "StatefulSet", "Job"]),
        }
    }
}

/// Every problem found in the rendered objects.
fn problems(objects: &[Value], binaries: &BTreeMap<&str, Accepted>) -> Vec<String> {
    let manifests = Manifests::of(objects);
    let mut problems = Vec::new();
    for workload in &manifests.workloads {
        for container in items(&workload["spec"]["template"]["spec"]["containers"]) {
            problems.extend(container_problems(
                &manifests, workload, container, binaries,
            ));
        }
    }
    problems.extend(service_problems(&manifests));
    problems
}

/// What is wrong with one container: flags and variables its binary does not
/// take, variables its arguments use but nothing sets, probes and listeners on
/// ports it does not open, addresses that name no Service.
fn container_problems(
    manifests: &Manifests<'_>,
    workload: &Value,
    container: &Value,
    binaries: &BTreeMap<&str, Accepted>,
) -> Vec<String> {
    let program = binary_of(container["image"].as_str().unwrap_or_default());
    let accepts = &binaries[program];
    let at = format!(
        "{} {} ({program})",
        workload["kind"].as_str().unwrap_or_default(),
        workload["metadata"]["name"].as_str().unwrap_or_default()
    );
    let args = strings(&container["args"]);
    let ports: Vec<u64> = items(&container["ports"])
        .filter_map(|p| p["containerPort"].as_u64())
        .collect();
    let mut problems = Vec::new();

    for arg in &args {
        let Some(flag) = arg.strip_prefix("--") else {
            problems.push(format!("{at}: argument {arg:?} is not a --flag"));
            continue;
        };
        let flag = flag.split('=').next().unwrap_or_default();
        if !accepts.flags.contains(flag) {
            problems.push(format!("{at}: {program} has no flag --{flag}"));
        }
        if let Some(listen) = arg.strip_prefix("--listen=")
            && !port_of(listen).is_some_and(|port| ports.contains(&port))
        {
            problems.push(format!("{at}: listens on {listen}, not a declared port"));
        }
        for flag in ["--scheduler=", "--advertise="] {
            if let Some(addr) = arg.strip_prefix(flag) {
                problems.extend(check_address(&at, addr, &manifests.services));
            }
        }
    }

    let mut variables: BTreeSet<String> = items(&container["env"])
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    for source in items(&container["envFrom"]) {
        let map = source["configMapRef"]["name"].as_str().unwrap_or_default();
        match manifests.config_maps.get(map) {
            Some(keys) => variables.extend(keys.iter().cloned()),
            None => problems.push(format!("{at}: no ConfigMap {map}")),
        }
    }
    for variable in variables.iter().filter(|v| v.starts_with("PS_")) {
        if !accepts.variables.contains(variable) {
            problems.push(format!("{at}: {program} reads no {variable}"));
        }
    }
    for reference in args.iter().flat_map(|arg| arg.split("$(").skip(1)) {
        let variable = reference.split(')').next().unwrap_or_default();
        let set_by_kubernetes =
            variable == "JOB_COMPLETION_INDEX" && workload["spec"]["completionMode"] == "Indexed";
        if !variables.contains(variable) && !set_by_kubernetes {
            problems.push(format!("{at}: $({variable}) is never set"));
        }
    }

    for probe in ["readinessProbe", "livenessProbe"] {
        let command = strings(&container[probe]["exec"]["command"]);
        if command.is_empty() {
            continue;
        }
        if command[0] != format!("/{program}")
            || command.get(1).map(String::as_str) != Some("health")
        {
            problems.push(format!(
                "{at}: {probe} runs {command:?}, not /{program} health"
            ));
        }
        let probed = command
            .iter()
            .skip_while(|a| *a != "--server")
            .nth(1)
            .and_then(|addr| port_of(addr));
        if !probed.is_some_and(|port| ports.contains(&port)) {
            problems.push(format!(
                "{at}: {probe} checks a port the container does not open"
            ));
        }
    }
    problems
}

/// What is wrong with the Services: one that selects no pods or targets a port
/// no selected container names, and a StatefulSet without its headless Service.
fn service_problems(manifests: &Manifests<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    for service in &manifests.services {
        let name = service["metadata"]["name"].as_str().unwrap_or_default();
        let selector = service["spec"]["selector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let selected: Vec<&&Value> = manifests
            .workloads
            .iter()
            .filter(|w| {
                let labels = &w["spec"]["template"]["metadata"]["labels"];
                !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v)
            })
            .collect();
        if selected.is_empty() {
            problems.push(format!("Service {name} selects no workload's pods"));
        }
        for target in items(&service["spec"]["ports"]).filter_map(|p| p["targetPort"].as_str()) {
            let named = selected.iter().all(|w| {
                items(&w["spec"]["template"]["spec"]["containers"])
                    .flat_map(|c| items(&c["ports"]))
                    .any(|p| p["name"] == target)
            });
            if !named {
                problems.push(format!(
                    "Service {name}: no selected container opens a port named {target}"
                ));
            }
        }
    }
    for set in manifests
        .workloads
        .iter()
        .filter(|w| w["kind"] == "StatefulSet")
    {
        let governing = set["spec"]["serviceName"].as_str().unwrap_or_default();
        let headless = manifests
            .services
            .iter()
            .any(|s| s["metadata"]["name"] == governing && s["spec"]["clusterIP"] == "None");
        if !headless {
            problems.push(format!(
                "StatefulSet's serviceName {governing} is no headless Service"
            ));
        }
    }
    problems
}

/// `addr` (`NAME:PORT` or `$(POD_NAME).NAME.$(POD_NAMESPACE).svc:PORT`) names a
/// Service that has that port.
fn check_address(at: &str, addr: &str, services: &[&Value]) -> Vec<String> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let port = port_of(addr).unwrap_or(0);
    let service = match host.split('.').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [_pod, name, ..] => *name,
        _ => host,
    };
    let found = services.iter().any(|s| {
        s["metadata"]["name"] == service
            && items(&s["spec"]["ports"]).any(|p| p["port"].as_u64() == Some(port))
    });
    if found {
        Vec::new()
    } else {
        vec![format!(
            "{at}: {addr} names no Service {service} with port {port}"
        )]
    }
}

#[test]
fn both_overlays_render_and_every_flag_variable_port_and_service_agrees() {
    if !kubectl_available() {
        eprintln!("skipped: kubectl is not installed (apt-get install kubernetes-client)");
        return;
    }
    let binaries: BTreeMap<&str, Accepted> = ["ps-scheduler", "ps-server", "ps-worker"]
        .into_iter()
        .map(|b| (b, accepted(b)))
        .collect();
    assert!(
        binaries["ps-server"].flags.contains("push-buffer"),
        "--help was read"
    );
    assert!(binaries["ps-server"].variables.contains("PS_TOKEN_FILE"));

    for overlay in OVERLAYS {
        let objects = rendered(overlay);
        let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in [
            "Deployment",
            "StatefulSet",
            "Job",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ] {
            assert!(kinds.contains(kind), "{overlay} renders no {kind}");
        }
        let found = problems(&objects, &binaries);
        assert!(found.is_empty(), "{overlay}:\n{}", found.join("\n"));

        // The check itself: a misspelled flag, an unknown variable and a probe
        // of a port nobody opens are each caught.
        let mut spoilt = objects.clone();
        let server = spoilt
            .iter_mut()
            .find(|o| o["kind"] == "StatefulSet")
            .expect("servers");
        let container = &mut server["spec"]["template"]["spec"]["containers"][0];
        container["args"][0] = Value::from("--lisen=0.0.0.0:7070");
        container["env"]
            .as_array_mut()
            .expect("env")
            .push(serde_json::json!({"name": "PS_MEMORY_BUGDET", "value": "1GiB"}));
        container["readinessProbe"]["exec"]["command"][3] = Value::from("127.0.0.1:7071");
        let found = problems(&spoilt, &binaries).join("\n");
        for needle in [
            "no flag --lisen",
            "reads no PS_MEMORY_BUGDET",
            "readinessProbe checks a port",
        ] {
            assert!(
                found.contains(needle),
                "{overlay}: {needle:?} not caught in:\n{found}"
            );
        }
    }

    // The GPU overlay asks for a GPU and runs the CUDA build on it.
    let gpu = rendered("gpu");
    let job = gpu.iter().find(|o| o["kind"] == "Job").expect("workers");
    let worker = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(worker["resources"]["limits"]["nvidia.com/gpu"], 1);
    assert!(strings(&worker["args"]).contains(&"--device=cuda:0".to_string()));
    assert!(
        worker["image"]
            .as_str()
            .unwrap_or_default()
            .starts_with("candle-ps/worker-cuda")
    );
}
