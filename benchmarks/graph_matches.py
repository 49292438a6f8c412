"""What the post-grad graph's dataflow finds in programs written in other house styles (issue 19).

For each program in `benchmarks/others/` (and nanogpt): a copy gets `trainbridge init -y`, then
its GPU evidence is collected once (fake-CUDA route, as `trainbridge run` does). From that one
capture, two bundles are built: with the graph's edges (what the tool does now) and with the
edges removed (the kernel-level recogniser alone, as before graph matching). The table lists
each graph match (pattern, lines, roles) and what it did to the intents: confirmed one of the
kernel-level intents and widened its spans, or added an intent no kernel-level one covered.

    python benchmarks/graph_matches.py [--only hf_blocks,vit_timm] [--out benchmarks/results]

No timing: recognition only (about a minute per program).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainbridge.evidence.build import bundle_from_raw  # noqa: E402
from trainbridge.evidence.collect import collect_workload  # noqa: E402
from trainbridge.evidence.graph_match import overlaps  # noqa: E402
from trainbridge.evidence.raw import RawCapture  # noqa: E402
from trainbridge.targets.capabilities import cpu_signature  # noqa: E402
from trainbridge.workload import load_workload  # noqa: E402

PROGRAMS = ["hf_blocks", "megatron_qkv", "einsum_attn", "vit_timm", "keras_loop", "config_globals"]


def _spans(spans) -> str:
    return ", ".join(f"{s.start_line}-{s.end_line}" if s.end_line != s.start_line else str(s.start_line)
                     for s in spans) or "-"


def study(name: str, src: Path, work: Path) -> dict:
    copy = work / name
    shutil.copytree(src, copy)
    if not (copy / "trainbridge.toml").exists():
        subprocess.run([sys.executable, "-m", "trainbridge.cli", "init", str(copy), "-y"], check=True,
                       capture_output=True)
    wl = load_workload(copy)
    collect_workload(wl, device="cuda", out_dir=work / f".collect-{name}")
    raw = RawCapture.load(work / f".collect-{name}" / "evidence_raw.json")
    with_graph = bundle_from_raw(raw, source_root=copy, workload_name=name)
    no_edges = raw.model_copy(deep=True)
    for g in no_edges.graphs:
        for n in g.nodes.values():
            n.inputs = []
    kernel_only = bundle_from_raw(no_edges, source_root=copy, workload_name=name)
    rows = []
    for m in with_graph.graph_matches:
        before = [i for i in kernel_only.intents if i.pattern == m.pattern and overlaps(i.spans, m.spans)]
        after = [i for i in with_graph.intents if i.pattern == m.pattern and overlaps(i.spans, m.spans)]
        if before:
            effect = (f"confirmed {before[0].id} ({before[0].confidence:.2f} -> {after[0].confidence:.2f}); "
                      f"its spans {_spans(before[0].spans)} -> {_spans(after[0].spans)}")
        else:
            effect = f"new intent {after[0].id}" if after else "no intent (pattern without target operators)"
        rows.append({"pattern": m.pattern, "lines": _spans(m.spans), "module": m.module,
                     "roles": "; ".join(f"{k} {v}" for k, v in m.roles.items()), "effect": effect})
    missed = [f"{i.id} ({_spans(i.spans)})" for i in with_graph.intents if i.kind == "compiler"
              and i.pattern in ("attention", "rms_norm", "layer_norm", "gelu")
              and not any(overlaps(i.spans, m.spans) for m in with_graph.graph_matches)]
    return {"program": name, "matches": rows, "kernel_intents_without_graph_match": missed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated program names (default: all six and nanogpt)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or PROGRAMS + ["nanogpt"]
    results = []
    with tempfile.TemporaryDirectory(prefix="graph-matches-") as tmp:
        for name in names:
            src = REPO / "workloads" / name if name == "nanogpt" else REPO / "benchmarks" / "others" / name
            print(f"{name}: collecting ...", flush=True)
            results.append(study(name, src, Path(tmp)))
    lines = ["# Patterns found by the post-grad graph's dataflow (issue 19 item 1)", "",
             "`python benchmarks/graph_matches.py` (recognition only, no timing; "
             f"{cpu_signature()}). One capture per program (fake-CUDA route); \"confirmed\" means a "
             "kernel-level intent already covered those lines (built from the same capture with the graph's "
             "edges removed), \"new\" that none did.", "",
             "| program | pattern | lines | module | roles | effect on the intents |", "|---|---|---|---|---|---|"]
    for r in results:
        for m in r["matches"] or [{"pattern": "-", "lines": "-", "module": "", "roles": "", "effect": "no match"}]:
            lines.append(f"| {r['program']} | {m['pattern']} | {m['lines']} | {m['module']} | {m['roles']} | "
                         f"{m['effect']} |")
    lines.append("")
    for r in results:
        if r["kernel_intents_without_graph_match"]:
            lines.append(f"- {r['program']}: kernel-level intents with no graph match: "
                         + ", ".join(r["kernel_intents_without_graph_match"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_matches.md").write_text("\n".join(lines) + "\n")
    (args.out / "graph_matches.json").write_text(json.dumps({"cpu": cpu_signature(), "programs": results}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
