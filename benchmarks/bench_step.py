"""Where a training step's time goes (local engine), against the arithmetic it does and a bound measured here.

    python benchmarks/bench_step.py [--job default long_turns long_horizon] [--groups N] [--steps 2]
                                    [--threads T] [--profile] [--rollout-only] [--set KEY=VALUE ...]
                                    [--variants old prev new]

Jobs: ``default`` is ``bash train.sh sokoban turn_ppo`` (the README's main command: 64 groups x 4 episodes, 5 turns),
``long_turns`` / ``long_horizon`` add ``+setting=...`` with their committed warm starts. ``--groups`` sets
``es_manager.train.env_groups`` (a smaller batch on a busy machine). For each job it builds one trainer per
``--variants`` from the same weights and seeds: ``old`` (the step as at 872d077: the model's own forward in the
sampler, every position of the last layer in the score and update), ``prev`` (this tree's defaults but
``engine.last_layer_where_read=false``: the step before that option) and ``new`` (this tree's defaults), and runs
``--steps`` training steps of each, interleaved (old step 1, prev step 1, new step 1, old step 2, ...), so that all
see the same load; ratios are to the last variant. Per phase it prints:

- time: CPU seconds of this process (``time.process_time``: the time it ran, not the time it waited for a core on
  a shared machine; with ``--threads 1`` the work done), median over the steps, of each phase (rollout, score = old
  log-probs + critic values, advantages, update = critic + actor with the soundness check, elsewhere = the rest of
  ``train_step``) per variant, and the ratios; and the wall seconds of a whole step;
- arithmetic: FLOPs the phase needs for the batch's real tokens (linear layers, attention over each token's
  context, the output projection where logits are read; backward = 2x forward) and the bytes a decode step must
  read (weights + each row's cached keys/values);
- bound: those FLOPs at the rate a matmul of the phase's shapes reaches here, measured in the same run (CPU time)
  (``x[M, H] @ W.T`` for every weight of the model, M = the phase's rows), and the bytes at the copy bandwidth
  measured here; ``of bound`` = bound / time (1.0 = at the bound).

The last trainer's sampler also keeps its log-probs (``rollout.sampler_logprobs`` would use them as the old
log-probs); their gap to the scoring forward's is printed. ``--profile`` adds the top operations of the rollout,
score and update (``torch.profiler``, self CPU time) of one more step of each. ``--rollout-only``: the sampler alone
(the same weights and seeds each time). Each variant's samples are compared with the last's (identical tokens per
row) and so are the steps' metrics (their largest relative gap, per step: where the arithmetic differs, e.g. the
last layer at the read positions only, the weights after step 1 differ by float rounding). Timings on a shared
machine are noisy: read the ratios (interleaved), and the load printed at the start and the end.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Dict, List

import torch

from ragen_turn.compose import compose_config
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.runtime import quiet_transformers

PHASES = ("rollout", "filter_groups", "score", "compute_advantages", "sound_update")
NAMES = {"rollout": "rollout", "filter_groups": "filter", "score": "score", "compute_advantages": "advantages",
         "sound_update": "update"}
JOBS = {"default": [], "long_turns": ["+setting=long_turns", "model.pinned_cache=assets/long_turns"],
        "long_horizon": ["+setting=long_horizon", "model.pinned_cache=assets/long_horizon"]}
OLD = ["actor_rollout_ref.rollout.lean_forward=false", "engine.causal_attention=false",  # the step at 872d077
       "engine.last_layer_where_read=false", "engine.micro_batch_split=rows"]
# the trainers a job builds (--variants): old = the step at 872d077; prev = this tree's defaults but the last layer at
# every position and micro-batches cut every micro_batch_size_per_gpu rows (the update before its second pass);
# rows = this tree's defaults but engine.micro_batch_split=rows; new = this tree's defaults. Ratios are to the last.
VARIANTS = {"old": OLD, "prev": ["engine.last_layer_where_read=false", "engine.micro_batch_split=rows"],
            "rows": ["engine.micro_batch_split=rows"], "new": []}


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def clock() -> float:
    """This process's CPU seconds (all its threads): on a shared machine, the time it ran, not the time it waited
    for a core (with ``--threads 1``, the work done)."""
    return time.process_time()


class PhaseTimer:
    """Wraps the trainer's phase methods: CPU seconds (:func:`clock`) per phase of the last step, and wall seconds
    of the whole step; optional per-phase profiles."""

    def __init__(self, tr, profile: bool = False):
        self.times: Dict[str, float] = {}
        self.profiles: Dict[str, str] = {}
        self.profile = profile
        for name in PHASES:
            self._wrap(tr, name)

    def _wrap(self, tr, name: str) -> None:
        fn = getattr(tr, name)

        def timed(*a, **k):
            prof = torch.profiler.profile() if self.profile else None
            if prof is not None:
                prof.__enter__()
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                self.times[name] = self.times.get(name, 0.0) + clock() - t
                if prof is not None:
                    prof.__exit__(None, None, None)
                    self.profiles[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8)

        setattr(tr, name, timed)

    def step(self, tr) -> Dict[str, float]:
        self.times = {}
        t, wall = clock(), time.perf_counter()
        metrics = tr.train_step()
        tr.step += 1
        total = clock() - t
        out = {NAMES[k]: v for k, v in self.times.items()}
        out["elsewhere"] = total - sum(self.times.values())
        out["step"] = total
        out["wall"] = time.perf_counter() - wall
        self.last_metrics = metrics
        return out


# ------------------------------------------------------------------------------------------ arithmetic
def model_dims(model) -> Dict[str, int]:
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    H, inner = c.hidden_size, c.intermediate_size
    lin = H * c.num_attention_heads * d * 2 + 2 * H * c.num_key_value_heads * d + 3 * H * inner  # q, o, k, v, mlp
    return dict(H=H, layers=c.num_hidden_layers, heads=c.num_attention_heads, kv=c.num_key_value_heads, d=d,
                V=c.vocab_size, lin=lin * c.num_hidden_layers, inner=inner, lin_kv=2 * H * c.num_key_value_heads * d)


def forward_flops(dims, lengths: List[int], head_positions: int, reads: List[List[int]] | None = None) -> float:
    """FLOPs of one forward over rows of ``lengths`` real tokens (each token attends to all before it), with the
    vocabulary projection at ``head_positions`` positions. ``reads`` (per row, the context length of each position
    whose output is read): the last layer runs its key/value projections at every token and the rest (query,
    attention, output projection, MLP) at those positions only (``engine.last_layer_where_read``)."""
    tokens = sum(lengths)
    ctx = sum(n * (n + 1) / 2 for n in lengths)  # sum over tokens of the keys each attends to
    L, att = dims["layers"], 4 * dims["heads"] * dims["d"]
    head = 2 * dims["H"] * dims["V"] * head_positions
    if reads is None:
        return 2 * dims["lin"] * tokens + att * L * ctx + head
    layer = dims["lin"] // L
    read_ctx = [c for row in reads for c in row]
    last = 2 * dims["lin_kv"] * tokens + 2 * (layer - dims["lin_kv"]) * len(read_ctx) + att * sum(read_ctx)
    return (L - 1) * (2 * layer * tokens + att * ctx) + last + head


def phase_arithmetic(tr, batch_lengths: List[int], responses: int, turns_tokens: List[List[int]]):
    """``{phase: (flops, bytes)}`` the step's phases need (bytes: the decode steps' reads of weights and cached
    keys/values; None where the phase is compute-bound). The score and update count what ``tr``'s forward does:
    with ``engine.last_layer_where_read`` the last layer at the read positions (the one before each response
    token: ``turns_tokens`` are their context lengths) only."""
    dims = model_dims(tr.actor)
    reads = turns_tokens if tr.cfg.engine.last_layer_where_read else None
    fwd_actor = forward_flops(dims, batch_lengths, responses, reads)
    fwd_critic = forward_flops(dims, batch_lengths, 0, reads)
    a, c = tr.cfg.actor_rollout_ref.actor.ppo_epochs, tr.cfg.critic.ppo_epochs
    update = 3 * fwd_actor * a + (3 * fwd_critic * c if tr.critic is not None else 0)
    score = fwd_actor + (fwd_critic if tr.critic is not None else 0)
    rollout = forward_flops(dims, batch_lengths, responses)
    weight_bytes = sum(p.numel() * p.element_size() for p in tr.actor.parameters())
    kv_token = 2 * dims["layers"] * dims["kv"] * dims["d"] * 4
    # each sampled token's decode step reads the weights once per step (shared by the rows) and its row's keys/values
    decode_bytes = sum(kv_token * ctx for row in turns_tokens for ctx in row)
    steps = max((len(r) for r in turns_tokens), default=0)
    rollout_bytes = decode_bytes + weight_bytes * steps
    return {"rollout": (rollout, rollout_bytes), "score": (score, None), "update": (update, None)}


def decode_contexts(batch) -> List[List[int]]:
    """Per row, the context length at each sampled token (what its decode step reads)."""
    out = []
    for e in batch.episodes:
        out.append([i for i, m in enumerate(e.response_mask) if m])
    return out


# ------------------------------------------------------------------------------------------ bounds measured here
def matmul_rate(dims, rows: int, repeats: int = 5) -> float:
    """FLOP/s of ``x[rows, in] @ W.T`` over the shapes of one layer's weights: the median of ``repeats`` timings
    of the whole set."""
    H, inner = dims["H"], dims["inner"]
    shapes = [(H, dims["heads"] * dims["d"]), (H, dims["kv"] * dims["d"]), (H, dims["kv"] * dims["d"]),
              (dims["heads"] * dims["d"], H), (H, inner), (H, inner), (inner, H)]
    xs = {i: torch.randn(rows, i) for i in {s[0] for s in shapes}}
    ws = [torch.randn(o, i) for i, o in shapes]
    flops = sum(2 * rows * i * o for i, o in shapes)
    ts = []
    for _ in range(repeats + 1):
        t = clock()
        for (i, _o), w in zip(shapes, ws):
            torch.nn.functional.linear(xs[i], w)
        ts.append(clock() - t)
    return flops / statistics.median(ts[1:])


def copy_bandwidth(mb: int = 256, repeats: int = 5) -> float:
    """Bytes/s of ``y.copy_(x)`` of ``mb`` MB (read + write counted)."""
    x = torch.randn(mb * 2 ** 20 // 4)
    y = torch.empty_like(x)
    ts = []
    for _ in range(repeats + 1):
        t = clock()
        y.copy_(x)
        ts.append(clock() - t)
    return 2 * x.numel() * 4 / statistics.median(ts[1:])


# ------------------------------------------------------------------------------------------ main
def build(job: str, groups: int | None, extra: List[str], variant: str):
    over = ["env=sokoban", "algo=turn_ppo", "device=cpu", "trainer.overwrite=true", "trainer.test_freq=0",
            "trainer.save_freq=0", "trainer.val_before_train=false",
            f"trainer.default_local_dir=/tmp/ragen_turn_bench_step/{job}_{variant}",
            *JOBS[job], *extra, *VARIANTS[variant]]
    if groups:  # a smaller batch: mini-batches of at most the batch
        over += [f"es_manager.train.env_groups={groups}", f"ppo_mini_batch_size={min(64, 4 * groups)}"]
    return build_trainer(compose_config(over), log=lambda *_: None)


def metrics_gap(a: Dict[str, float], b: Dict[str, float], floor: float = 1e-6):
    """``(gap, key)``: the largest relative difference between two steps' metrics (``perf/*`` aside; inf for a
    missing key), relative to ``max(|x|, |y|, floor)``: metrics that are float noise in both (``actor/ppo_kl`` of
    an on-policy mini-batch, ~1e-9) do not count as a relative gap of 1."""
    gap, worst = 0.0, "-"
    for k, x in a.items():
        y = b.get(k)
        if k.startswith("perf/") or (x != x and y != y) or x == y:
            continue
        g = float("inf") if y is None else abs(x - y) / max(abs(x), abs(y), floor)
        if g > gap:
            gap, worst = g, k
    return gap, worst


def run_job(job: str, a) -> None:
    names = list(a.variants)
    last = names[-1]
    print(f"\n=== job {job}: {' '.join(JOBS[job]) or '(the default)'}"
          f"{f', env_groups={a.groups}' if a.groups else ''}; variants {' '.join(names)} (ratios to {last}); "
          f"{load()}", flush=True)
    trainers = {k: build(job, a.groups, a.set, k) for k in names}
    trainers[last].sampler.record_logprobs = True  # kept beside the recomputed ones: their gap is printed
    timers = {k: PhaseTimer(tr) for k, tr in trainers.items()}
    times: Dict[str, List[Dict[str, float]]] = {k: [] for k in names}
    same_tokens: Dict[str, List[bool]] = {k: [] for k in names[:-1]}
    same_m: Dict[str, List[float]] = {k: [] for k in names[:-1]}
    for _ in range(a.steps):
        batches = {}
        for k in names:  # interleaved: every variant's step 1, then every variant's step 2, ...
            tr = trainers[k]
            if a.rollout_only:  # the sampler alone: same weights every time, seeds of step 0
                t = clock()
                batches[k] = tr.rollout(0)
                times[k].append({"rollout": clock() - t})
                timers[k].last_metrics = {}
                continue
            rollout = tr.rollout
            tr.rollout = lambda step, rollout=rollout, k=k: batches.setdefault(k, rollout(step))
            times[k].append(timers[k].step(tr))
            tr.rollout = rollout
        for k in names[:-1]:
            same_tokens[k].append([e.token_ids for e in batches[k].episodes]
                                  == [e.token_ids for e in batches[last].episodes])
            same_m[k].append(metrics_gap(timers[k].last_metrics, timers[last].last_metrics))  # (gap, key)
    batch = batches[last]
    lengths = [len(e.token_ids) for e in batch.episodes]
    responses = int(batch.response_mask.sum())
    ar = phase_arithmetic(trainers[last], lengths, responses, decode_contexts(batch))
    full = phase_arithmetic(trainers[names[0]], lengths, responses, decode_contexts(batch))  # the first variant's
    dims = model_dims(trainers[last].actor)
    mb = trainers[last].cfg.micro_batch_size_per_gpu
    rate_decode = matmul_rate(dims, len(lengths))
    rate_prefill = matmul_rate(dims, int(statistics.mean(lengths)) * min(len(lengths), 64))
    rate_train = matmul_rate(dims, int(statistics.mean(lengths)) * mb)
    bw = copy_bandwidth()
    same = "; ".join(f"samples {k} == {last}: {all(same_tokens[k])} (per step {same_tokens[k]}), step metrics' "
                     f"largest relative gap {k} vs {last} (perf/* aside, floor 1e-6), per step: "
                     f"{', '.join(f'{g:.2g} ({key})' for g, key in same_m[k])}" for k in names[:-1])
    print(f"batch: {len(lengths)} episodes, {sum(lengths)} tokens (mean {statistics.mean(lengths):.0f}, max "
          f"{max(lengths)}), {responses} sampled; torch threads {torch.get_num_threads()}; {same}")
    if batch.sampled_logp is not None and batch.old_logp is not None:
        m = batch.response_mask.bool()
        gap = (batch.sampled_logp[m] - batch.old_logp[m]).abs()
        print(f"the sampler's log-probs vs the scoring forward's (rollout.sampler_logprobs would use them): max |diff| "
              f"{float(gap.max()):.2g}, mean {float(gap.mean()):.2g}, bitwise equal {bool((gap == 0).all())}")
    print(f"measured here: matmul {rate_decode / 1e9:.1f} GFLOP/s at {len(lengths)} rows (decode), "
          f"{rate_prefill / 1e9:.1f} at {int(statistics.mean(lengths)) * min(len(lengths), 64)} rows (prefill), "
          f"{rate_train / 1e9:.1f} at {int(statistics.mean(lengths)) * mb} rows (a micro-batch); copy {bw / 1e9:.1f} "
          f"GB/s; GFLOP and bound: what {last}'s forwards do (score, update: {full['score'][0] / 1e9:.1f}, "
          f"{full['update'][0] / 1e9:.1f} GFLOP in {names[0]}'s)")
    print(f"{'phase':<11} " + " ".join(f"{k + ' cpu':>9}" for k in names) + " "
          + " ".join(f"{k + '/' + last:>9}" for k in names[:-1])
          + f" {'GFLOP':>8} {'MB read':>8} {'bound s':>8} {last + ' of bound':>12}")
    for phase in ("rollout",) if a.rollout_only else ("rollout", "filter", "score", "advantages", "update",
                                                      "elsewhere", "step"):
        med = {k: statistics.median(t.get(phase, 0.0) for t in times[k]) for k in names}
        n = med[last]
        flops, nbytes = ar.get(phase, (None, None))
        bound = None
        if flops is not None:
            # the rollout: prefill at the prefill rate, the sampled tokens' steps bounded by bytes or decode matmuls
            rate = rate_train if phase in ("score", "update") else rate_prefill
            bound = flops / rate
            if nbytes is not None:
                bound = max(bound, nbytes / bw)
        if phase == "step":
            bound = sum(ar[p][0] / (rate_train if p != "rollout" else rate_prefill) for p in ar)
        ratios = " ".join(f"{med[k] / n:9.2f}" if n > 0 else f"{'-':>9}" for k in names[:-1])
        fl = f"{flops / 1e9:8.1f}" if flops else f"{'':>8}"
        by = f"{nbytes / 1e6:8.1f}" if nbytes else f"{'':>8}"
        bs = f"{bound:8.2f}" if bound else f"{'':>8}"
        of = f"{bound / n:12.1%}" if bound and n > 0 else f"{'':>12}"
        print(f"{phase:<11} " + " ".join(f"{med[k]:9.2f}" for k in names) + f" {ratios} {fl} {by} {bs} {of}")
    walls = "" if a.rollout_only else "wall seconds of a step: " + ", ".join(
        f"{k} {statistics.median(t.get('wall', 0.0) for t in times[k]):.1f}" for k in names) + "; "
    print(f"(CPU seconds of this process; {a.steps} step(s) each, medians; {walls}{load()})", flush=True)
    if a.profile:
        for k in names:
            timer = PhaseTimer(trainers[k], profile=True)
            timer.step(trainers[k])
            for phase, table in timer.profiles.items():
                if phase in ("rollout", "score", "sound_update"):
                    print(f"--- top operations, {k} {NAMES[phase]} (self CPU) ---\n{table}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", nargs="+", default=["default"], choices=list(JOBS))
    ap.add_argument("--groups", type=int, default=None, help="es_manager.train.env_groups (default: the job's)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rollout-only", action="store_true", help="time the rollout alone (old vs new sampler)")
    ap.add_argument("--set", action="append", default=[], help="more Hydra overrides (every trainer)")
    ap.add_argument("--variants", nargs="+", default=["old", "prev", "new"], choices=list(VARIANTS),
                    help="the trainers to build and interleave; ratios are to the last")
    a = ap.parse_args()
    quiet_transformers()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"[bench_step] torch {torch.__version__}, {torch.get_num_threads()} threads, {load()}")
    for job in a.job:
        run_job(job, a)


if __name__ == "__main__":
    main()
