"""Whether a recorded program lowered precision, read back from its candidates' saved proposals.

The loop compares losses at the low-precision tolerance once a candidate lowered precision;
the post-run commands must use the same tolerance when they hold a timed run to its pair.
"""

from __future__ import annotations

from ..agent.rewriters.base import Proposal
from ..agent.state import RunPaths
from ..ledger import models as ev


def proposal_lowers_precision(paths: RunPaths, candidate_id: str) -> bool:
    saved = paths.candidate_dir(candidate_id) / "proposal.json"
    return saved.exists() and Proposal.model_validate_json(saved.read_text()).low_precision


def chain_lowers_precision(paths: RunPaths, candidate_id: str, proposed: dict[str, ev.CandidateProposed]) -> bool:
    """The candidate, or one it was built on (its incumbents back to the port), lowered precision."""
    while candidate_id in proposed:
        if proposal_lowers_precision(paths, candidate_id):
            return True
        candidate_id = proposed[candidate_id].incumbent
    return False


def accepted_lower_precision(paths: RunPaths, events: list) -> bool:
    """An accepted candidate of the run lowered precision: its final program runs at low precision."""
    return any(proposal_lowers_precision(paths, e.candidate_id) for e in events
               if isinstance(e, ev.CandidateDecided) and e.decision == "accepted")
