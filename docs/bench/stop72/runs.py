"""What summary.py and tried.py read from a run: a procs.sh run's two worker
summaries, or a ps-local summary, as (examples/s, worker 0's step split)."""
import json


def split(w):
    """A worker summary's compute, push, wait and pull per step, in µs."""
    n = w["steps"]
    return " ".join(f"{k} {v['seconds'] / n * 1e6:.0f}" for k, v in w["time_split"].items()
                    if k in ("compute", "push", "wait", "pull"))


def processes(w0_path):
    """A procs.sh run from its worker 0 file: both workers' examples/s."""
    ws = [json.load(open(w0_path.replace("-w0", f"-w{i}"))) for i in (0, 1)]
    return sum(w["examples_per_second"] for w in ws), split(ws[0])


def local(path):
    """A ps-local run: its examples/s."""
    j = json.load(open(path))
    return j["examples_per_second"], split(j["per_worker"][0])
