#!/usr/bin/env python3
"""Outside client of a running megatrain node's monitor endpoint (tests only).

Reads <output_dir>/monitor.json, then talks HTTP with the standard library (http.client, socket) and
parses /metrics with prometheus_client's text parser. Each subcommand checks one thing and exits 0,
or prints what is wrong and exits 1:

  api       /metrics, /status, /history, /events, control (checkpoint, pause, resume, stop) and bad input
            (no/wrong token, unknown path and method, malformed, oversized, many connections, a slow
            client) while the run keeps stepping; at the end /history equals train.jsonl
  restart   restarts each pipeline actor through /control/restart, one after another, each confirmed
            (took_effect) while the run continues; then lets the run finish
  faults    injects --count random faults (/control/fault) at random moments into random --actors (default
            every pipeline actor); then lets the run finish
  budget    injects faults into --actor until the node stops (restart budget spent)
  ranks     a job of --count ranks: every rank serves a monitor, each /status lists every rank
  watchdog  waits for the watchdog's warning, dump and restart events; then lets the run finish
  evaluation  a run evaluating every --every steps: /status between the first and second evaluation
            (training again) says every actor is running, and names the model its [model] keys define
"""
import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

ACTORS = ["loader", "prefetcher", "compute", "collector", "optimizer", "checkpointer", "node"]
PIPELINE = ["loader", "prefetcher", "compute", "collector", "optimizer"]
FAMILIES = {
    "megatrain_step": "gauge", "megatrain_max_steps": "gauge", "megatrain_tokens": "counter",
    "megatrain_loss": "gauge", "megatrain_learning_rate": "gauge", "megatrain_grad_norm": "gauge",
    "megatrain_tokens_per_second": "gauge", "megatrain_model_flops_per_second": "gauge",
    "megatrain_link_bytes": "counter", "megatrain_actor_busy_seconds": "counter",
    "megatrain_actor_wait_seconds": "counter", "megatrain_actor_mailbox_depth": "gauge",
    "megatrain_actor_restarts": "counter", "megatrain_checkpoints": "counter",
    "megatrain_checkpoint_bytes": "counter", "megatrain_checkpoint_seconds": "counter",
    "megatrain_arena_bytes_in_use": "gauge", "megatrain_arena_peak_bytes": "gauge",
    "megatrain_host_resident_bytes": "gauge", "megatrain_last_step_timestamp_seconds": "gauge",
    "megatrain_goodput_ratio": "gauge", "megatrain_paused": "gauge",
}


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


