"""The recipe interface: where a mechanism applies (`find`) and the rewritten program (`apply`).

A recipe is one mechanism (one rung of the transfer ladder) written as a libcst rewrite.
`find` lists the sites it would change; `apply` returns a `RewriteProposal` with every file's
full new text, or `NotApplicable` with a reason a person can act on. Recipes never see the
harness: they are pure functions of the sources, so the same input always gives the same
candidate (the ledger can re-derive it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from pydantic import BaseModel, Field

from ...patterns import GapClass, Level, Pattern
from ...workload import ProtectedRegion
from ...pysource.syntax import parses

Target = str  # "cpu" | "cuda" | "npu"


class Site(BaseModel):
    """One place a recipe applies: a function (qualname) and the matched source lines."""

    file: str
    qualname: str = Field(..., description="dotted function qualname, or '<module>'")
    line: int = Field(0, description="first line of the matched code in the original file (1-based)")
    end_line: int = Field(0, description="last line of the matched code")
    text: str = Field("", description="the matched source, shortened")
    detail: dict[str, str] = Field(default_factory=dict, description="what the matcher recognised")

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.file, self.qualname, self.line)


class RewriteProposal(BaseModel):
    recipe: str
    target: str = ""
    files: dict[str, str] = Field(..., description="relative path -> full new source (every file of the program)")
    changed_files: list[str]
    description: str
    sites: list[Site]
    ops_removed_estimate: list[str] = Field(default_factory=list, description="ATen ops removed per call site")
    notes: list[str] = Field(default_factory=list, description="caveats a reviewer must know")


class NotApplicable(BaseModel):
    reason: str


def shorten(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


SiteSpec = "str | Site | Iterable[str | Site] | None"


@dataclass
class Recipe:
    """Base class. Subclasses implement `_find_file` and `_rewrite_file`."""

    name: str
    pattern: Pattern
    level: Level
    gap_class: GapClass
    targets: set[str]
    mechanism: str
    per_site: bool = False
    notes: list[str] = field(default_factory=list)
    levels: dict[str, Level] = field(default_factory=dict)  # per-target level when it differs
    unsupported: dict[str, str] = field(default_factory=dict)  # target -> why not
    ops_removed: list[str] = field(default_factory=list)
    # whether an npu dry run (CPU references of torch_npu ops) can validate the rewrite
    dry_run_checkable: bool = True
    # targets where the rewrite is a torch.compile region: its mechanism is "a compiled graph
    # is entered inside the training step", not an operator count (op counting runs eager)
    compiled_on: set[str] = field(default_factory=set)
    # a precision change: its mechanism is "the step's GEMMs/convolutions run in 16-bit"
    # ("lower") or "fewer of them do" ("higher"), read from the op count's dtypes
    gemm_precision: str | None = None

    # ------------------------------------------------------------ interface ----
    def level_for(self, target: str) -> Level:
        return self.levels.get(target, self.level)

    def find(self, files: dict[str, str], target: str, *, protected: list[ProtectedRegion] | None = None) -> list[Site]:
        if target not in self.targets:
            return []
        out: list[Site] = []
        for rel in sorted(files):
            if not rel.endswith(".py"):
                continue
            try:
                out.extend(self._find_file(rel, files[rel], target))
            except cst.ParserSyntaxError:  # a file that does not parse has no sites (recipe bugs do raise)
                continue
        return _outside_protected(out, files, protected)

    def apply(self, files: dict[str, str], target: str, sites: SiteSpec = None, *,
              protected: list[ProtectedRegion] | None = None) -> RewriteProposal | NotApplicable:
        if target not in self.targets:
            why = self.unsupported.get(target, "")
            return NotApplicable(reason=f"{self.name} does not support target {target!r}" + (f": {why}" if why else ""))
        found = self.find(files, target, protected=protected)
        if not found:
            return NotApplicable(reason=self._no_site_reason(files, target))
        chosen = self._select(found, sites)
        if isinstance(chosen, NotApplicable):
            return chosen
        new = dict(files)
        changed, applied, notes = [], [], list(self.notes)
        by_file: dict[str, list[Site]] = {}
        for s in chosen:
            by_file.setdefault(s.file, []).append(s)
        for rel, file_sites in sorted(by_file.items()):
            out = self._rewrite_file(rel, files[rel], target, file_sites)
            if isinstance(out, NotApplicable):
                return out
            text, done, extra = out
            if not done:
                continue
            err = parses(text)
            if err:  # a recipe bug, never a candidate: say so instead of proposing it
                return NotApplicable(reason=f"{self.name}: internal error, rewritten {rel} does not parse ({err})")
            if text != files[rel]:
                new[rel] = text
                changed.append(rel)
                applied.extend(done)
                notes.extend(n for n in extra if n not in notes)
        if not applied:
            return NotApplicable(reason=f"{self.name}: the sites found could not be rewritten")
        where = ", ".join(f"{s.file}:{s.line} {s.qualname}" for s in applied[:6]) + (" ..." if len(applied) > 6 else "")
        return RewriteProposal(
            recipe=self.name, target=target, files=new, changed_files=changed, sites=applied,
            description=f"{self.mechanism} ({target}; {len(applied)} site(s): {where})",
            ops_removed_estimate=self._ops_removed(target, applied), notes=notes,
        )

    # ------------------------------------------------------------ to override ----
    def _find_file(self, rel: str, text: str, target: str) -> list[Site]:
        raise NotImplementedError

    def _rewrite_file(self, rel: str, text: str, target: str, sites: list[Site]):
        """(new text, sites rewritten, extra notes) or NotApplicable."""
        raise NotImplementedError

    def _no_site_reason(self, files: dict[str, str], target: str) -> str:
        return f"{self.name}: no {self.pattern} site found in {', '.join(sorted(f for f in files if f.endswith('.py')))}"

    def _ops_removed(self, target: str, sites: list[Site]) -> list[str]:
        return list(self.ops_removed)

    # ------------------------------------------------------------ helpers ----
    def _select(self, found: list[Site], spec) -> list[Site] | NotApplicable:
        if spec is None:
            return found
        if isinstance(spec, (str, Site)):
            spec = [spec]
        want = list(spec)
        chosen = []
        for w in want:
            if isinstance(w, Site):
                hits = [s for s in found if s.file == w.file and s.qualname == w.qualname and (not w.line or s.line == w.line)]
            else:
                hits = [s for s in found if s.qualname == w]
            if not hits:
                names = sorted({s.qualname for s in found})
                return NotApplicable(reason=f"{self.name}: no site {getattr(w, 'qualname', w)!r}; sites are {names}")
            chosen.extend(h for h in hits if h not in chosen)
        return chosen


def off_limits(files: dict[str, str], protected: list[ProtectedRegion] | None,
               editable: list[str] | None) -> list[ProtectedRegion]:
    """The manifest's protected regions plus every program file no `editable` glob admits:
    what a recipe may neither find sites in nor rewrite (the guard would reject it anyway)."""
    import fnmatch

    out = list(protected or [])
    if editable is not None:
        out += [ProtectedRegion(file=rel, whole_file=True, reason="not editable under the manifest")
                for rel in files if not any(fnmatch.fnmatch(rel, g) for g in editable)]
    return out


def _outside_protected(sites: list[Site], files: dict[str, str], protected: list[ProtectedRegion] | None) -> list[Site]:
    """Drop sites inside protected symbols or protected files (the harness owns those)."""
    if not protected:
        return sites
    out = []
    for s in sites:
        hit = False
        for region in protected:
            if region.file != s.file:
                continue
            if region.whole_file:
                hit = True
            for sym in region.symbols:
                if s.qualname == sym or s.qualname.startswith(sym + "."):
                    hit = True
        if not hit:
            out.append(s)
    return out
