"""The PyTorch peer of bench_train_step: the same GPT-2-124M-shaped model (tied head, tanh GELU,
pre-LayerNorm, learned positions), the same batch, sequence and thread count, one step = forward,
cross-entropy, backward, clip_grad_norm_, AdamW. Prints a `torch_peer` line (torch version and the
options that ran), then `torch_step_seconds S cpu C`: the best of REPS steps after WARMUP unmeasured
ones, and the CPU seconds of that step.

usage: train_step_torch.py THREADS BATCH SEQ REPS [--bf16] [--sdpa] [--compile MODE] [--warmup N]
                           [--stop-above S [W]]
       train_step_torch.py --info      prints `torch_version V sdpa 0|1 autocast_bf16 0|1 compile 0|1`
       train_step_torch.py --probe THREADS   prints `torch_probe fp32 S bf16 S masked S sdpa S`: the
            best of a few forward + backward passes of one MLP block of the model (256 tokens) in fp32
            and under autocast bf16, and of one layer's attention (256 tokens) explicit and through SDPA
            (0 where this torch lacks it), about a second in all: what the sweep orders and cuts its
            configurations by (a CPU without native bf16 ran autocast's steps 60x slower than fp32)

  --bf16    forward and loss under torch.autocast("cpu", dtype=torch.bfloat16); the weights, gradients
            and AdamW stay fp32 (autocast's mixed precision, as a PyTorch user would train)
  --sdpa    attention through F.scaled_dot_product_attention(is_causal=True) instead of the explicit
            masked softmax (torch >= 2.0; an error where the torch version lacks it)
  --compile default|max-autotune   the model (forward and loss; the backward through AOTAutograd) is
            torch.compile'd with that mode, as a PyTorch user on a CPU would; clipping and AdamW stay
            eager. The compile happens inside the first step, so it needs --warmup >= 1 (the sweep
            gives it 2: the second step still ran 2.7x the steady one at 4 x 64); the script prints
            `torch_compile_seconds C`, the warm-up steps' time beyond as many fastest timed steps (the
            compile, with the first-touch cost an eager warm-up also pays). Inductor caches what it compiled in
            TORCHINDUCTOR_CACHE_DIR: the benchmark gives each run an empty one (a cold compile).
  --warmup  unmeasured steps first (default 1)
  --stop-above S [W]   give up on a timed step still running after S seconds, or a warm-up step after
            W (default S; warm-up steps are slower: first-touch memory, oneDNN primitives): prints
            `torch_step_stopped above S at step K` and exits 3. A sweep looking for the fastest
            configuration uses it to spend little time on configurations that cannot be the fastest.
Also prints `torch_warmup_seconds W`, the slowest warm-up step, before the result line.
A compiled run prints `torch_first_step_seconds F` (compile + first step) as soon as that step ends.
A step that raises prints `torch_compile_failed TYPE: LINE` (the first step of a compiled model: the
compile) or `torch_step_failed TYPE: LINE` and exits 4, LINE the first line of the innermost cause
(torch.compile wraps the backend's error in its own, whose first line says only which backend raised).
"""
import argparse
import math
import os
import sys
import threading
import time

# The thread count is the script's to decide: Debian's torch calls a pthread OpenBLAS that sizes its own
# pool from the environment, not from torch.set_num_threads, so set every pool before torch loads.
THREADS_ARG = sys.argv[2] if sys.argv[1:2] == ["--probe"] and len(sys.argv) > 2 else (sys.argv[1:2] or [""])[0]
if THREADS_ARG.isdigit():
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = THREADS_ARG

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_AUTOCAST_BF16 = hasattr(torch, "autocast") and hasattr(torch, "bfloat16")

HAS_COMPILE = hasattr(torch, "compile")

if sys.argv[1:] == ["--info"]:
    print(
        f"torch_version {torch.__version__} sdpa {int(HAS_SDPA)} autocast_bf16 {int(HAS_AUTOCAST_BF16)} "
        f"compile {int(HAS_COMPILE)}",
        flush=True,
    )
    sys.exit(0)