class Node:
    def __init__(self, out_dir, wait_s=60):
        self.out = out_dir
        path = os.path.join(out_dir, "monitor.json")
        deadline = time.time() + wait_s
        while not os.path.exists(path):
            check(time.time() < deadline, f"{path} did not appear within {wait_s} s")
            time.sleep(0.05)
        time.sleep(0.05)
        self.disc = json.load(open(path))
        self.host, self.port = self.disc["host"], self.disc["port"]
        self.token = open(self.disc["token_file"]).read().strip()
        mode = os.stat(self.disc["token_file"]).st_mode & 0o777
        check(mode == 0o600, f"token file mode {oct(mode)}, expected 0600")
        check(self.disc["url"] == f"http://{self.host}:{self.port}", f"monitor.json url {self.disc['url']}")
        self.events = []
        self.cv = threading.Condition()
        self.sse_error = None
        threading.Thread(target=self._read_events, daemon=True).start()

    def request(self, method, path, headers=None, body=None, timeout=10):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def get_json(self, path):
        status, _, body = self.request("GET", path)
        check(status == 200, f"GET {path}: {status} {body[:200]!r}")
        return json.loads(body)

    def control(self, action, actor=None, token=True):
        path = f"/control/{action}" + (f"?actor={actor}" if actor else "")
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        status, _, body = self.request("POST", path, headers)
        check(status == 202, f"POST {path}: {status} {body[:300]!r}")
        reply = json.loads(body)
        check(reply["status"] == "accepted" and reply["action"] == action and reply["id"].startswith("c-"),
              f"POST {path}: reply {reply}")
        return reply["id"]

    def step(self):
        return self.get_json("/status")["step"]

    def alive(self):
        return os.path.exists(os.path.join(self.out, "monitor.json"))

    # --- /events --------------------------------------------------------------------------------
    def _read_events(self):
        try:
            s = socket.create_connection((self.host, self.port), timeout=30)
            s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0\r\nAccept: text/event-stream\r\n\r\n")
            f = s.makefile("rb")
            status = f.readline().decode()
            check(" 200 " in status, f"/events status line {status!r}")
            headers = {}
            while True:
                line = f.readline().decode().rstrip("\r\n")
                if not line:
                    break
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
            check(headers.get("content-type", "").startswith("text/event-stream"), f"/events headers {headers}")
            ev = {}
            for raw in f:
                line = raw.decode().rstrip("\n")
                if line == "":
                    if "event" in ev:
                        with self.cv:
                            self.events.append({"id": int(ev["id"]), "type": ev["event"],
                                                "data": json.loads(ev["data"]), "at": time.time()})
                            self.cv.notify_all()
                    ev = {}
                elif line.startswith(":"):
                    continue
                else:
                    k, v = line.split(":", 1)
                    ev[k] = v[1:] if v.startswith(" ") else v
        except (OSError, Failed) as e:
            self.sse_error = str(e)
        finally:
            with self.cv:
                self.cv.notify_all()

    def wait_event(self, pred, what, timeout=60):
        deadline = time.time() + timeout
        with self.cv:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                left = deadline - time.time()
                check(left > 0, f"no event {what} within {timeout} s (stream error: {self.sse_error})")
                self.cv.wait(min(left, 0.5))

    def wait_control(self, cid, status, timeout=60):
        return self.wait_event(lambda e: e["type"] == "control" and e["data"]["id"] == cid and
                               e["data"]["status"] in (status, "failed"), f"control {cid} {status}", timeout)["data"]

    def wait_exit(self, timeout=120):
        deadline = time.time() + timeout
        while self.alive():
            check(time.time() < deadline, "the node did not exit (monitor.json still there)")
            time.sleep(0.05)


