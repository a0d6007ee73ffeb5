#!/usr/bin/env python3
"""The checks `scripts/gpu.sh run` makes on the GPU machine (docs/gpu.md).

Standard library only: the GPU machine has Python but nothing can be installed
there. gpu.sh unpacks the carried programs into PS_GPU_WORK and names the device
(cuda:0, or cpu for a dry run of this same script on a machine with no GPU);
every figure goes into PS_GPU_OUT/gpu.json, and the script exits non-zero when
any check fails.

  a. digits: the worker on the device against the worker on the CPU, accuracy
     within ACCURACY_TOLERANCE;
  b. a synthetic MLP large enough for the GPU to win: steps/s on each, with the
     time split of each;
  c. two workers on the device and two servers under BSP end with equal
     parameters;
  d. the share of the step spent moving gradients off the device and values
     onto it (the time split's gather and apply);
  e. b's model on the device through each data path and step shape: gRPC
     against shared memory, bf16 on the wire, a segmented backward pass, push
     then pull (no pipelining), each one's steps/s and time split;
  f. `ps-worker --probe-compute` on the device (what the planner takes as a
     step's compute) against b's measured compute a step;
  g. the host's CPUs, where the carried CPU programs are there (ps-local and
     the single_process and data_parallel examples): the small-batch figures
     of docs/benchmarks.md's shared-memory section, on more than two cores.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time

WORK = os.environ["PS_GPU_WORK"]
OUT = os.environ["PS_GPU_OUT"]
DEVICE = os.environ.get("PS_GPU_DEVICE", "cuda:0")
QUICK = os.environ.get("PS_GPU_QUICK") == "1"
BIN = os.path.join(WORK, "bin")
ACCURACY_TOLERANCE = 0.02
# The libraries the CUDA worker loads from the machine's CUDA installation
# (libcuda.so.1 comes with the driver; libcudart.so.13 is carried).
CUDA_LIBRARIES = ["libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libnvrtc.so.13"]
SERVER_READY_SECONDS = 30
WORKER_SECONDS = 240

results = {"device": DEVICE, "quick": QUICK, "checks": {}, "failures": []}


def say(text):
    print(f"gpu_run: {text}", file=sys.stderr, flush=True)


def fail(check, why):
    say(f"FAIL {check}: {why}")
    results["failures"].append(f"{check}: {why}")


def gpu_info():
    """The card's name, compute capability and driver, as nvidia-smi says."""
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as e:
        return {"error": f"nvidia-smi: {e}"}
    name, cap, driver, memory = (part.strip() for part in line.split(","))
    return {"name": name, "compute_cap": cap, "driver": driver, "memory": memory}


def cuda_library_dirs():
    """The folders of PyTorch's environment that hold the CUDA libraries."""
    roots = []
    try:
        import nvidia  # noqa: PLC0415 (only on the GPU machine)
        roots = list(nvidia.__path__)
    except ImportError:
        say("no `nvidia` Python package here: the CUDA libraries must be on the loader's path")
    dirs = []
    for root in roots:
        for folder, _, files in os.walk(root):
            if any(f in files for f in CUDA_LIBRARIES) and folder not in dirs:
                dirs.append(folder)
    return dirs


def library_path():
    dirs = [os.path.join(WORK, "lib")] + cuda_library_dirs()
    existing = os.environ.get("LD_LIBRARY_PATH")
    return ":".join(dirs + ([existing] if existing else []))


def ldd(env):
    text = subprocess.run(["ldd", os.path.join(BIN, "ps-worker")], capture_output=True,
                          text=True, env=env).stdout
    print(text, file=sys.stderr)
    return [line.split()[0] for line in text.splitlines() if "not found" in line]


