"""msprof-analyze's advisor, where installed: run on a profile folder, its findings read back.

Ascend users already run `msprof-analyze advisor all -d <folder>`; its verdicts are the ones
they trust, so a run keeps the advisor's own output beside ours and folds its findings into
the plan, each marked as the advisor's. It is optional: msprof-analyze is pure Python but
heavy, and is installed by the `[npu]` extra or in a separate virtualenv
(`TRAINBRIDGE_MSPROF_ANALYZE` names its executable). Without it our analysers stand alone.

The advisor writes an `.xlsx` workbook (`<out>/log/mstt_advisor_*.xlsx`) and an `.html` page.
The workbook is read with the standard library (an `.xlsx` is a zip of XML): the `problems`
sheet gives one finding per category, and the `Affinity API Issues` sheet names the fused
API to use and the user's code stack, which maps to our catalog (and so to a pattern).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from ...targets import npu_catalog
from .models import AdvisorReport, Finding

ENV = "TRAINBRIDGE_MSPROF_ANALYZE"
SOURCE = "msprof-analyze"
TIMEOUT_S = 600
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
_FRAME_FILE_LINE = re.compile(r"^\s*(?P<file>[^()\s]+\.py)\((?P<line>\d+)\)")


def advisor_command() -> list[str] | None:
    """How to start msprof-analyze here: $TRAINBRIDGE_MSPROF_ANALYZE, the `msprof-analyze` on
    PATH, or the importable package; None when none is installed."""
    exe = os.environ.get(ENV)
    if exe:
        return [exe]
    found = shutil.which("msprof-analyze")
    if found:
        return [found]
    if importlib.util.find_spec("msprof_analyze") is not None:
        main = ("import sys; from msprof_analyze.cli.entrance import msprof_analyze_cli; "
                "sys.argv[0] = 'msprof-analyze'; sys.exit(msprof_analyze_cli())")
        return [sys.executable, "-c", main]
    return None


def read_xlsx(path: Path) -> dict[str, list[list[str]]]:
    """Sheets of an .xlsx workbook as rows of strings."""
    with zipfile.ZipFile(path) as z:
        shared = []
        if "xl/sharedStrings.xml" in z.namelist():
            shared = ["".join(t.text or "" for t in si.iter(_NS + "t"))
                      for si in ET.fromstring(z.read("xl/sharedStrings.xml")).findall(_NS + "si")]
        rels = {r.get("Id"): r.get("Target") for r in ET.fromstring(z.read("xl/_rels/workbook.xml.rels"))}
        sheets = {}
        for s in ET.fromstring(z.read("xl/workbook.xml")).find(_NS + "sheets"):
            target = rels[s.get(_REL)].lstrip("/")
            target = target if target.startswith("xl/") else "xl/" + target
            rows = []
            for row in ET.fromstring(z.read(target)).iter(_NS + "row"):
                cells = []
                for c in row.findall(_NS + "c"):
                    v, inline = c.find(_NS + "v"), c.find(_NS + "is")
                    if c.get("t") == "s" and v is not None:
                        cells.append(shared[int(v.text)])
                    elif inline is not None:
                        cells.append("".join(t.text or "" for t in inline.iter(_NS + "t")))
                    else:
                        cells.append(v.text if v is not None and v.text is not None else "")
                rows.append(cells)
            sheets[s.get("name")] = rows
        return sheets


def _rows(sheets: dict, name: str) -> list[dict[str, str]]:
    rows = sheets.get(name, [])
    if not rows:
        return []
    head = rows[0]
    return [dict(zip(head, r)) for r in rows[1:]]


def _user_lines(stack: str) -> list[str]:
    lines = []
    for fr in stack.replace(";", "\n").splitlines():
        mm = _FRAME_FILE_LINE.match(fr)
        if mm and "site-packages" not in mm.group("file") and "/torch" not in mm.group("file"):
            lines.append(f"{Path(mm.group('file')).name}:{mm.group('line')}")
    return lines


def findings_of(sheets: dict[str, list[list[str]]]) -> list[Finding]:
    """The workbook as findings: one per fused API it names (with its pattern and the user's
    lines), then one per problem category it lists."""
    out: list[Finding] = []
    for row in _rows(sheets, "Affinity API Issues"):
        api = (row.get("Affinity API") or "").strip()
        if not api:
            continue
        name = api.rsplit(".", 1)[-1]
        try:
            pattern = npu_catalog.entry(name).pattern
        except KeyError:
            pattern = None
        stack = row.get("Code stacks") or row.get("Code Stacks") or next(
            (v for k, v in row.items() if k and "stack" in k.lower()), "")
        out.append(Finding(rule=f"{SOURCE}.affinity_api", severity="medium", source=SOURCE,
                           message=f"the advisor suggests {api}" + (f" for {stack.splitlines()[0]}" if stack else ""),
                           suggestion=name, source_lines=_user_lines(stack), pattern=pattern))
    for row in sheets.get("problems", [])[1:]:
        if not row or not row[0].strip():
            continue
        category = row[0].strip()
        text = " ".join(x.strip() for x in row[1:3] if x and x.strip())
        out.append(Finding(rule=f"{SOURCE}.{category.lower().replace(' ', '_')}", severity="info", source=SOURCE,
                           message=f"{category}: {text}"[:500]))
    return out


def overall_of(sheets: dict[str, list[list[str]]]) -> dict[str, float]:
    return {r[0].strip(): float(r[2].rstrip("%")) / 100 for r in sheets.get("Overall Summary", [])[1:]
            if len(r) > 2 and r[2].strip().endswith("%") and r[2].strip().rstrip("%").replace(".", "", 1).isdigit()}


def run_advisor(profile_dir: str | Path, out_dir: str | Path, *, command: list[str] | None = None,
                timeout_s: float = TIMEOUT_S) -> AdvisorReport | None:
    """`msprof-analyze advisor all` on one `*_ascend_pt` folder (or a parent of several ranks),
    its output kept in `out_dir`; None when msprof-analyze is not installed. A failed run is a
    report with its return code and the tail of its log, not an exception: the advisor adds to
    our analysis, it never stops a run."""
    cmd = command or advisor_command()
    if cmd is None:
        return None
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_MODE"}  # its agent mode writes no files
    full = [*cmd, "advisor", "all", "-d", str(Path(profile_dir).resolve()), "-o", str(out), "-l", "en", "--force"]
    try:
        proc = subprocess.run(full, cwd=out, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return AdvisorReport(command=full, out_dir=str(out), note=f"the advisor did not finish in {timeout_s:.0f} s")
    except OSError as e:
        return AdvisorReport(command=full, out_dir=str(out), note=f"the advisor could not start: {e}")
    log = proc.stdout + proc.stderr
    (out / "advisor.log").write_text(log)
    html = sorted(str(p) for p in out.glob("mstt_advisor_*.html"))
    books = sorted((out / "log").glob("mstt_advisor_*.xlsx"))
    errors = [ln.strip() for ln in log.splitlines() if "][ERROR][" in ln][:50]
    rep = AdvisorReport(command=full, returncode=proc.returncode, out_dir=str(out), html=html, errors=errors,
                        xlsx=str(books[-1]) if books else None)
    if not books:
        rep.note = f"the advisor wrote no workbook (exit {proc.returncode}): {log[-500:]}"
        return rep
    try:
        sheets = read_xlsx(books[-1])
    except (zipfile.BadZipFile, KeyError, ET.ParseError) as e:
        rep.note = f"the advisor's workbook could not be read: {e}"
        return rep
    rep.findings, rep.overall = findings_of(sheets), overall_of(sheets)
    return rep