def jsonl(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def raw_request(node, data, read_timeout=10):
    """Sends raw bytes, returns the status code of the reply (or None when the server just closed)."""
    s = socket.create_connection((node.host, node.port), timeout=read_timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking it all
        reply = b""
        while b"\r\n" not in reply:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            reply += chunk
        return int(reply.split(b" ")[1]) if reply.startswith(b"HTTP/1.1 ") else None
    finally:
        s.close()


# --- api ------------------------------------------------------------------------------------------
def check_metrics(node):
    status, headers, body = node.request("GET", "/metrics")
    check(status == 200, f"/metrics {status}")
    check(headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"), f"/metrics type {headers}")
    text = body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in FAMILIES.items():
        check(name in families, f"/metrics has no {name} (has {sorted(families)})")
        check(families[name].type == kind, f"{name} is a {families[name].type}, expected {kind}")
        check(families[name].documentation, f"{name} has no HELP")
        raw = name + ("_total" if kind == "counter" else "")
        check(f"# TYPE {raw} {kind}" in text, f"no TYPE line for {raw}")
    for name in ["megatrain_actor_busy_seconds", "megatrain_actor_wait_seconds", "megatrain_actor_mailbox_depth",
                 "megatrain_actor_restarts"]:
        actors = sorted(s.labels["actor"] for s in families[name].samples if s.name.startswith(name))
        check(actors == sorted(ACTORS), f"{name} actors {actors}")
    link = {s.labels["direction"]: s.value for s in families["megatrain_link_bytes"].samples
            if s.name == "megatrain_link_bytes_total"}
    check(set(link) == {"h2d", "d2h"} and link["h2d"] > 0 and link["d2h"] > 0, f"link bytes {link}")
    value = lambda n: next(s.value for s in families[n].samples)
    check(value("megatrain_step") > 0, "megatrain_step is 0 while training")
    check(value("megatrain_last_step_timestamp_seconds") > time.time() - 60, "last step timestamp is old")
    check(0 < value("megatrain_goodput_ratio") <= 1, "goodput out of (0, 1]")
    check(value("megatrain_arena_peak_bytes") > 0 and value("megatrain_host_resident_bytes") > 0, "arena / RSS zero")
    compute_busy = next(s.value for s in families["megatrain_actor_busy_seconds"].samples
                        if s.labels["actor"] == "compute" and s.name.endswith("_total"))
    check(compute_busy > 0, "compute busy 0")
    return families


def check_status(node):
    st = node.get_json("/status")
    for k in ["run", "state", "step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "eta_s", "goodput", "link",
              "arena", "host_resident_bytes", "actors", "last_checkpoint", "last_error"]:
        check(k in st, f"/status has no {k}")
    for k in ["model", "arch", "params", "layers", "max_steps", "batch", "seq", "micro_batches", "backend", "bf16",
              "kernel_choices", "output_dir", "pid"]:
        check(k in st["run"], f"/status run has no {k}")
    check(st["run"]["pid"] == node.disc["pid"], "pid differs from monitor.json")
    check([a["name"] for a in st["actors"]] == ACTORS, f"actors {[a['name'] for a in st['actors']]}")
    for a in st["actors"]:
        for k in ["state", "handler", "in_handler_s", "last_unit", "busy_s", "wait_s", "mailbox", "restarts",
                  "last_failure"]:
            check(k in a, f"actor {a['name']} has no {k}")
        check(a["state"] in ("running", "restarting", "stopped"), f"actor state {a['state']}")
    units = {a["name"]: a["last_unit"] for a in st["actors"]}
    check(units["compute"].startswith("step ") and units["optimizer"].startswith("step "), f"last units {units}")
    check(st["state"] in ("running", "paused"), f"state {st['state']}")
    return st


def bad_input(node):
    """Each bad request gets its proper HTTP error; returns the number of checks."""
    t = {"Authorization": f"Bearer {node.token}"}
    cases = [
        ("POST", "/control/checkpoint", {}, 401),
        ("POST", "/control/checkpoint", {"Authorization": "Bearer wrong"}, 403),
        ("POST", "/control/checkpoint", {"Authorization": "Basic abc"}, 401),
        ("POST", "/control/restart?actor=nobody", t, 400),
        ("POST", "/control/restart?actor=checkpointer", t, 400),
        ("POST", "/control/restart", t, 400),
        ("POST", "/control/fault?actor=compute", t, 403),  # fault injection is off
        ("POST", "/control/explode", t, 404),
        ("GET", "/nothing/here", {}, 404),
        ("GET", "/control/checkpoint", t, 405),
        ("DELETE", "/status", {}, 405),
        ("POST", "/metrics", {}, 405),
        ("GET", "/history?since=abc", {}, 400),
    ]
    for method, path, headers, want in cases:
        status, h, body = node.request(method, path, headers)
        check(status == want, f"{method} {path}: {status}, expected {want} ({body[:200]!r})")
        if want == 405:
            check("Allow" in h, f"{method} {path}: 405 without Allow")
        if want == 401:
            check("WWW-Authenticate" in h, f"{method} {path}: 401 without WWW-Authenticate")
        check("error" in json.loads(body), f"{method} {path}: no error text")
    # Malformed request line, oversized headers and body.
    check(raw_request(node, b"THIS IS NOT HTTP\r\n\r\n") == 400, "malformed request not 400")
    check(raw_request(node, b"GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n") == 413,
          "oversized headers not 413")
    big = b"x" * 20000
    check(raw_request(node, b"POST /control/checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                      str(len(big)).encode() + b"\r\n\r\n" + big) == 413, "oversized body not 413")
    # A slow client: one byte at a time, never finishing: answered 408 and closed in bounded time.
    s = socket.create_connection((node.host, node.port), timeout=20)
    t0 = time.time()
    status = None
    try:
        for b in b"GET /status HTTP/1.1\r\nHost: slow\r\n":
            s.sendall(bytes([b]))
            time.sleep(0.2)
            s.setblocking(False)
            try:
                data = s.recv(4096)
                if data:
                    status = int(data.split(b" ")[1])
                    break
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
        if status is None:
            data = s.recv(4096)
            status = int(data.split(b" ")[1]) if data else None
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    check(status == 408, f"slow client got {status}, expected 408")
    check(time.time() - t0 < 15, f"slow client held for {time.time() - t0:.1f} s")
    # Many connections at once: every one gets an answer (200, or 503 past the connection limit).
    results = []
    lock = threading.Lock()

    def one():
        try:
            st, _, _ = node.request("GET", "/status", timeout=20)
        except OSError as e:
            st = str(e)
        with lock:
            results.append(st)

    idle = [socket.create_connection((node.host, node.port)) for _ in range(80)]  # held open, silent
    threads = [threading.Thread(target=one) for _ in range(100)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    for s in idle:
        s.close()
    check(len(results) == 100 and all(r in (200, 503) for r in results), f"concurrent statuses {results[:20]}...")
    check(any(r == 503 for r in results), "no connection refused with 503 past the limit")
    # The server is fine afterwards (once it has seen the idle connections close).
    deadline = time.time() + 5
    while node.request("GET", "/status")[0] != 200:
        check(time.time() < deadline, "/status still refused 5 s after the load")
        time.sleep(0.05)
    return len(cases) + 5


def cmd_api(node, args):
    wait_steps(node, 2)
    s0 = node.step()
    families = check_metrics(node)
    check_status(node)
    # Control: checkpoint (accepted -> took_effect -> durable with path, bytes, seconds).
    cid = node.control("checkpoint")
    ev = node.wait_control(cid, "took_effect")
    check(ev["status"] == "took_effect" and ev["step"] > 0, f"checkpoint {ev}")
    ev = node.wait_control(cid, "durable")
    check(ev["status"] == "durable" and os.path.isdir(ev["path"]) and ev["bytes"] > 0 and ev["seconds"] >= 0,
          f"checkpoint durable {ev}")
    node.wait_event(lambda e: e["type"] == "checkpoint_saved" and e["data"]["step"] == ev["step"], "checkpoint_saved")
    check(node.get_json("/status")["last_checkpoint"]["step"] >= ev["step"], "last_checkpoint not updated")
    # Bad input while training: every request answered, and steps keep coming.
    before = node.step()
    n = bad_input(node)
    after = node.step()
    check(after > before, f"step did not rise during the bad input ({before} -> {after})")
    # Pause: took_effect at a step, the step stays there, /metrics says paused; then resume.
    cid = node.control("pause")
    ev = node.wait_control(cid, "took_effect")
    check(ev["status"] == "took_effect", f"pause {ev}")
    node.wait_event(lambda e: e["type"] == "paused", "paused")
    paused_at = node.step()
    check(paused_at == ev["step"], f"paused at {paused_at}, control says {ev['step']}")
    time.sleep(0.5)
    st = node.get_json("/status")
    check(st["state"] == "paused" and st["step"] == paused_at, f"while paused: {st['state']} step {st['step']}")
    metrics = {f.name: f for f in text_string_to_metric_families(node.request("GET", "/metrics")[2].decode())}
    check(metrics["megatrain_paused"].samples[0].value == 1, "megatrain_paused not 1 while paused")
    # A checkpoint while paused: written at once, of the paused step.
    cid = node.control("checkpoint")
    ev = node.wait_control(cid, "durable")
    check(ev["status"] == "durable" and ev["step"] == paused_at and os.path.isdir(ev["path"]),
          f"checkpoint while paused at {paused_at}: {ev}")
    check(node.step() == paused_at, "a step ran while paused")
    cid = node.control("resume")
    check(node.wait_control(cid, "took_effect")["status"] == "took_effect", "resume failed")
    node.wait_event(lambda e: e["type"] == "resumed", "resumed")
    deadline = time.time() + 30
    while node.step() <= paused_at:
        check(time.time() < deadline, "no step after resume")
        time.sleep(0.05)
    # /history?since=N returns the records after N.
    hist = node.get_json(f"/history?since={paused_at}")
    check(hist and hist[0]["step"] == paused_at + 1, f"/history since {paused_at} starts at {hist[:1]}")
    # Stop: took_effect at a step, durable with the final checkpoint; the node exits cleanly.
    cid = node.control("stop")
    ev = node.wait_control(cid, "took_effect")
    check(ev["status"] == "took_effect", f"stop {ev}")
    end = ev["step"]
    ev = node.wait_control(cid, "durable")
    check(ev["status"] == "durable" and ev["step"] == end and os.path.isdir(ev["path"]), f"stop durable {ev}")
    node.wait_event(lambda e: e["type"] == "stopping", "stopping")
    node.wait_event(lambda e: e["type"] == "stopped", "stopped")
    full = node.get_json("/history") if node.alive() else None
    node.wait_exit()
    # Figures match train.jsonl: every step record (from the events) equals its train.jsonl line.
    rows = jsonl(os.path.join(node.out, "train.jsonl"))
    check(rows and rows[-1]["step"] == end, f"train.jsonl ends at {rows[-1]['step'] if rows else None}, stop at {end}")
    steps = {e["data"]["step"]: e["data"] for e in node.events if e["type"] == "step"}
    check(len(steps) == len(rows), f"{len(steps)} step events, {len(rows)} train.jsonl lines")
    for r in rows:
        ev = steps[r["step"]]
        for k, v in r.items():
            check(ev[k] == v, f"step {r['step']}: event {k}={ev[k]}, train.jsonl {v}")
        check(ev["h2d_bytes"] > 0 and ev["t"] > 0, f"step {r['step']}: no link bytes / time")
    if full is not None:
        for h in full:
            r = rows[h["step"] - rows[0]["step"]]
            check(all(h[k] == r[k] for k in r), f"/history step {h['step']} differs from train.jsonl")
    # The audit log has every control request with its peer and outcome.
    audit = jsonl(os.path.join(node.out, "audit.jsonl"))
    outcomes = {(a["action"], a["outcome"]) for a in audit}
    for want in [("checkpoint", "accepted"), ("checkpoint", "durable"), ("pause", "took_effect"),
                 ("resume", "took_effect"), ("stop", "durable"), ("checkpoint", "refused")]:
        check(want in outcomes, f"audit.jsonl has no {want}")
    check(all(a["peer"].startswith("127.0.0.1:") for a in audit), "audit line without peer")
    print(f"api: {len(FAMILIES)} metric families, {n} bad requests answered, steps {s0}..{end}, "
          f"{len(rows)} records equal train.jsonl, {len(audit)} audit lines")


# --- restarts and faults ----------------------------------------------------------------------------
def wait_steps(node, n, timeout=60):
    target = node.step() + n
    deadline = time.time() + timeout
    while node.alive() and node.step() < target:
        check(time.time() < deadline, f"no progress to step {target}")
        time.sleep(0.02)


def cmd_restart(node, args):
    wait_steps(node, 2)
    for actor in PIPELINE:
        cid = node.control("restart", actor)
        ev = node.wait_control(cid, "took_effect")
        check(ev["status"] == "took_effect", f"restart {actor}: {ev}")
        node.wait_event(lambda e: e["type"] == "actor_restarted" and e["data"]["actor"] == actor and
                        e["data"]["requested_by"] == cid, f"actor_restarted {actor}")
        st = node.get_json("/status")
        a = next(a for a in st["actors"] if a["name"] == actor)
        check(a["restarts"] >= 1, f"{actor} restarts {a['restarts']}")
        wait_steps(node, 2)
    node.wait_exit()
    logged = [e for e in jsonl(os.path.join(node.out, "events.jsonl")) if e["event"] == "actor_restarted"]
    check(sorted(e["actor"] for e in logged) == sorted(PIPELINE), f"events.jsonl restarts {logged}")
    print(f"restart: {', '.join(PIPELINE)} restarted on request, run finished")


def cmd_faults(node, args):
    rng = random.Random(args.seed)
    wait_steps(node, 2)
    done = []
    actors = args.actors.split(",")
    check(all(a in PIPELINE for a in actors), f"--actors {args.actors}: not all pipeline actors")
    for _ in range(args.count):
        actor = rng.choice(actors)
        time.sleep(rng.uniform(0.0, 0.3))
        if not node.alive():
            break
        cid = node.control("fault", actor)
        ev = node.wait_control(cid, "took_effect")
        check(ev["status"] == "took_effect", f"fault {actor}: {ev}")
        node.wait_event(lambda e: e["type"] == "actor_failed" and e["data"]["actor"] == actor and
                        "injected fault" in e["data"]["error"], f"actor_failed {actor}")
        done.append(actor)
    check(len(done) == args.count, f"only {len(done)} faults injected before the run ended")
    node.wait_exit()
    print(f"faults: {' '.join(done)} (seed {args.seed}), run finished")


def cmd_budget(node, args):
    wait_steps(node, 2)
    # The first failure is restarted after restart.backoff_s.
    cid = node.control("fault", args.actor)
    node.wait_event(lambda e: e["type"] == "actor_failed" and e["data"]["actor"] == args.actor, "actor_failed")
    node.wait_event(lambda e: e["type"] == "actor_restarted" and e["data"]["actor"] == args.actor, "actor_restarted")
    # The node's own times (events.jsonl), not when this client received the events: a loaded machine
    # can deliver the failure late and the restart promptly.
    logged = jsonl(os.path.join(node.out, "events.jsonl"))
    failed_t = next(e["t"] for e in logged if e["event"] == "actor_failed" and e["actor"] == args.actor)
    back_t = next(e["t"] for e in logged if e["event"] == "actor_restarted" and e["actor"] == args.actor)
    check(back_t - failed_t >= args.backoff * 0.9,
          f"restarted {back_t - failed_t:.2f} s after the failure, backoff {args.backoff} s")
    check(node.wait_control(cid, "took_effect")["status"] == "took_effect", "first fault")
    n = 1
    while node.alive():
        try:
            cid = node.control("fault", args.actor)
        except (OSError, Failed):
            break  # the node is shutting down
        n += 1
        deadline = time.time() + 60
        while node.alive() and not any(e["type"] == "control" and e["data"]["id"] == cid and
                                       e["data"]["status"] != "accepted" for e in list(node.events)):
            check(time.time() < deadline, f"fault {cid} neither took effect nor ended the run")
            time.sleep(0.05)
        time.sleep(0.3)
        check(n < 20, "the node never stopped")
    node.wait_exit()
    print(f"budget: {n} faults into {args.actor}, node stopped")


def cmd_watchdog(node, args):
    for level in ["warning", "dump", "restart"]:
        ev = node.wait_event(lambda e: e["type"] == "watchdog" and e["data"]["level"] == level, f"watchdog {level}")
        check(ev["data"]["stalled_s"] > 0, f"watchdog {level}: {ev}")
        if level == "dump":
            check([a["name"] for a in ev["data"]["actors"]] == ACTORS, f"dump {ev}")
        if level == "restart":
            stuck = ev["data"]["actor"]
            check(stuck in PIPELINE, f"watchdog restart of {stuck}")
            node.wait_event(lambda e: e["type"] == "actor_restarted" and e["data"]["actor"] == stuck,
                            f"actor_restarted {stuck}")
    node.wait_exit()
    levels = [e["level"] for e in jsonl(os.path.join(node.out, "events.jsonl")) if e["event"] == "watchdog"]
    check(levels[:3] == ["warning", "dump", "restart"], f"events.jsonl watchdog levels {levels}")
    print(f"watchdog: warning, dump, restart of {stuck}; run finished")


# --- evaluation -------------------------------------------------------------------------------------
def cmd_evaluation(node, args):
    # Steps every+1 .. 2*every-2 are reported while the segment after the first evaluation pass trains
    # (it ends at step 2*every): its actors are working, whatever the pass before them left on the board.
    first, last = args.every + 1, 2 * args.every - 2
    deadline = time.time() + 60
    seen_training = None  # when /status first showed a step: the run's clock had started before
    while True:
        asked = time.monotonic()
        st = node.get_json("/status")
        check(st["step"] <= last, f"/status jumped from before step {first} to step {st['step']}")
        if seen_training is None and st["step"] >= 1:
            seen_training = asked
        if st["step"] >= first:
            break
        check(time.time() < deadline, f"no progress to step {first}")
        time.sleep(0.01)
    # The run's figures span the evaluation: its wall clock runs from the first segment, not this one
    # (the ETA and goodput divide by it).
    if seen_training is not None and seen_training < asked:
        check(st["wall_s"] + 0.05 >= asked - seen_training,
              f"/status wall_s {st['wall_s']:.3f} s at step {st['step']}, but the run trained "
              f"{asked - seen_training:.3f} s ago: the clock restarted with the segment")
    states = {a["name"]: a["state"] for a in st["actors"]}
    check(all(s == "running" for s in states.values()), f"step {st['step']}, after an evaluation: {states}")
    model = st["run"]["model"]
    check(model == args.model, f"/status run.model {model!r}, expected {args.model!r}")
    node.wait_exit()
    print(f"evaluation: at step {st['step']} every actor running; model {model!r}")


def check_ranks_entry(st, ranks, who):
    rs = st["ranks"]
    check(len(rs) == ranks, f"{who}: /status ranks {rs}")
    for r, e in enumerate(rs):
        check(e["rank"] == r and e["step"] >= 2, f"{who}: rank {r} entry {e}")
        check(e["slowest_actor"] in PIPELINE + ["loader", "checkpointer"], f"{who}: rank {r} slowest {e}")
        lc = e["last_collective"]
        check(lc is not None and lc["channel"] in ("grads", "losses", "weights", "checkpoint", "control")
              and 0 <= lc["peer"] < ranks and lc["peer"] != r and lc["seconds"] >= 0, f"{who}: rank {r} {lc}")
    live = [e["rank"] for e in rs if e.get("live")]
    return live


def cmd_ranks(node, args):
    # Every rank serves its monitor (rank R's files in <out>/rank-R), and each /status lists every rank.
    wait_steps(node, 3)
    check(check_ranks_entry(node.get_json("/status"), args.count, "rank 0") == [0], "rank 0: its own entry live")
    for r in range(1, args.count):
        other = Node(os.path.join(node.out, f"rank-{r}"))
        check(other.port != node.port, f"rank {r} serves on rank 0's port")
        st = other.get_json("/status")
        check(check_ranks_entry(st, args.count, f"rank {r}") == [r], f"rank {r}: its own entry live")
        check(st["run"]["pid"] != node.disc["pid"], f"rank {r}: the pid of rank 0")
    print(f"ranks: {args.count} monitors, each /status lists every rank")
    node.wait_exit()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["api", "restart", "faults", "budget", "watchdog", "evaluation", "ranks"])
    p.add_argument("--out", required=True, help="the node's train.output_dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=6)
    p.add_argument("--actor", default="compute")
    p.add_argument("--actors", default=",".join(PIPELINE), help="faults: the actors to choose from")
    p.add_argument("--backoff", type=float, default=0.0, help="budget: the node's restart.backoff_s")
    p.add_argument("--every", type=int, default=4, help="evaluation: the node's train.eval_steps")
    p.add_argument("--model", default="", help="evaluation: the run.model /status must show")
    args = p.parse_args()
    try:
        node = Node(args.out)
        {"api": cmd_api, "restart": cmd_restart, "faults": cmd_faults, "budget": cmd_budget,
         "watchdog": cmd_watchdog, "evaluation": cmd_evaluation, "ranks": cmd_ranks}[args.command](node, args)
    except Failed as e:
        print(f"monitor_client {args.command}: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
