"""CI: the package as a user installs it without a clone's help.

Builds a wheel of this checkout, installs it into a fresh virtualenv, and from a folder
outside the checkout runs what a user of the installed package runs first:

1. `trainbridge --help` and `--version`, and `records extract` of the shipped series (package data);
2. a tiny `trainbridge run` on a small program (the loop's test fixture, copied);
3. `trainbridge run --agent llm` against a scripted OpenAI-compatible server on 127.0.0.1,
   which must receive the shipped system prompt (a wheel without its prompts once made the
   model path decline every candidate).

The virtualenv sees the test environment's site-packages (`--system-site-packages`) so torch
and the other dependencies are not downloaded again; the wheel itself is installed into the
virtualenv, and the check fails unless `import trainbridge` resolves there. Exit status 0
when every step passed; each failure is printed with the command's output tail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.kits.openai_server import FakeOpenAIServer  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "loop" / "minigpt"
TINY_RUN = ["--budget", "1", "--pairs", "2", "--looks", "1", "--baseline-runs", "4", "--skip-collect",
            "--no-compile-compare", "--runs-root", "runs"]


def sh(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="trainbridge-wheel-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINBRIDGE_PROMPTS")}
    env["COLUMNS"] = "200"
    try:
        dist = work / "dist"
        sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
           cwd=work, env=env)
        (wheel,) = dist.glob("trainbridge-*.whl")
        venv = work / "venv"
        sh([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=work, env=env)
        py, exe = venv / "bin" / "python", venv / "bin" / "trainbridge"
        sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(wheel)], cwd=work, env=env)
        where = sh([str(py), "-c", "import trainbridge; print(trainbridge.__file__)"], cwd=work, env=env).stdout.strip()
        if not where.startswith(str(venv)):
            sys.exit(f"`import trainbridge` in the virtualenv resolved to {where}, not the installed wheel")
        prompts = Path(where).parent / "prompts" / "system.md"
        if not prompts.is_file():
            sys.exit(f"the wheel has no prompts: {prompts} is missing")
        shipped = Path(where).parent / "records" / "shipped_logs"
        if len(list(shipped.glob("*/*.txt"))) < 10:
            sys.exit(f"the wheel lacks the shipped record-style series: {shipped}")
        sh([str(exe), "--help"], cwd=work, env=env)
        table = sh([str(exe), "records", "extract", str(shipped)], cwd=work, env=env).stdout
        if "ModernArch" not in table:
            sys.exit(f"`records extract` of the shipped series printed no record table:\n{table[-2000:]}")
        print(sh([str(exe), "--version"], cwd=work, env=env).stdout.strip())

        program = work / "minigpt"
        shutil.copytree(FIXTURE, program)
        sh([str(exe), "run", "minigpt", *TINY_RUN], cwd=work, env=env)
        ledgers = list((work / "runs").glob("*/ledger.jsonl"))
        if len(ledgers) != 1 or "run_finished" not in ledgers[0].read_text():
            sys.exit(f"the tiny run left no finished ledger: {ledgers}")

        first_line = prompts.read_text().splitlines()[0].strip()
        answer = {"intent_addressed": "scripted", "mechanism": "fused optimizer", "level": "L1",
                  "hypothesis": {"ops_removed": [], "predicted_saving_pct": 1.0, "reject_if": "no speedup"},
                  "recipe": "fused_optimizer", "edits": []}
        with FakeOpenAIServer([answer] + ["not json"] * 8, model="fake-coder") as srv:
            sh([str(exe), "run", "minigpt", "--agent", "llm", "--model", "fake-coder", "--base-url", srv.base_url,
                *TINY_RUN], cwd=work, env={**env, "OPENAI_API_KEY": "sk-wheel-check"})
            requests = list(srv.requests)
        if not requests:
            sys.exit("the --agent llm run never asked the model")
        system = next((m.get("content", "") for m in requests[0].messages if m.get("role") == "system"), "")
        if first_line not in system:
            sys.exit(f"the model's system message is not the shipped prompt: {json.dumps(system[:300])}")
        print(f"wheel check passed: {wheel.name}, installed at {Path(where).parent}, "
              f"{len(requests)} model request(s) with the shipped system prompt")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
