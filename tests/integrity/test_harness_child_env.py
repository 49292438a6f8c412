"""What a harness child inherits, tried with the program that would abuse it.

Each test runs the tiny harness program with a few lines prepended: it reads a credential
from its environment, floods its output, or leaves processes behind. The harness must
withhold the credential, bound the output, and end every process the program started.
"""

import os
import shutil
import time
from pathlib import Path

import pytest

from trainbridge.harness.child_env import SECRET_NAME, child_environment, read_tail
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

TINY = FIXTURES / "harness" / "tiny"
HEAD = "import torch.nn.functional as F\n"


def _program(prelude: str) -> dict[str, str]:
    text = (TINY / "train.py").read_text()
    assert HEAD in text
    return {"train.py": text.replace(HEAD, HEAD + prelude, 1)}


def _tiny(tmp_path, sandbox: bool = True):
    """A copy of the tiny workload under the temporary folder: a user's workload can lie anywhere,
    /tmp included (where the sandbox allows scratch writes), and an attack must not reach it there."""
    root = tmp_path / "workload"
    if not root.exists():
        shutil.copytree(TINY, root)
    wl = load_workload(root)
    m = wl.manifest.model_copy(update={"limits": wl.manifest.limits.model_copy(update={"sandbox": sandbox})})
    return wl.model_copy(update={"manifest": m})


def _run(tmp_path, prelude: str, sandbox: bool = True, out_dir=None, **kwargs):
    return run_workload(_tiny(tmp_path, sandbox), "cpu", out_dir=out_dir or tmp_path / "out",
                        sources=_program(prelude), warmup_steps=1, measured_steps=2, **kwargs)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "OPENAI_BASE_URL", "GITHUB_TOKEN", "MY_SERVICE_SECRET",
                                  "DB_PASSWORD", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY"])
def test_credential_names_are_withheld(name):
    assert SECRET_NAME.search(name)
    assert name not in child_environment({name: "x", "PATH": "/bin"}, {})


@pytest.mark.parametrize("name", ["PATH", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "KMP_AFFINITY",
                                  "TASK_QUEUE_ENABLE", "ASCEND_OPP_PATH", "PYTORCH_NPU_ALLOC_CONF", "KEYBOARD"])
def test_the_runtime_knobs_a_program_needs_pass(name):
    assert child_environment({name: "1"}, {}) == {name: "1"}


def test_a_program_cannot_read_the_llm_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("TINY_VISIBLE", "yes")
    r = _run(tmp_path, "import os as _o\nprint('seen', _o.environ.get('OPENAI_API_KEY'), "
                       "_o.environ.get('TINY_VISIBLE'), flush=True)\n")
    assert r.status == "ok", r.error
    assert "seen None yes" in r.stdout_tail
    assert "sk-must-not-leak" not in r.stdout_tail + r.stderr_tail


def test_a_print_flood_ends_the_run_at_the_file_size_limit(tmp_path):
    flood = "import sys as _s\n_line = 'x' * 1023 + '\\n'\nfor _ in range(10 * 1024):\n    _s.stdout.write(_line)\n"
    r = _run(tmp_path, flood, max_file_mb=2)
    assert r.status == "crashed", r.status
    logs = list(Path(tmp_path).rglob("*.stdout.log"))
    assert logs and all(p.stat().st_size <= 2 * 2**20 for p in logs)
    assert "File too large" in r.error or "MiB limit" in r.error, r.error


def test_background_processes_end_with_the_run(tmp_path):
    # one in the child's process group, one that left it (setsid): neither may outlive the run
    prelude = ("import subprocess as _sp\n"
               "_a = _sp.Popen(['sleep', '300'])\n"
               "_b = _sp.Popen(['sleep', '300'], start_new_session=True)\n"
               "print('pids', _a.pid, _b.pid, flush=True)\n")
    r = _run(tmp_path, prelude, sandbox=False)  # the sandbox would refuse the Popen itself
    assert r.status == "ok", r.error
    pids = [int(p) for p in r.stdout_tail.split("pids", 1)[1].split()[:2]]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), [p for p in pids if _alive(p)]


def test_ctrl_c_in_the_parent_ends_the_child(tmp_path):
    seen = []

    def interrupt(step):
        seen.append(step)
        raise KeyboardInterrupt

    prelude = "import os as _o\nprint('child', _o.getpid(), flush=True)\n"
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, prelude, on_step=interrupt)
    assert seen
    out = next(Path(tmp_path).rglob("*.stdout.log")).read_text()
    pid = int(out.split("child", 1)[1].split()[0])
    time.sleep(0.2)
    assert not _alive(pid)


def test_read_tail_reads_only_the_end(tmp_path):
    p = tmp_path / "big.log"
    p.write_bytes(b"a" * 5000 + b"END")
    assert read_tail(p, 10) == "a" * 7 + "END"
    assert read_tail(tmp_path / "missing.log") == ""
    assert os.path.getsize(p) == 5003


@pytest.mark.parametrize("attack, refused", [
    ("open('trainbridge.toml', 'w').write('name = \"pwned\"')", "may not write"),  # a link to the user's file
    ("import os as _o\n_o.system('true')", "may not start a process"),
    ("import subprocess as _sp\n_sp.run(['true'])", "may not start a process"),
    ("import socket as _so\n_so.create_connection(('192.0.2.1', 80), timeout=0.1)", "network connection"),
    ("import ctypes as _c\n_c.CDLL(None)", "load a library"),
])
def test_the_sandbox_refuses_what_a_program_may_not_do(tmp_path, attack, refused):
    r = _run(tmp_path, attack + "\n")
    assert r.status == "crashed" and "SandboxViolation" in r.error and refused in r.error, r.error
    assert "pwned" not in (tmp_path / "workload" / "trainbridge.toml").read_text()


