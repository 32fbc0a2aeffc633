"""tr-autotune serve against abusive clients (127.0.0.1 only, ephemeral ports, every wait bounded): each abuse is
answered with an OpenAI-style JSON error and one log line, never a traceback; a client that disconnects frees
its slot; a reload the start-up would refuse is refused; shutdown answers running requests with JSON 503 and
exits 0; Ctrl-C / SIGTERM during tr-autotune measure leave no 'Event loop is closed' traceback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import tr_model

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

SPEC = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.pathsep
           + os.environ.get("PYTHONPATH", ""))
LIMITS = ["--max-tokens-limit", "3000", "--max-prompt-tokens", "64", "--max-body-bytes", "6000",
          "--max-json-depth", "8", "--max-waiting", "2", "--request-deadline-s", "4", "--body-timeout-s", "1"]
EAGER = ["--eager", "--N", "2", "--p", "0.35", "--L", "6.0", "27.9"]


def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _server(args, timeout_s=60):
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "serve", "--port", "0", *args],
                            preexec_fn=_sigint_default, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    box = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout_s)
    try:
        assert box and "http://" in box[0], (box, proc.poll())
        yield proc, box[0].split(" on ")[-1].strip()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def _host_port(url):
    host, port = url.split("//")[1].split(":")
    return host, int(port)


def _raw(url, data: bytes, *, read=True, timeout=15):
    """Send raw bytes; (status, parsed JSON body) of the answer, or the open socket when read=False."""
    s = socket.create_connection(_host_port(url), timeout=timeout)
    s.sendall(data)
    if not read:
        return s
    with s:
        buf = b""
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            buf += b
            head, _, body = buf.partition(b"\r\n\r\n")
            if _ and b"content-length:" in head.lower():
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= n:
                    break
    head, _, body = buf.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body)


def _post_bytes(url, path, body: bytes, extra_headers=b""):
    return _raw(url, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + extra_headers + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                + body)


def _post(url, path, doc):
    return _post_bytes(url, path, json.dumps(doc).encode())


def _get(url, path):
    with urllib.request.urlopen(url + path, timeout=15) as r:
        return json.loads(r.read())


def _wait(pred, url, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    doc = _get(url, "/health")
    while not pred(doc) and time.monotonic() < deadline:
        time.sleep(0.05)
        doc = _get(url, "/health")
    return doc


def _is_error(st_doc, status, param=None, code=None):
    st, doc = st_doc
    assert st == status, st_doc
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), doc
    if param is not None:
        assert err["param"] == param, doc
    if code is not None:
        assert err["code"] == code, doc


def _idle(doc, N=2):
    return doc["in_flight"] == 0 and doc["waiting_admission"] == 0 and doc["admission_free"] == N


def test_abusive_requests_get_json_errors_and_leak_nothing():
    with _server(EAGER + LIMITS) as (proc, url):
        h = _get(url, "/health")
        assert h["limits"] == {"max_tokens": 3000, "max_prompt_tokens": 64, "max_body_bytes": 6000,
                               "max_json_depth": 8, "max_waiting": 2, "request_deadline_s": 4.0,
                               "body_timeout_s": 1.0, "max_concurrency": 2}
        C = "/v1/completions"
        # limits
        _is_error(_post(url, C, {"prompt": "x", "max_tokens": 10 ** 6}), 422, "max_tokens", "max_tokens_too_large")
        _is_error(_post(url, C, {"prompt": "x" * 65, "max_tokens": 1}), 413, "prompt", "prompt_too_long")
        _is_error(_post(url, C, {"prompt": list(range(65)), "max_tokens": 1}), 413, "prompt")
        _is_error(_post(url, "/v1/chat/completions", {"messages": [{"role": "u", "content": "y" * 80}]}), 413,
                  "messages")
        _is_error(_post_bytes(url, C, b" " * 7000), 413, code="body_too_large")          # by Content-Length
        chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        chunked += b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(8)) + b"0\r\n\r\n"
        _is_error(_raw(url, chunked), 413, code="body_too_large")                         # no Content-Length
        _is_error(_post_bytes(url, C, b'{"prompt": "x", "e": ' + b"[" * 3900), 422, code="too_deep")  # cut, deep
        _is_error(_post_bytes(url, C, b'{"prompt": "x", "e": ' + b"[" * 20 + b"]" * 20 + b"}"), 422, code="too_deep")
        _is_error(_post_bytes(url, C, b"[" * 2000 + b"]" * 2000), 422, code="too_deep")  # deeper than the parser
        # malformed values
        for body in (b"\xff\xfe{}", b"", b"[1, 2]", b'{"prompt": "x", "max_tokens": NaN}',
                     b'{"prompt": "x", "max_tokens": 1e400}', b'{"prompt": "x", "max_tokens": ' + b"9" * 4400 + b"}",
                     b'{"prompt": "x", "max_tokens": -3}', b'{"prompt": [[1]]}', b'{"prompt": [1, 99999]}',
                     b'{"prompt": "x", "stream": true}', b'{"prompt": null}', b'{"prompt": "x", "n": 3}'):
            _is_error(_post_bytes(url, C, body), 400)
        _is_error(_post(url, "/v1/chat/completions", {"messages": [{"role": "u", "content": [1, 2]}]}), 400,
                  "messages[0].content")
        _is_error(_post(url, "/v1/chat/completions", {"messages": [{"content": "no role"}]}), 400, "messages")
        _is_error(_raw(url, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 404)
        _is_error(_raw(url, b"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405)
        st, doc = _post(url, C, {"prompt": "x", "max_tokens": 2, "model": "m" * 3000})
        assert st == 200 and doc["model"] == "tokenrouter"       # an absurd model name is not echoed
        # a body slower than --body-timeout-s: 408
        s = _raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", read=False)
        with s:
            s.settimeout(15)
            data = s.recv(65536)
            while b'"code"' not in data:
                more = s.recv(65536)
                if not more:
                    break
                data += more
        assert b" 408 " in data.split(b"\r\n")[0] and b'"body_timeout"' in data
        # fewer bytes than Content-Length, then hang up: one log line, nothing leaked
        s = _raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"pro", read=False)
        s.close()
        # a huge request whose client hangs up while it runs: cancelled, slot freed, counted
        s = _raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n"
                 + json.dumps({"prompt": "x", "max_tokens": 2999}).encode().ljust(40), read=False)
        assert _wait(lambda d: d["in_flight"] == 1, url)["in_flight"] == 1
        s.close()
        h = _wait(lambda d: d["disconnected_requests"] >= 1 and _idle(d), url)
        assert h["disconnected_requests"] == 1 and h["cancelled_requests"] >= 1 and _idle(h), h
        # a burst past --max-waiting: 2 admitted, 2 waiting, the rest 429; all hang up; nothing leaked
        body = json.dumps({"prompt": "x", "max_tokens": 2999}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
               + b"\r\n\r\n" + body)
        socks = []
        for _ in range(4):
            socks.append(_raw(url, req, read=False))
            time.sleep(0.1)
        h = _wait(lambda d: d["in_flight"] == 2 and d["waiting_admission"] == 2, url)
        assert (h["in_flight"], h["waiting_admission"]) == (2, 2), h
        _is_error(_post(url, C, {"prompt": "x", "max_tokens": 5}), 429, code="too_many_waiting")
        for s in socks:
            s.close()
        h = _wait(lambda d: d["disconnected_requests"] >= 5 and _idle(d), url)
        assert h["disconnected_requests"] == 5 and _idle(h), h
        # past the deadline: 504 and the runtime request cancelled
        _is_error(_post(url, C, {"prompt": "x", "max_tokens": 2999}), 504, code="deadline_exceeded")
        h = _wait(lambda d: _idle(d), url)
        assert _idle(h) and h["deadline_exceeded_requests"] == 1
        # still serving normally, every error counted
        st, doc = _post(url, C, {"prompt": "ok", "max_tokens": 3})
        assert st == 200 and doc["usage"]["completion_tokens"] == 3
        h = _get(url, "/health")
        assert h["status"] == "ok" and h["errors_by_status"]["400"] >= 14 and h["errors_by_status"]["429"] == 1
        assert proc.poll() is None
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err and "Exception in ASGI" not in err, err
    assert "serve: 422 POST /v1/completions" in err and "serve: 499" in err


def test_shutdown_answers_running_requests_with_json_503_and_exits_0():
    with _server(EAGER + ["--shutdown-timeout-s", "0.5"]) as (proc, url):
        box = []
        t = threading.Thread(target=lambda: box.append(_post(url, "/v1/completions",
                                                             {"prompt": "x", "max_tokens": 2000})))
        t.start()
        assert _wait(lambda d: d["in_flight"] == 1, url)["in_flight"] == 1
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert proc.wait(30) == 0
    _is_error(box[0], 503, code="shutting_down")
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err and "CancelledError" not in err and "stopped (SIGTERM)" in err, err


def test_a_reload_the_start_up_would_refuse_keeps_the_old_table(tmp_path):
    from tr_model.tuning.autotune import tune
    th = tmp_path / "th.json"
    table = tune(SPEC, 3, th)
    other = tmp_path / "other.json"
    tune(tr_model.preset("r2r", [6.0, 20.0], p=0.35), 3, other)
    three = tmp_path / "three.json"
    three.write_text(json.dumps({"schema_version": 1, "num_models": 3, "max_concurrency": 1, "complete": True,
                                 "fallback_thresholds": [1, 1, 1],
                                 "entries": [{"active_requests": 1, "thresholds": [1, 1, 1]}]}))
    with _server(["--thresholds", str(th), "--check-interval-s", "0.05"]) as (proc, url):
        for k, (bad, words) in enumerate(((three, "3 models"), (other, "spec_sha256"))):
            tmp = tmp_path / f"swap{k}.json"
            tmp.write_bytes(bad.read_bytes())
            os.replace(tmp, th)
            _post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2})     # a lookup checks the file
            h = _wait(lambda d: d["thresholds_refused_reloads"] == k + 1, url)
            assert h["thresholds_refused_reloads"] == k + 1 and words in h["thresholds"]["last_error"], h
            assert h["status"] == "ok" and h["thresholds"]["current"] == list(table.lookup(0))
        st, doc = _post(url, "/v1/completions", {"prompt": "x", "max_tokens": 4})
        assert st == 200 and doc["usage"]["completion_tokens"] == 4
    err = proc.stderr.read()
    proc.stderr.close()
    assert err.count("thresholds reload refused") == 2 and "Traceback" not in err


@pytest.mark.parametrize("argv,msg", [
    (["--max-tokens-limit", "0"], "--max-tokens-limit"),
    (["--max-body-bytes", "-1"], "--max-body-bytes"),
    (["--request-deadline-s", "nan"], "--request-deadline-s"),
    (["--max-waiting", "-2"], "--max-waiting"),
    (["--default-max-tokens", "500", "--max-tokens-limit", "100"], "--default-max-tokens"),
])
def test_bad_limit_flags_are_one_error_line(argv, msg):
    r = subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "serve", *EAGER, "--port", "0", *argv],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and msg in r.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_measure_leaves_no_event_loop_traceback(sig, code):
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "measure", "--p", "0.35", "--L", "6",
                             "27.9", "--N", "4", "--B", "1", "1", "--duration-s", "60", "--warmup-s", "0",
                             "--no-predict"], preexec_fn=_sigint_default, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(6)   # imports done, the runtime's loop running
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Event loop is closed" not in err and "Traceback" not in err and "destroyed but it is pending" not in err


def test_serve_bench_refuses_or_marks_an_N_above_the_servers_admission_limit():
    from profiler import serve_bench as sb
    with _server(EAGER + ["--time-scale", "0.2"]) as (proc, url):
        r = subprocess.run([sys.executable, "-m", "profiler.cli", "serve-bench", "--url", url, "--N", "4",
                            "--duration-s", "0.5", "--warmup-s", "0"], capture_output=True, text=True, env=ENV,
                           timeout=120)
        assert r.returncode == 2 and "admission limit of 2" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert _get(url, "/health")["completed_requests"] == 0          # refused before any traffic
        host, port = _host_port(url)
        t = sb.Target("http", host, port, "", "completions", "tokenrouter", 4)
        row = sb.run_phase(t, 3, warmup_s=0.0, duration_s=0.5, allow_over_admission=True, track_server=False)
        assert row.admission_limit == 2 and row.over_admission_limit and row.requests > 0
        row = sb.run_phase(t, 2, warmup_s=0.0, duration_s=0.3, track_server=False)
        assert row.admission_limit == 2 and not row.over_admission_limit
        assert _idle(_wait(_idle, url))


def test_cancelled_requests_leave_the_runtime_and_free_their_slots_on_the_virtual_clock():
    """Cancel a request in every state it can be in (not yet admitted, queued, running, routed to a peer): each
    leaves the runtime, the executor's release() sees it once, the active count and the admission slots return
    to idle, and requests that were not cancelled still get all their tokens.  Eager thresholds: a fixed
    threshold above the active count would wait for requests that never come, cancelled or not."""
    import asyncio
    from tr_model.serving.runtime import EmulatedExecutor, FixedThresholds, VirtualTimeLoop
    from tr_model.serving.server import RuntimeService

    class Counting(EmulatedExecutor):
        released: list = []

        def release(self, req):
            self.released.append(req.rid)

    async def main():
        ex = Counting(SPEC.latency_ms)
        svc = RuntimeService(SPEC, FixedThresholds((1, 1)), ex, max_concurrency=3)
        svc.start()
        states = []
        for delay in (0.0, 0.003, 0.013, 0.05, 0.2, 0.5):   # before admission, queued, running, later steps
            keep = asyncio.ensure_future(svc.generate([1], 20))
            gone = asyncio.ensure_future(svc.generate([1, 2], 500))
            await asyncio.sleep(delay)
            states.append(next((r.state for r in svc.in_flight if r.max_output_tokens == 500), "-"))
            gone.cancel()
            out = await keep
            assert out["completion_tokens"] == 20
            await asyncio.sleep(0.5)
            assert svc.in_flight == set() and svc._sem._value == 3
            assert all(s.active_view == 0 for s in svc.rt.subservers)
            assert all(not s.waiting for s in svc.rt.subservers) and svc.rt.in_flight == 0
        h = svc.health()
        await svc.stop()
        return states, h, ex.released

    loop = VirtualTimeLoop()
    try:
        states, h, released = loop.run_until_complete(main())
    finally:
        loop.close()
    assert h["cancelled_requests"] == 6 and h["in_flight"] == 0 and h["admission_free"] == 3
    assert len(released) == len(set(released)) == 12          # every request released exactly once
    assert {"submitted", "waiting", "running"} <= set(states) or {"waiting", "running"} <= set(states), states
