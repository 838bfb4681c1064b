#!/usr/bin/env python3
"""Where a small run's time goes: `assay eval --gateway` over N tick records through a running mesh
(`assay up`) on the scripted backend at LATENCY ms a call, RUNS times, each step timed.

Usage: bench/breakdown.py [N] [LATENCY_MS] [RUNS]   (defaults 100 50 7; release binaries from
ASSAY_BENCH_BIN, else target/release). The CLI writes its steps (ASSAY_TIMINGS: main, runtime,
admitted, first_event, ended, exit); the backend writes each request's arrival (--arrivals); this
script adds the moments it launched and reaped the process. Prints the median of each step over the
runs after the first (the first warms the mesh's connections and caches), as a Markdown table.
"""
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
LATENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 50
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 7
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("ASSAY_BENCH_BIN") or os.path.join(ROOT, "target", "release")
work = tempfile.mkdtemp(prefix="assay-breakdown-")
arrivals = os.path.join(work, "arrivals.txt")
timings = os.path.join(work, "timings.jsonl")

backend = subprocess.Popen(
    [os.path.join(BIN, "assay-scripted-llm"), "--latency-ms", str(LATENCY), "--arrivals", arrivals],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base_url = backend.stdout.readline().strip()
records = os.path.join(work, "records.jsonl")
with open(records, "w") as f:
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "anchor", "make_records.py"), str(N)], stdout=f, check=True)

socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in socks]
for s in socks:
    s.close()
env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_API_KEY="bench", OPENAI_MODEL="scripted",
           ASSAY__CACHE__ENABLED="false", ASSAY__GATEWAY__STORE=":memory:")
for name, port in zip(["GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE"], ports):
    env[f"ASSAY__PORTS__{name}"] = str(port)
env["ASSAY__ADMIN__PORT"] = str(ports[7])
up_log = open(os.path.join(work, "up.log"), "w")
up = subprocess.Popen([os.path.join(BIN, "assay"), "up", "--backend", "openai"], env=env, stdout=up_log, stderr=up_log)
deadline = time.time() + 60
while "every service SERVING" not in open(os.path.join(work, "up.log")).read():
    if time.time() > deadline or up.poll() is not None:
        sys.exit("assay up did not start: " + open(os.path.join(work, "up.log")).read())
    time.sleep(0.05)

runs = []
try:
    for i in range(RUNS):
        launched = time.time()
        out = subprocess.run(
            [os.path.join(BIN, "assay"), "eval", "--gateway", f"http://127.0.0.1:{ports[0]}", "--preset", "tick",
             "--data", records, "--out", os.path.join(work, "out.jsonl"), "--json"],
            env=dict(env, ASSAY_TIMINGS=timings), capture_output=True, text=True)
        reaped = time.time()
        if out.returncode != 0:
            sys.exit(f"assay eval failed: {out.stderr}")
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append({"launched": launched, "reaped": reaped, "calls": summary["usage"]["calls"],
                     "pipeline_s": summary["pipelineSeconds"]})
        time.sleep(0.3)  # the mesh idle between runs, so each run's calls are its own
finally:
    up.send_signal(signal.SIGTERM)
    up.wait()
    backend.send_signal(signal.SIGTERM)
    backend.wait()

arrived = sorted(float(l) for l in open(arrivals) if l.strip())
steps = [json.loads(l) for l in open(timings)]
assert len(steps) == len(runs), (len(steps), len(runs))
latency = LATENCY / 1000
rows = {}
for run, t in zip(runs, steps):
    calls = [a for a in arrived if run["launched"] <= a <= run["reaped"]]
    assert len(calls) == run["calls"], (len(calls), run["calls"])
    moments = [("launched", run["launched"]), ("main", t["main"]), ("runtime", t["runtime"]),
               ("admitted", t["admitted"]), ("first call at the backend", calls[0]),
               ("last reply from the backend", calls[-1] + latency),
               ("run completed (the gateway's event)", t["ended_at_gateway"]),
               ("completion received (CLI)", t["completed_received"]), ("completion handled (CLI)", t["ended"]),
               ("exit", t["exit"]), ("reaped", run["reaped"])]
    for (a, ta), (b, tb) in zip(moments, moments[1:]):
        rows.setdefault(f"{a} -> {b}", []).append(tb - ta)
    rows.setdefault("whole process (launched -> reaped)", []).append(run["reaped"] - run["launched"])

critical = 2 * latency
if os.environ.get("ASSAY_BREAKDOWN_WAVES"):
    # The last run's calls by when they reached the backend, in 10 ms bins from its first.
    run = runs[-1]
    calls = [a for a in arrived if run["launched"] <= a <= run["reaped"]]
    bins = {}
    for a in calls:
        bins[int((a - calls[0]) * 100)] = bins.get(int((a - calls[0]) * 100), 0) + 1
    print("calls by 10 ms from the first:", ", ".join(f"{k * 10}ms: {v}" for k, v in sorted(bins.items())))
print(f"| step ({N} tick records, {LATENCY} ms a call, median of {RUNS - 1} runs after a first) | seconds |")
print("|---|---|")
for name, values in rows.items():
    print(f"| {name} | {statistics.median(values[1:] or values):.4f} |")
print(f"| critical path (2 calls) | {critical:.4f} |")
