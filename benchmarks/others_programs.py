"""Programs in other house styles: how much of the available gain the loop finds.

    python benchmarks/others_programs.py [--minutes 8] [--budget 6] [--rounds 5]
                                         [--only hf_blocks,vit_timm] [--runs-root runs/others]
                                         [--reuse NAME=RUN_DIR] [-- trainbridge run options]

Each program under `benchmarks/others/` was written for this benchmark in a style our own
workloads do not use (model-hub modules with Conv1D and a `torch.where` mask, a fused-QKV
framework layout with baddbmm, einsum attention with rotary and SwiGLU, a ViT, a Keras-like
fit loop, a config-globals script). For each, as a new user would:

1. a fresh copy gets `trainbridge init PROGRAM -y` (no hand-written manifest);
2. `trainbridge run PROGRAM --target cpu` with the given budget;
3. the best hand change we know for the program (`HAND_EDITS`: the edits an expert makes,
   mostly attention through SDPA and the fused norm / activation) is applied to the run's
   port, and port, final program and hand-changed port are timed together in one lockstep
   session (`--rounds` rounds, warm-up excluded);
4. the row says final vs port and hand vs port with their intervals, and the share of the
   available gain found: log(final / port) / log(hand / port).

Run it on an otherwise idle machine: ratios are measured side by side, but other load widens
every interval. Results go to `benchmarks/results/others_programs.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PREDICTION_LEDGERS = sorted((ROOT / "benchmarks" / "results").glob("others_programs_ledgers*/*.ledger.jsonl"))

from trainbridge.agent.programs import read_program  # noqa: E402
from trainbridge.ledger import models as ev  # noqa: E402
from trainbridge.ledger.store import Ledger  # noqa: E402
from trainbridge.measure.acceptance import judge  # noqa: E402
from trainbridge.measure.timing import lockstep_session  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

PROGRAMS = ROOT / "benchmarks" / "others"

# The best hand change we know for each program: (file, text in the port, replacement).
HAND_EDITS: dict[str, list[tuple[str, str, str]]] = {
    "hf_blocks": [
        ("train.py", """        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / math.sqrt(value.size(-1))
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output
""", """        return nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
"""),
        ("train.py", "        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * "
                     "torch.pow(input, 3.0))))\n",
         "        return nn.functional.gelu(input, approximate=\"tanh\")\n"),
    ],
    "megatron_qkv": [
        ("train.py", """        matmul_result = torch.empty(b * np_, s, s, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(matmul_result, q, k.transpose(1, 2), beta=0.0, alpha=1.0 / self.norm_factor)
        scores = scores.masked_fill(self.attention_mask[:s, :s], -10000.0)
        probs = torch.softmax(scores, dim=-1)
        context = torch.bmm(probs, v)
""", """        context = F.scaled_dot_product_attention(q.view(b, np_, s, hn), k.view(b, np_, s, hn),
                                                 v.view(b, np_, s, hn), is_causal=True).view(b * np_, s, hn)
"""),
        ("train.py", "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)\n",
         "        return F.rms_norm(x, (x.size(-1),), eps=self.eps)\n"),
        ("train.py", "    return x * 0.5 * (1.0 + torch.erf(x * 0.70710678))\n", "    return F.gelu(x)\n"),
    ],
    "einsum_attn": [
        ("train.py", """        sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        sim = sim + self.causal[:n, :n]
        attn = sim.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
""", """        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
"""),
        ("train.py", """        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return self.scale * (x / rms)
""", """        return F.rms_norm(x, (x.size(-1),), self.scale, self.eps)
"""),
    ],
    "vit_timm": [
        ("train.py", """        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
""", """        x = F.scaled_dot_product_attention(q, k, v, scale=self.scale).transpose(1, 2).reshape(B, N, C)
"""),
    ],
    "keras_loop": [
        ("train.py", """        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, self.dim)
""", """        context = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, self.dim)
"""),
    ],
    "config_globals": [
        ("model.py", """        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
""", """        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0,
                                           is_causal=True)
"""),
    ],
}


def hand_changed(port: dict[str, str], name: str) -> dict[str, str]:
    """The port with the program's hand edits; raises if an edit no longer applies."""
    files = dict(port)
    for rel, old, new in HAND_EDITS[name]:
        if files.get(rel, "").count(old) != 1:
            raise ValueError(f"{name}: the hand edit of {rel} does not apply to the port: {old.splitlines()[0]!r}")
        files[rel] = files[rel].replace(old, new)
    return files


def _share(final: dict, hand: dict) -> float | None:
    """log(final) / log(hand), or None when the hand change's gain is not resolved (its interval
    reaches 1): a share of a gain that may be nothing means nothing."""
    if hand["ci"][0] <= 1.0:
        return None
    return math.log(final["speedup"]) / math.log(hand["speedup"])


def _share_text(r: dict) -> str:
    if r["share"] is None:
        return f"- (the hand change's {r['hand']['speedup']:.3f}x is not resolved)"
    if r["share"] > 1.0:
        return f"**{r['share']:.0%}** (more than the hand change)"
    return f"**{r['share']:.0%}**"


def _ledger_summary(run_dir: Path) -> dict:
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    decided = [e for e in events if isinstance(e, ev.CandidateDecided)]
    return {"accepted": [proposed[d.candidate_id].source.split(":", 1)[-1] for d in decided
                         if d.decision == "accepted"],
            "rejected": [f"{proposed[d.candidate_id].source.split(':', 1)[-1]} ({d.decision})" for d in decided
                         if d.decision != "accepted"]}


