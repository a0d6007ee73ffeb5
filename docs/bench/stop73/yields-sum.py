"""Lists yields.sh's runs: examples/s, worker 0's compute µs a step, the
run's examples/s against its compute-only floor (both workers' batches in
one compute time: what the job would do with no exchange at all), and the
run's sched_yield and epoll_wait calls per step (both workers) and CPU ms."""
import glob, json, os, re, sys

for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(f))
    w = d["per_worker"][0]
    steps = w["steps"]
    compute_us = w["time_split"]["compute"]["seconds"] / steps * 1e6
    floor = w["batch_size"] * len(d["per_worker"]) / (compute_us * 1e-6)
    counts = {}
    for line in open(f[:-5] + ".stat"):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0].replace(".", "").isdigit():
            counts[parts[2]] = float(parts[0])
    print("%-10s %4.0fk compute %3.0f us  of floor %.2f  sched_yield %5.1f/step  epoll_wait %5.1f/step  cpu %5.0f ms" % (
        os.path.basename(f)[:-5], d["examples_per_second"] / 1e3,
        compute_us, d["examples_per_second"] / floor,
        counts.get("syscalls:sys_enter_sched_yield", 0) / steps,
        counts.get("syscalls:sys_enter_epoll_wait", 0) / steps,
        counts.get("task-clock", 0)))
