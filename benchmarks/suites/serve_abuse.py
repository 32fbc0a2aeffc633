"""tr-autotune serve under abuse: ordinary closed-loop clients' throughput with and without abusive clients
beside them, on one server (127.0.0.1, an ephemeral port), and the slots left after each run.

The server: R2R p = 0.35, L = (6.0, 27.9) ms, eager, N = 8 admitted, time scale 1, limits lowered so that the
abuse hits them (--max-waiting 4, --body-timeout-s 1, --request-deadline-s 30).  Ordinary load: 4 closed-loop
clients (profiler.serve_bench.run_phase, 32-token requests).  Abusers (threads, each in a loop): a huge request
(2000 tokens) whose client hangs up 0.2 s later; a body that never completes (held past the body timeout);
malformed JSON; a 200-deep nested body; a burst of 12 huge requests that hang up at once (past the waiting
limit).  The two runs alternate (repeats), medians; leaked slots = admission slots not free once the server is
idle again (N - admission_free, plus requests still in flight or waiting)."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

TITLE = "tr-autotune serve: ordinary clients' throughput beside abusive clients, and slots leaked"
TOPIC = "runtime"
COMMAND = "python benchmarks/run.py serve_abuse"
COLUMNS = ["run", "repeats", "normal_tok_s", "normal_ci95_tok_s", "vs_no_abuse", "abusive_requests",
           "disconnected", "status_4xx_5xx", "leaked_slots"]
NOTES = ("normal_tok_s: median over repeats of the 4 ordinary clients' throughput (serve-bench's client-side "
         "estimate, 95 % interval by batch means of the median run); vs_no_abuse = its ratio to the no-abuse run "
         "(target >= 0.90); abusive_requests: abusive connections opened during the window (median); "
         "disconnected: requests cancelled because their client hung up; status_4xx_5xx: error answers counted "
         "by the server; leaked_slots: must be 0.")

N_SERVER, N_NORMAL = 8, 4
ARGS = ["--eager", "--N", str(N_SERVER), "--p", "0.35", "--L", "6.0", "27.9", "--time-scale", "1",
        "--max-waiting", "4", "--body-timeout-s", "1", "--request-deadline-s", "30", "--max-json-depth", "32"]


def _start():
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "serve", "--port", "0", *ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, line.split(" on ")[-1].strip()


def _health(url):
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())


def _abusers(host, port, stop: threading.Event, counter: list):
    huge = json.dumps({"prompt": "x", "max_tokens": 2000}).encode()
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(huge), huge)

    def conn(data, hold_s):
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(data)
            counter.append(1)
            if stop.wait(hold_s):
                pass
            s.close()
        except OSError:
            pass

    def hang_up():
        while not stop.is_set():
            conn(req, 0.2)

    def slow_body():
        while not stop.is_set():
            conn(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{", 1.5)

    def malformed():
        bad = [b"{not json", b"[" * 200 + b"]" * 200, b'{"prompt": "x", "max_tokens": 1e400}']
        k = 0
        while not stop.is_set():
            b = bad[k % len(bad)]
            conn(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (len(b), b), 0.05)
            k += 1

    def burst():
        while not stop.is_set():
            ts = [threading.Thread(target=conn, args=(req, 0.1)) for _ in range(12)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            stop.wait(0.5)

    return [threading.Thread(target=f, daemon=True) for f in (hang_up, slow_body, malformed, burst)]


def _one(url, abuse: bool, duration_s: float) -> dict:
    from profiler import serve_bench as sb
    host, port = url.split("//")[1].split(":")
    port = int(port)
    t = sb.Target("http", host, port, "", "completions", "tokenrouter", 32, request_timeout_s=60.0)
    before = _health(url)
    stop, counter = threading.Event(), []
    threads = _abusers(host, port, stop, counter) if abuse else []
    for th in threads:
        th.start()
    try:
        r = sb.run_phase(t, N_NORMAL, warmup_s=1.0, duration_s=duration_s, track_server=False)
    finally:
        stop.set()
        for th in threads:
            th.join(10)
    deadline = time.monotonic() + 30
    h = _health(url)
    while (h["in_flight"] or h["waiting_admission"] or h["admission_free"] != N_SERVER) and time.monotonic() < deadline:
        time.sleep(0.1)
        h = _health(url)
    errs = sum(v for k, v in h["errors_by_status"].items()) - sum(before["errors_by_status"].values())
    return {"tok_s": r.throughput_tok_s, "ci": r.throughput_ci95_tok_s, "abusive": len(counter),
            "disconnected": h["disconnected_requests"] - before["disconnected_requests"], "errors": errs,
            "leaked": (N_SERVER - h["admission_free"]) + h["in_flight"] + h["waiting_admission"]}


def run(quick: bool) -> list[dict]:
    repeats, duration = (1, 6.0) if quick else (3, 20.0)
    proc, url = _start()
    try:
        runs = {False: [], True: []}
        for _ in range(repeats):
            for abuse in (False, True):
                runs[abuse].append(_one(url, abuse, duration))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    base = statistics.median(x["tok_s"] for x in runs[False])
    rows = []
    for abuse in (False, True):
        xs = runs[abuse]
        med = statistics.median(x["tok_s"] for x in xs)
        mid = sorted(xs, key=lambda x: x["tok_s"])[len(xs) // 2]
        rows.append({"run": "with abuse" if abuse else "no abuse", "repeats": len(xs), "normal_tok_s": med,
                     "normal_ci95_tok_s": mid["ci"], "vs_no_abuse": med / base if base > 0 else float("nan"),
                     "abusive_requests": int(statistics.median(x["abusive"] for x in xs)),
                     "disconnected": sum(x["disconnected"] for x in xs), "status_4xx_5xx": sum(x["errors"] for x in xs),
                     "leaked_slots": max(x["leaked"] for x in xs)})
    return rows


if __name__ == "__main__":   # pragma: no cover - direct run without the runner
    for row in run("--quick" in sys.argv):
        print(row)
    os._exit(0)