def probe_seconds(fn, reps=3):
    fn()  # warm-up: first-touch memory, oneDNN primitives
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def probe():
    torch.set_num_threads(int(sys.argv[2]))
    torch.manual_seed(0)
    d, ff, heads, n = 768, 3072, 12, 256
    up, down = nn.Linear(d, ff), nn.Linear(ff, d)
    x = torch.randn(n, d, requires_grad=True)

    def mlp(bf16):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = down(F.gelu(up(x), approximate="tanh")).float().sum()
        y.backward()

    q, k, v = (torch.randn(1, heads, n, d // heads, requires_grad=True) for _ in range(3))
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)

    def attention(sdpa):
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)).masked_fill(mask, float("-inf")) / math.sqrt(d // heads)
            a = torch.softmax(s, dim=-1) @ v
        a.sum().backward()

    fp32 = probe_seconds(lambda: mlp(False))
    bf16 = probe_seconds(lambda: mlp(True)) if HAS_AUTOCAST_BF16 else 0.0
    masked = probe_seconds(lambda: attention(False))
    sdpa = probe_seconds(lambda: attention(True)) if HAS_SDPA else 0.0
    print(f"torch_probe fp32 {fp32} bf16 {bf16} masked {masked} sdpa {sdpa}", flush=True)


if sys.argv[1:2] == ["--probe"]:
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: train_step_torch.py --probe THREADS")
    probe()
    sys.exit(0)

ap = argparse.ArgumentParser(
    usage="train_step_torch.py THREADS BATCH SEQ REPS [--bf16] [--sdpa] [--compile MODE] [--warmup N] "
    "[--stop-above S [W]]"
)
for name in ("threads", "batch", "seq", "reps"):
    ap.add_argument(name, type=int)
ap.add_argument("--bf16", action="store_true")
ap.add_argument("--sdpa", action="store_true")
ap.add_argument("--compile", choices=("default", "max-autotune"))
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--stop-above", type=float, nargs="+", default=[0.0])
args = ap.parse_args()
if args.sdpa and not HAS_SDPA:
    sys.exit(f"train_step_torch.py: --sdpa needs F.scaled_dot_product_attention (torch >= 2.0), this is {torch.__version__}")
if args.bf16 and not HAS_AUTOCAST_BF16:
    sys.exit(f"train_step_torch.py: --bf16 needs torch.autocast with bfloat16, this is {torch.__version__}")
if args.compile and args.warmup < 1:
    sys.exit("train_step_torch.py: --compile needs --warmup >= 1 (the compile happens in the first step)")
if min(args.threads, args.batch, args.seq, args.reps) < 1 or args.warmup < 0:
    sys.exit("train_step_torch.py: THREADS, BATCH, SEQ and REPS must be >= 1, --warmup >= 0")

threads, B, T, reps = args.threads, args.batch, args.seq, args.reps
torch.set_num_threads(threads)
torch.manual_seed(0)
V, d, L, H, ff, P = 50257, 768, 12, 12, 3072, 1024
print(
    f"torch_peer torch {torch.__version__} threads {threads} batch {B} seq {T} "
    f"precision {'bf16' if args.bf16 else 'fp32'} attention {'sdpa' if args.sdpa else 'masked'} "
    f"compile {args.compile or 'none'} reps {reps} warmup {args.warmup}",
    flush=True,
)


# The causal mask of the explicit path, built once (not per layer and step).
CAUSAL_MASK = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        if args.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d // H)
            s = s.masked_fill(CAUSAL_MASK, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(P, d)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT2()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=6e-4)
idx = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))


def stop(step):
    # A watchdog thread rather than SIGALRM: Python runs signal handlers only between bytecodes, and
    # loss.backward() is one call that can last a minute. Torch releases the GIL inside its kernels.
    print(f"torch_step_stopped above {limit(step)} at step {step}", flush=True)
    os._exit(3)


def limit(step):
    s = args.stop_above
    return s[1] if step < args.warmup and len(s) > 1 else s[0]


def first_line(e):
    # torch.compile raises BackendCompilerFailed "from" the backend's own error (a C++ compile error, a
    # lowering without a kernel): that innermost cause says what failed.
    while e.__cause__ is not None:
        e = e.__cause__
    msg = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
    return (f"{type(e).__name__}: {msg}" if msg else type(e).__name__)[:300]


def fail(kind, what):
    print(f"torch_{kind}_failed {what}", flush=True)
    sys.exit(4)


if args.compile:
    if not HAS_COMPILE:
        fail("compile", f"AttributeError: torch {torch.__version__} has no torch.compile (torch >= 2.0)")
    model = torch.compile(model, mode=None if args.compile == "default" else args.compile)


def step():
    opt.zero_grad(set_to_none=True)
    # Autocast covers the forward and the loss only (cross_entropy runs in fp32 under its policy); the
    # backward follows the forward's dtypes, and clipping and AdamW see the fp32 master weights.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


best, best_cpu, warm, first, warm_sum = float("inf"), float("inf"), 0.0, 0.0, 0.0
for r in range(reps + args.warmup):
    watchdog = threading.Timer(limit(r), stop, (r,)) if limit(r) > 0 else None
    if watchdog:
        watchdog.daemon = True
        watchdog.start()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        step()
    except Exception as e:  # reported, never a traceback the sweep would have to dig through
        fail("compile" if args.compile and r == 0 else "step", first_line(e))
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if watchdog:
        watchdog.cancel()
    if r == 0 and args.compile:  # said at once: a cut-off or a timeout later must not lose the compile time
        first = dt
        print(f"torch_first_step_seconds {first}", flush=True)
    if r < args.warmup:
        warm = max(warm, dt)
        warm_sum += dt
    elif dt < best:
        best, best_cpu = dt, dc
print(f"torch_warmup_seconds {warm}", flush=True)
if args.compile:
    print(f"torch_compile_seconds {max(0.0, warm_sum - args.warmup * best)}", flush=True)
print(f"torch_step_seconds {best} cpu {best_cpu}", flush=True)
