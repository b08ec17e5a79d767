#!/usr/bin/env python3
"""The dashboard in headless Chromium against a running node.

Starts `megatrain train` on a tiny model (monitor on, any free port), opens http://HOST:PORT/ in
Debian's chromium driven over the DevTools protocol (--remote-debugging-pipe: no extra Python
packages), and reads the page's own state (window.megatrainDashboard and the canvases' data-points):
the four plots received data from /history and from `step` events, the actor table lists every actor
from /status, and every plotted loss equals the loss train.jsonl logged for that step. Then presses
the page's checkpoint control (the token as the page keeps it, in sessionStorage) and waits for the
`control` event saying the checkpoint is durable, keeps a screenshot, and stops the node with
POST /control/stop (clean exit, monitor.json removed).

  dashboard_chromium.py --node BUILD/tests/actors/megatrain-with-faults --work DIR [--screenshot FILE]
  dashboard_chromium.py --attach OUTPUT_DIR [--screenshot FILE]     (a node that is already running)

Exit 0: passed; 1: failed (says what); 77: chromium is not installed (ctest counts it as skipped).
"""
import argparse
import base64
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

ACTORS = ["loader", "prefetcher", "compute", "collector", "optimizer", "checkpointer", "node"]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def make_shard(path, tokens):
    """An llm.c token shard (uint16) of a repeating pattern, as tests/actors/node_binary_fixture.hpp writes."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, tokens
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % tokens, *[(i * 7 + i // 13) % 61 for i in range(tokens)]))


STALL_STEP, STALL_S = 100, 6  # megatrain-with-faults holds the write of step 100's checkpoint this long


def start_node(binary, work):
    shard = os.path.join(work, "train_000000.bin")
    make_shard(shard, 8192)
    out = os.path.join(work, "out")
    args = [binary, "train", "--model.arch=llama", "--model.hidden_size=32", "--model.layers=2", "--model.heads=4",
            "--model.kv_heads=2", "--model.intermediate_size=64", "--model.vocab_size=64",
            "--model.max_position_embeddings=64", "--data.seq_length=16", "--data.train_files=" + shard,
            "--train.per_device_train_batch_size=2", "--train.gradient_accumulation_steps=2", "--train.warmup_steps=0",
            "--train.max_steps=1000000", "--train.save_steps=%d" % STALL_STEP,
            "--train.save_total_limit=0",  # keep all: the checkpoint is checked after later periodic ones
            "--train.output_dir=" + out,
            "--device.max_vram_gb=0.015625", "--threads.total=2", "--monitor.port=0"]
    log = open(os.path.join(work, "node.log"), "w")
    env = dict(os.environ, MEGATRAIN_TEST_CKPT_STALL="%d:1:%d" % (STALL_STEP, STALL_S))
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(out, "monitor.json")):
        if proc.poll() is not None:
            fail("the node exited (%d) before writing monitor.json:\n%s" % (proc.returncode, open(log.name).read()))
        if time.time() > deadline:
            proc.kill()
            fail("no monitor.json after 60 s")
        time.sleep(0.1)
    time.sleep(0.1)  # monitor.json is written whole, but give the writer a moment to close it
    return proc, out


class Chromium:
    """Headless chromium over the DevTools protocol on a pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, exe):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.profile = tempfile.mkdtemp(prefix="mt_chromium_")  # a fresh profile, removed on close
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--window-size=1280,1700",
             "--no-first-run", "--no-default-browser-check", "--user-data-dir=" + self.profile, "about:blank"],
            preexec_fn=child_fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def call(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        fail("chromium: %s failed: %s" % (method, reply["error"]))
                    return reply.get("result", {})
            if time.time() > deadline:
                fail("chromium: no reply to %s in %d s" % (method, timeout))
            ready, _, _ = select.select([self.from_chrome], [], [], 1.0)
            if ready:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    fail("chromium closed its pipe (crashed?) during " + method)
                self.buf += chunk

    def open(self, url):
        target = self.call("Target.createTarget", {"url": url}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]

    def evaluate(self, expression, await_promise=False):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": await_promise})
        if "exceptionDetails" in r:
            fail("page script failed: %s" % r["exceptionDetails"].get("exception", {}).get("description", r))
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except SystemExit:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


PAGE_STATE = """JSON.stringify((() => {
  const d = window.megatrainDashboard;
  if (!d) return null;
  const plots = {};
  for (const c of document.querySelectorAll('canvas')) plots[c.id] = Number(c.dataset.points);
  return {historyLoaded: d.historyLoaded, historyRecords: d.historyRecords, sse: d.sse, lastStep: d.lastStep,
          statusPolls: d.statusPolls, points: d.points, plots: plots, controls: d.controls,
          actors: Array.from(document.querySelectorAll('#actor-rows tr')).map(r => r.dataset.actor),
          state: document.getElementById('run-state').dataset.state, events: d.events.map(e => e.type),
          stuck: d.stuck.map(x => x.name),
          stuckRows: Array.from(document.querySelectorAll('#actor-rows tr.stuck')).map(r => r.dataset.actor),
          banner: document.getElementById('stuck').hidden ? '' : document.getElementById('stuck').textContent};
})())"""


def wait_for(chrome, what, predicate, timeout):
    deadline = time.time() + timeout
    state = None
    while time.time() < deadline:
        state = json.loads(chrome.evaluate(PAGE_STATE) or "null")
        if state and predicate(state):
            return state
        time.sleep(0.25)
    summary = {k: v for k, v in (state or {}).items() if k != "points"}
    if state:
        summary["points"] = {k: len(v) for k, v in state["points"].items()}
    fail("%s: not seen within %d s; the page's state: %s" % (what, timeout, json.dumps(summary)))


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def wait_for_held_checkpointer(url, timeout):
    """Polls /status until the checkpointer has been in one handler for a second (the held write)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for a in get_json(url + "status")["actors"]:
            if a["name"] == "checkpointer" and a["in_handler_s"] >= 1.0:
                return a
        time.sleep(0.05)
    fail("the checkpointer was never seen in one handler for a second (MEGATRAIN_TEST_CKPT_STALL)")


def screenshot(chrome, path):
    png = base64.b64decode(chrome.call("Page.captureScreenshot", {"format": "png"})["data"])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(png)
    print("screenshot: %s (%d bytes)" % (path, len(png)), flush=True)


def post(url, token):
    req = urllib.request.Request(url, method="POST", headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node")
    ap.add_argument("--work")
    ap.add_argument("--attach")
    ap.add_argument("--screenshot")
    ap.add_argument("--chromium", default="chromium")
    a = ap.parse_args()
    exe = shutil.which(a.chromium)
    if exe is None:
        print("SKIP: %s is not installed (Debian package chromium; tools/install-deps --test)" % a.chromium)
        sys.exit(77)

    proc = None
    chrome = Chromium(exe)  # started first: the held checkpoint must not pass while the browser starts
    if a.attach:
        out = a.attach
    else:
        if not (a.node and a.work):
            ap.error("--node and --work, or --attach")
        shutil.rmtree(a.work, ignore_errors=True)
        os.makedirs(a.work)
        proc, out = start_node(a.node, a.work)
    url = token = code = None
    try:
        info = json.load(open(os.path.join(out, "monitor.json")))
        token = open(info["token_file"]).read().strip()
        url = info["url"].rstrip("/") + "/"
        print("node pid %s, monitor %s" % (info["pid"], url), flush=True)

        if proc:
            # A stuck actor, as the page shows it: once the checkpointer has been held in its handler
            # for a second, open the page with a 1 s threshold; within its first /status poll the
            # checkpointer's row is marked and the banner names it, its handler and the time.
            held = wait_for_held_checkpointer(url, 60)
            chrome.open(url + "?stuck_after=1")
            st = wait_for(chrome, "the checkpointer shown stuck", lambda s: "checkpointer" in s["stuck"], STALL_S - 1)
            if "checkpointer" not in st["stuckRows"]:
                fail("the checkpointer's row is not marked stuck: %s" % st["stuckRows"])
            if not re.search(r"checkpointer in %s for [1-9][0-9]* s" % re.escape(held["handler"]), st["banner"]):
                fail("the stuck banner says %r, expected 'checkpointer in %s for N s'" % (st["banner"], held["handler"]))
            print("stuck banner: %s" % st["banner"], flush=True)
            if a.screenshot:
                screenshot(chrome, re.sub(r"(\.png)?$", "-stuck.png", a.screenshot, count=1))
        else:
            chrome.open(url)
        # The plots: history at load, then live step events; link rates need two records.
        st = wait_for(chrome, "data in all four plots, from /history and from step events",
                      lambda s: s["historyLoaded"] and s["sse"]["stepEvents"] >= 3 and s["statusPolls"] >= 2
                      and all(n >= 2 for n in s["plots"].values()), 60)
        print("page: %d history records, %d step events, %d status polls; plot points %s" %
              (st["historyRecords"], st["sse"]["stepEvents"], st["statusPolls"], st["plots"]), flush=True)
        if sorted(st["actors"]) != sorted(ACTORS):
            fail("the actor table lists %s, expected %s" % (st["actors"], ACTORS))
        if st["state"] != "running":
            fail("run state shown as %r, expected running" % st["state"])

        # The control button path, as a user clicking "checkpoint" (the page keeps the token in
        # sessionStorage; here it is put there instead of typed into the prompt).
        chrome.evaluate("sessionStorage.setItem('megatrain.monitor.token', %s)" % json.dumps(token))
        reply = chrome.evaluate("window.megatrainDashboard.control('checkpoint')", await_promise=True)
        if not reply or reply.get("http") != 202 or not str(reply.get("id", "")).startswith("c-"):
            fail("checkpoint control from the page: %s" % reply)
        cid = reply["id"]
        st = wait_for(chrome, "control %s reported durable" % cid,
                      lambda s: s["controls"].get(cid, {}).get("status") in ("durable", "failed"), 60)
        c = st["controls"][cid]
        if c["status"] != "durable" or not os.path.isdir(c.get("path", "")):
            fail("checkpoint %s: %s" % (cid, c))
        print("checkpoint %s durable at step %s: %s" % (cid, c.get("step"), c.get("path")), flush=True)
        if "checkpoint_saved" not in st["events"]:
            fail("no checkpoint_saved event in the page's log: %s" % st["events"])

        if a.screenshot:
            time.sleep(1.2)  # the next /status poll and the last redraw (100 ms debounce)
            screenshot(chrome, a.screenshot)

        # Every plotted loss is the loss train.jsonl has for that step (an outside record of the run).
        jsonl = os.path.join(out, "train.jsonl")
        if os.path.exists(jsonl):
            logged = {}
            for line in open(jsonl):
                r = json.loads(line)
                if "loss" in r:  # eval records carry val_loss instead
                    logged[r["step"]] = r["loss"]
            plotted = st["points"]["loss"]
            missing = [s for s, _ in plotted if s not in logged]
            wrong = [(s, v, logged[s]) for s, v in plotted if s in logged and logged[s] != v]
            if missing or wrong:
                fail("plotted losses not in train.jsonl: steps %s; differing: %s" % (missing[:5], wrong[:5]))
            steps = [s for s, _ in plotted]
            if steps != sorted(set(steps)):
                fail("plotted steps are not increasing and unique")
            print("%d plotted losses equal train.jsonl's" % len(plotted), flush=True)
        elif proc:
            fail("no train.jsonl in " + out)
    finally:
        chrome.close()
        if proc and url:
            try:
                post(url + "control/stop", token)
                code = proc.wait(timeout=60)
            except Exception as e:  # noqa: BLE001 -- report, then make sure the node is gone
                print("stopping the node: %s" % e)
        if proc and code is None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                fail("the node did not stop within 60 s of POST /control/stop")
    if proc:
        if code != 0:
            fail("the node exited with %d after /control/stop:\n%s" % (code, open(os.path.join(a.work, "node.log")).read()[-3000:]))
        if os.path.exists(os.path.join(out, "monitor.json")):
            fail("monitor.json still there after a clean exit")
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