def test_the_sandbox_lets_a_program_write_its_own_files_and_libraries_work(tmp_path):
    prelude = ("import os as _o, torch as _t\n"
               "_o.makedirs('logs', exist_ok=True)\n"
               "open('logs/run.txt', 'w').write('ok')\n"
               "_t.save({'w': _t.ones(2)}, 'ckpt.pt')\n"
               "import tempfile as _tf\n_tf.NamedTemporaryFile().close()\n")
    r = _run(tmp_path, prelude)
    assert r.status == "ok", r.error


def test_a_manifest_can_turn_the_sandbox_off(tmp_path):
    r = _run(tmp_path, "import os as _o\n_o.system('true')\n", sandbox=False)
    assert r.status == "ok", r.error


def test_libraries_may_start_processes_for_the_program_torch_compile_included(tmp_path):
    # Inductor searches for and runs the C++ compiler through subprocess; site-packages sits
    # inside the standard library's folder, and must not be mistaken for it.
    prelude = ("import torch as _t\n"
               "_f = _t.compile(lambda x: (x * 2).sin() + 1)\n"
               "print('compiled', round(float(_f(_t.ones(4)).sum()), 3), flush=True)\n")
    r = _run(tmp_path, prelude)
    assert r.status == "ok", r.error
    assert "compiled 7.637" in r.stdout_tail


def test_the_write_rule_keeps_the_workload_read_only_wherever_it_lies(tmp_path):
    from trainbridge.harness.sandbox import Sandbox

    workload, program, results = tmp_path / "wl", tmp_path / "wl" / "runs" / "p", tmp_path / "wl" / "runs" / "results"
    box = Sandbox(str(program), [str(results)], [str(workload)])
    assert box.may_write(str(program / "logs" / "x.txt"))       # its own folder, inside the workload
    assert box.may_write(str(results / "r.steps.jsonl"))       # the harness's output folder
    assert not box.may_write(str(workload / "data" / "train.bin"))  # the user's data, under /tmp
    assert box.may_write(str(tmp_path / "scratch.bin"))        # other temporary files
    assert not box.may_write(str(Path.home() / ".bashrc"))


def test_a_program_run_inside_a_run_folder_cannot_read_its_records(tmp_path):
    """The loop's reference losses sit in the run folder, a few levels above a candidate's program."""
    run = tmp_path / "run"
    harness = run / "candidates" / "c01" / "harness"
    harness.mkdir(parents=True)
    (run / "ledger.jsonl").write_text("")
    (run / "baseline_ref.json").write_text('{"losses": [5.5, 4.9]}')
    r = _run(tmp_path, f"print(open({str(run / 'baseline_ref.json')!r}).read())\n", out_dir=harness)
    assert r.status == "crashed" and "SandboxViolation" in r.error and "run's own records" in r.error, r.error
    assert "4.9" not in r.stdout_tail
    assert _run(tmp_path, "open('train.py').read()\n", out_dir=harness).status == "ok"  # its own files stay open


def test_a_program_cannot_import_the_harness(tmp_path):
    r = _run(tmp_path, "import trainbridge.agent.planner\n")
    assert r.status == "crashed" and "may not import the harness" in r.error, r.error


def test_a_program_cannot_read_the_harness_requests_that_tell_validation_from_timing(tmp_path):
    results = tmp_path / "out" / "results"
    r = _run(tmp_path, f"import glob as _g\nprint([open(p).read()[:20] for p in _g.glob({str(results)!r} + '/*.json')])\n")
    assert r.status == "crashed" and "harness's own files" in r.error, r.error


PARENT = """
import sys, shutil
from pathlib import Path
from trainbridge.cli.app import _root
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload
_root()  # what every `trainbridge` command does first: SIGTERM ends it the way Ctrl-C does
tiny, tmp = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(tiny, tmp / "workload")
text = (tiny / "train.py").read_text()
head = "import torch.nn.functional as F\\n"
prelude = "import os as _o, time as _t\\nprint('child', _o.getpid(), flush=True)\\n_t.sleep(300)\\n"
program = {"train.py": text.replace(head, head + prelude, 1)}
run_workload(load_workload(tmp / "workload"), "cpu", out_dir=tmp / "out", sources=program, warmup_steps=1,
             measured_steps=2)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_parent_leaves_no_child_measuring(tmp_path, how):
    # `kill -9` runs no exit path in the parent: the kernel must end the child (PR_SET_PDEATHSIG);
    # a plain `kill` must end it the way Ctrl-C does
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(TINY), str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, pid = time.monotonic() + 60, None
    while pid is None and time.monotonic() < deadline:
        logs = list(tmp_path.rglob("*.stdout.log"))
        text = logs[0].read_text() if logs else ""
        if "child" in text:
            pid = int(text.split("child", 1)[1].split()[0])
        time.sleep(0.1)
    try:
        assert pid is not None and _alive(pid), "the child never started"
        parent.send_signal(getattr(signal, how))
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"the child {pid} outlived its parent ({how})"
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid is not None and _alive(pid):
            os.kill(pid, 9)
    if how == "SIGTERM":
        assert b"KeyboardInterrupt" in parent.stderr.read()