def measure(name: str, program_dir: Path, run_dir: Path, rounds: int) -> dict:
    """Port, final and hand-changed port in one lockstep session."""
    workload = load_workload(program_dir)
    port = read_program(run_dir / "port")
    final = read_program(run_dir / "final")
    programs = {"port": port, "final": final, "hand": hand_changed(port, name)}
    session = lockstep_session(workload, "cpu", programs, rounds, out_dir=run_dir / "others_benchmark", seed=1,
                               on_round=lambda i, r: print(f"  {name}: round {i + 1}/{rounds}", flush=True))
    runs = session.runs_ms
    row: dict = {"program": name, "run_dir": str(run_dir), "runs_ms": runs, "problems": session.problems,
                 "violation": session.violation, **_ledger_summary(run_dir)}
    if session.violation or not runs.get("port"):
        return {**row, "error": session.violation or "no round kept: " + "; ".join(session.problems[:2])}
    for arm in ("final", "hand"):
        c = judge(runs["port"], runs[arm], bar=0.0, confidence=0.95)
        row[arm] = {"speedup": c.speedup, "ci": [c.ci_low, c.ci_high], "port_ms": c.median_incumbent_ms,
                    "step_ms": c.median_candidate_ms}
    row["share"] = _share(row["final"], row["hand"])
    return row


def table(rows: list[dict]) -> str:
    out = ["| program | port step | final vs port (95% CI) | best hand change vs port (95% CI) | share of the "
           "available gain found | accepted | rejected |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['program']} | - | failed: {r['error'][:120]} | - | - | - | - |")
            continue
        f, h = r["final"], r["hand"]
        share = _share_text(r)
        out.append(f"| {r['program']} | {f['port_ms']:.0f} ms | {f['speedup']:.3f}x ({f['ci'][0]:.3f}-{f['ci'][1]:.3f})"
                   f" | {h['speedup']:.3f}x ({h['ci'][0]:.3f}-{h['ci'][1]:.3f}) | {share} | "
                   f"{', '.join(r['accepted']) or '-'} | {len(r['rejected'])} |")
    out.append(f"\nMachine: {cpu_signature()}; torch {torch.__version__}. Share = log(final/port) / log(hand/port).")
    return "\n".join(out)


def run_one(name: str, a) -> Path | None:
    """init + run on a fresh copy; returns the run folder, or None if the run made no final program."""
    copy = a.runs_root / "programs" / name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(PROGRAMS / name, copy)
    cli = [sys.executable, "-m", "trainbridge.cli"]
    subprocess.run([*cli, "init", str(copy), "-y"], check=True)
    before = set((a.runs_root / "runs").glob("*")) if (a.runs_root / "runs").exists() else set()
    cmd = [*cli, "run", str(copy), "--target", "cpu", "--minutes", str(a.minutes), "--budget", str(a.budget),
           "--runs-root", str(a.runs_root / "runs"), *a.extra]
    env = None
    if a.calibrate_without_self:
        # the planner's predictions calibrated only by the *other* programs' measured candidates
        others = [str(p) for p in PREDICTION_LEDGERS if not p.name.startswith(name + ".")]
        table = a.runs_root / f"realised-without-{name}.json"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "predictions.py"), *others, "--write-table",
                        str(table), "--out", str(a.runs_root / f"predictions-without-{name}")], check=True,
                       stdout=subprocess.DEVNULL)
        env = {**os.environ, "TRAINBRIDGE_REALISED_SHARES": str(table)}
        print(f"  {name}: predictions calibrated by {len(others)} other ledgers ({table})", flush=True)
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env)
    new = sorted(set((a.runs_root / "runs").glob("*")) - before, key=lambda p: p.stat().st_mtime)
    return new[-1] if new and (new[-1] / "final" / "files.json").exists() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="loop budget per program")
    ap.add_argument("--budget", type=int, default=6, help="most candidates per program")
    ap.add_argument("--rounds", type=int, default=5, help="lockstep rounds of port / final / hand per program")
    ap.add_argument("--only", default=",".join(HAND_EDITS))
    ap.add_argument("--runs-root", type=Path, default=Path("runs") / "others")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--reuse", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="measure a finished run of this program instead of running the loop again")
    ap.add_argument("--table-only", action="store_true", help="rewrite the table from the json results only")
    ap.add_argument("--calibrate-without-self", action="store_true",
                    help="each program's run calibrates its predictions with a table fitted on the other programs' "
                         "ledgers only (benchmarks/results/others_programs_ledgers*), never its own")
    ap.add_argument("extra", nargs="*", help="more `trainbridge run` options, after --")
    a = ap.parse_args()
    if a.table_only:
        rows = json.loads((a.out / "others_programs.json").read_text())
        for r in rows:
            if not r.get("error"):
                r["share"] = _share(r["final"], r["hand"])
        (a.out / "others_programs.md").write_text(table(rows) + "\n")
        print(table(rows))
        return
    a.runs_root = a.runs_root.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    reuse = dict(r.split("=", 1) for r in a.reuse)
    rows = []
    for name in a.only.split(","):
        if name not in HAND_EDITS:
            raise SystemExit(f"unknown program {name!r}: one of {', '.join(HAND_EDITS)}")
        run_dir = Path(reuse[name]).resolve() if name in reuse else run_one(name, a)
        if run_dir is None:
            rows.append({"program": name, "error": "the run made no final program"})
        else:
            rows.append(measure(name, a.runs_root / "programs" / name, run_dir, a.rounds))
        (a.out / "others_programs.json").write_text(json.dumps(rows, indent=1))
        (a.out / "others_programs.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