class Server:
    """A CPU ps-server on a free loopback port, read until it says where it listens."""

    def __init__(self, workers, env, extra=()):
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "ps-server"), "--listen", "127.0.0.1:0", "--workers", str(workers),
             *extra],
            env={**env, "RUST_LOG": "info", "NO_COLOR": "1"},
            stderr=subprocess.PIPE, text=True,
        )
        self.log = []
        found = threading.Event()
        self.addr = None

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                match = re.search(r"ps-server listening.*?addr=(\S+)", line) or \
                    re.search(r"addr=(\S+).*ps-server listening", line)
                if match and not found.is_set():
                    self.addr = match.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(SERVER_READY_SECONDS) or self.addr is None:
            self.stop()
            raise RuntimeError("ps-server did not listen:\n" + "".join(self.log))

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def worker(servers, device, args, env, name):
    """One ps-worker run to its end; its JSON summary, or None (and a failure)."""
    command = [os.path.join(BIN, "ps-worker"), "--server", ",".join(servers),
               "--device", device, "--json", *args]
    say(f"{name}: {' '.join(command[1:])}")
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=WORKER_SECONDS)
    except subprocess.TimeoutExpired:
        fail(name, f"ps-worker ran past {WORKER_SECONDS} s")
        return None
    with open(os.path.join(OUT, f"{name}.log"), "w") as log:
        log.write(done.stderr)
    if done.returncode != 0:
        fail(name, f"ps-worker exited {done.returncode}: {done.stderr[-2000:]}")
        return None
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["process_seconds"] = time.monotonic() - started
    return summary


def run_alone(device, args, env, name):
    server = Server(1, env)
    try:
        return worker([server.addr], device, args, env, name)
    finally:
        server.stop()


def steps_per_second(summary):
    return summary["steps"] / max(summary["wall_seconds"], 1e-9)


def check_digits(env):
    epochs = ["--epochs", "3" if QUICK else "10"]
    on_device = run_alone(DEVICE, epochs, env, "a_digits_device")
    on_cpu = run_alone("cpu", epochs, env, "a_digits_cpu")
    if not (on_device and on_cpu):
        return
    gap = abs(on_device["test_accuracy"] - on_cpu["test_accuracy"])
    results["checks"]["a_digits"] = {
        "device_accuracy": on_device["test_accuracy"],
        "cpu_accuracy": on_cpu["test_accuracy"],
        "gap": gap,
        "device_time_split": on_device["time_split"],
    }
    if gap > ACCURACY_TOLERANCE:
        fail("a_digits", f"accuracy {on_device['test_accuracy']:.4f} on {DEVICE} against "
             f"{on_cpu['test_accuracy']:.4f} on cpu: more than {ACCURACY_TOLERANCE} apart")


def large_mlp_args():
    """Check b's model and data: comm-heavy (84 MB each way a step), GPU-sized;
    with --quick (a try of the script, debug programs included) a 2 MB one."""
    features, hidden, train = ("256", "1024,256", "512") if QUICK else ("1024", "4096,4096", "8192")
    return ["--dataset", "synthetic", "--synthetic-features", features, "--synthetic-classes", "10",
            "--synthetic-train", train, "--hidden", hidden, "--batch-size", "256",
            "--epochs", "1", "--optimizer", "sgd"]


def check_large_mlp(env):
    args = large_mlp_args()
    on_device = run_alone(DEVICE, args, env, "b_mlp_device")
    on_cpu = run_alone("cpu", args, env, "b_mlp_cpu")
    if not (on_device and on_cpu):
        return
    features, hidden = args[args.index("--synthetic-features") + 1], args[args.index("--hidden") + 1]
    check = {
        "model": f"mlp {features} -> {hidden.replace(',', ' -> ')} -> 10, batch 256",
        "device_steps": on_device["steps"],
        "device_steps_per_second": steps_per_second(on_device),
        "cpu_steps_per_second": steps_per_second(on_cpu),
        "device_time_split": on_device["time_split"],
        "cpu_time_split": on_cpu["time_split"],
    }
    check["speedup"] = check["device_steps_per_second"] / max(check["cpu_steps_per_second"], 1e-9)
    results["checks"]["b_large_mlp"] = check
    split = on_device["time_split"]
    results["checks"]["d_device_copies"] = {
        "gather_share": split["gather"]["share"],
        "apply_share": split["apply"]["share"],
        "copies_share": split["gather"]["share"] + split["apply"]["share"],
        "gather_seconds_per_step": split["gather"]["seconds"] / max(on_device["steps"], 1),
        "apply_seconds_per_step": split["apply"]["seconds"] / max(on_device["steps"], 1),
    }


# Check e's variants of b's run on the device, each against its own server.
DATA_PATH_VARIANTS = {
    "grpc": ["--data-path", "grpc"],
    # Over shared memory the worker lowers its priority by 5 (ps-worker
    # --yield-to-servers); the gRPC row keeps its own.
    "shm": ["--data-path", "shm"],
    "shm_bf16": ["--data-path", "shm", "--wire-dtype", "bf16"],
    "shm_3_segments": ["--data-path", "shm", "--backward-segments", "3"],
    "shm_push_then_pull": ["--data-path", "shm", "--no-pipeline"],
}


def check_data_paths(env):
    rows = {}
    for name, extra in DATA_PATH_VARIANTS.items():
        summary = run_alone(DEVICE, large_mlp_args() + extra, env, f"e_{name}")
        if summary is None:
            continue
        split = summary["time_split"]
        steps = max(summary["steps"], 1)
        rows[name] = {
            "flags": " ".join(extra),
            "steps_per_second": steps_per_second(summary),
            "ms_per_step": {part: 1000 * split[part]["seconds"] / steps for part in split},
        }
    check = {"model": "check b's", "variants": rows}
    if "grpc" in rows and "shm" in rows:
        check["shm_over_grpc"] = rows["shm"]["steps_per_second"] / rows["grpc"]["steps_per_second"]
    if "shm" in rows and "shm_bf16" in rows:
        check["bf16_over_f32"] = rows["shm_bf16"]["steps_per_second"] / rows["shm"]["steps_per_second"]
    results["checks"]["e_data_paths"] = check


def check_compute_probe(env):
    command = [os.path.join(BIN, "ps-worker"), "--probe-compute", "--device", DEVICE,
               *large_mlp_args()]
    say(f"f_compute_probe: {' '.join(command[1:])}")
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=WORKER_SECONDS)
    if done.returncode != 0:
        fail("f_compute_probe", f"ps-worker exited {done.returncode}: {done.stderr[-2000:]}")
        return
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    check = {"probe_step_seconds": probe["step_seconds"], "device": probe["device"]}
    measured = results["checks"].get("b_large_mlp")
    if measured:
        # The mean over b's steps, its first step included.
        split = measured["device_time_split"]["compute"]
        steps = measured.get("device_steps", 0)
        if steps:
            check["b_compute_seconds_per_step"] = split["seconds"] / steps
    results["checks"]["f_compute_probe"] = check
    if not probe["step_seconds"] > 0:
        fail("f_compute_probe", f"a step's compute timed as {probe['step_seconds']}")


def timed_run(command, env, name, timeout=WORKER_SECONDS):
    """Wall seconds of one program's run to its end, or None (and a failure)."""
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(name, f"{os.path.basename(command[0])} ran past {timeout} s")
        return None, ""
    took = time.monotonic() - started
    with open(os.path.join(OUT, f"{name}.log"), "w") as log:
        log.write(done.stderr)
    if done.returncode != 0:
        fail(name, f"{os.path.basename(command[0])} exited {done.returncode}: {done.stderr[-2000:]}")
        return None, done.stdout
    return took, done.stdout


SCALE_UP_PROGRAMS = ["ps-local", "single_process", "data_parallel"]


def check_scale_up_host(env):
    if not all(os.path.exists(os.path.join(BIN, p)) for p in SCALE_UP_PROGRAMS):
        say(f"g_scale_up_host: skipped, {', '.join(SCALE_UP_PROGRAMS)} not all carried")
        return
    cpu = {**env, "CUDA_VISIBLE_DEVICES": ""}
    # candle's and rayon's threads: one per core by default, and two, the cores
    # docs/benchmarks.md's figures were measured on.
    results["checks"]["g_scale_up_host"] = {
        "cores": os.cpu_count(),
        "default_threads": scale_up_figures(cpu),
        "two_threads": scale_up_figures({**cpu, "RAYON_NUM_THREADS": "2"}),
    }


def scale_up_figures(cpu):
    """single_process, data_parallel (shm, gRPC) and ps-local (shm, gRPC) on digits."""
    rounds = 1 if QUICK else 3
    check = {"single_process_seconds": [],
             "data_parallel_seconds": {"shm": [], "grpc": []},
             "ps_local_examples_per_second": {"shm": [], "grpc": []}}
    for _ in range(rounds):
        took, _ = timed_run([os.path.join(BIN, "single_process")], cpu, "g_single_process")
        if took is not None:
            check["single_process_seconds"].append(took)
        for path in ("shm", "grpc"):
            server = Server(1, cpu, ["--data-path", path])
            try:
                took, _ = timed_run([os.path.join(BIN, "data_parallel"), server.addr], cpu,
                                    f"g_data_parallel_{path}")
            finally:
                server.stop()
            if took is not None:
                check["data_parallel_seconds"][path].append(took)
            took, out = timed_run([os.path.join(BIN, "ps-local"), "--data-path", path, "--json"],
                                  cpu, f"g_ps_local_{path}")
            if took is not None and out.strip():
                summary = json.loads(out.strip().splitlines()[-1])
                check["ps_local_examples_per_second"][path].append(summary["examples_per_second"])
    single = check["single_process_seconds"]
    if single and all(check["data_parallel_seconds"].values()):
        best = min(single)
        check["data_parallel_over_single"] = {
            path: min(times) / best for path, times in check["data_parallel_seconds"].items()}
    local = check["ps_local_examples_per_second"]
    if local["shm"] and local["grpc"]:
        check["ps_local_shm_over_grpc"] = max(local["shm"]) / max(local["grpc"])
    return check


def bsp_pair(servers, env):
    """Two workers on the device against `servers`, at once; their summaries."""
    addrs = [s.addr for s in servers]
    epochs = "2" if QUICK else "5"
    summaries = [None, None]

    def one(rank):
        saved = os.path.join(OUT, f"c_worker{rank}.safetensors")
        try:
            summaries[rank] = worker(addrs, DEVICE, ["--epochs", epochs, "--save", saved],
                                     env, f"c_bsp_worker{rank}")
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            fail(f"c_bsp_worker{rank}", repr(e))

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summaries


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_bsp_pair(env):
    servers = []
    try:
        for _ in range(2):
            servers.append(Server(2, env))
        summaries = bsp_pair(servers, env)
    finally:
        for server in servers:
            server.stop()
    if None in summaries:
        fail("c_bsp_pair", "a worker of the pair did not finish (its log is in $OUT)")
        return
    saved = [os.path.join(OUT, f"c_worker{rank}.safetensors") for rank in range(2)]
    digests = [digest(p) for p in saved]
    results["checks"]["c_bsp_pair"] = {
        "servers": 2, "workers": 2, "steps": [s["steps"] for s in summaries],
        "accuracy": [s["test_accuracy"] for s in summaries],
        "parameters_sha256": digests, "equal": digests[0] == digests[1],
    }
    for p in saved:
        os.remove(p)
    if digests[0] != digests[1]:
        fail("c_bsp_pair", "the two workers ended with different parameters")


def main():
    os.makedirs(OUT, exist_ok=True)
    results["gpu"] = gpu_info()
    say(f"GPU: {results['gpu']}")
    env = {**os.environ, "LD_LIBRARY_PATH": library_path()}
    if DEVICE.startswith("cuda"):
        missing = ldd(env)
        results["unresolved_libraries"] = missing
        if missing:
            fail("libraries", f"the worker's libraries {missing} are not found")
        if "error" in results["gpu"]:
            fail("gpu", results["gpu"]["error"])
    if not results["failures"]:
        started = time.monotonic()
        for check in (check_digits, check_large_mlp, check_bsp_pair, check_data_paths,
                      check_compute_probe, check_scale_up_host):
            try:
                check(env)
            except (RuntimeError, OSError, KeyError, ValueError, IndexError, TypeError,
                    subprocess.SubprocessError) as e:
                fail(check.__name__, repr(e))
        results["seconds"] = time.monotonic() - started
    with open(os.path.join(OUT, "gpu.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    say("every check passed" if not results["failures"] else
        f"{len(results['failures'])} check(s) failed")
    return 0 if not results["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
