"""`trainbridge records extract` on the checkout layouts of the later records: a dash after
the date, log names that look like dated folders, variant and baseline subfolders, copies,
and the medium / optimization tracks. Each fake checkout here is built in exactly the layout
the public repository has for the record named in the test."""

from __future__ import annotations

from pathlib import Path

from trainbridge.records.extract import extract, is_baseline, parse_record_folder, track_of
from trainbridge.records.logs import SEPARATOR

T1 = Path("records") / "track_1_short"


def _log(tag: str, val_loss: float = 3.279, train_time: int = 90000) -> str:
    """A record-14-on log: the script first, then the run's lines."""
    script = f"# {tag}\nimport torch\n\n\ndef main():\n    return {tag!r}\n"
    return (f"{script}{SEPARATOR}\nstep:0/1480 val_loss:10.8258 train_time:0ms step_avg:0.04ms\n"
            f"step:1480/1480 val_loss:{val_loss} train_time:{train_time}ms step_avg:{train_time / 1480:.2f}ms\n")


def _write(root: Path, rel: str | Path, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _by_key(index):
    return {r.key: r for r in index.records}


def test_folder_names_with_a_dash_after_the_date(tmp_path):
    # records 63 and 68: `2026-01-26-UntieValueEmbeddings`, `2026-01-31-BigramHashH2D`
    _write(tmp_path, T1 / "2026-01-26-UntieValueEmbeddings" / "43955d93-6914-40cb-bdf8-786ace93784f.txt",
           _log("r63", 3.2785))
    _write(tmp_path, T1 / "2026-01-26-UntieValueEmbeddings" / "05a8537d-2283-42f6-8564-cf0cae2c39bd.txt",
           _log("r63-seed2", 3.2790))
    _write(tmp_path, T1 / "2026-01-31-BigramHashH2D" / "112c686e-b0d6-4dc8-814a-1ad1f5d5b274.txt", _log("r68"))
    assert parse_record_folder("2026-01-26-UntieValueEmbeddings") == ("2026-01-26", "UntieValueEmbeddings")
    by = _by_key(extract(tmp_path))
    r63, r68 = by["2026-01-26-UntieValueEmbeddings"], by["2026-01-31-BigramHashH2D"]
    assert (r63.num, r63.track, r63.date, r63.readme_time) == (63, 1, "2026-01-26", "1.650 minutes")
    assert r63.script_log.endswith("43955d93-6914-40cb-bdf8-786ace93784f.txt"), "the README's log, not the first"
    assert "r63" in r63.script and len(r63.logs) == 2 and r63.reference_val_loss == (3.2785 + 3.2790) / 2
    assert r68.num == 68 and "r68" in r68.script


def test_log_names_that_look_like_dated_folders_and_baseline_prior_folders(tmp_path):
    # record 74: the README links pr233/2026-02-16_21-30-05_time-362_secs_F-inject-post-attn_9f12a3.txt
    rec = T1 / "2026-02-16_FlattenForward"
    _write(tmp_path, rec / "pr233" / "2026-02-16_21-30-05_time-362_secs_F-inject-post-attn_9f12a3.txt",
           _log("pr233-linked", 3.2781, 88000))
    _write(tmp_path, rec / "pr233" / "2026-02-16_21-36-08_time-201_secs_F-inject-post-attn_d395c2.txt",
           _log("pr233-seed", 3.2787, 88200))
    _write(tmp_path, rec / "baseline" / "2026-02-16_19-48-12_time-201_secs_baseline_11222e.txt",
           _log("baseline", 3.2779, 89000))
    _write(tmp_path, rec / "prior" / "2026-02-16_20-52-06_time-200_secs_A-new-base_448b93.txt",
           _log("prior", 3.2779, 89500))
    # record 78: combined/ is linked; max_num_docs/ and muon-beta2/ are the PR's partial variants
    rec78 = T1 / "2026-03-22_VarlenMaxDocs"
    _write(tmp_path, rec78 / "combined" / "2026-03-22_20-07-32_time-186_secs_06-mbeta2-max-docs_227ce8.txt",
           _log("combined"))
    _write(tmp_path, rec78 / "muon-beta2" / "2026-03-22_19-30-10_time-186_secs_04-muon-beta2_ef782f.txt",
           _log("muon-beta2"))
    _write(tmp_path, rec78 / "max_num_docs" / "2026-03-22_18-38-26_time-187_secs_00-cu-seqlens_5941b3.txt",
           _log("max-num-docs"))
    _write(tmp_path, rec78 / "baseline" / "2026-03-22_18-25-54_time-185_secs_baseline_9e0803.txt", _log("base"))
    index = extract(tmp_path)
    assert {r.key for r in index.records if r.script} == {"2026-02-16_FlattenForward", "2026-03-22_VarlenMaxDocs"}, \
        "a log file name is never a record folder"
    by = _by_key(index)
    r74, r78 = by["2026-02-16_FlattenForward"], by["2026-03-22_VarlenMaxDocs"]
    assert r74.num == 74 and r74.variant == "pr233" and "README" in r74.variant_reason
    assert "pr233-linked" in r74.script and r74.baseline_logs == 2 and len(r74.logs) == 2
    assert r74.reference_train_time_ms == (88000 + 88200) / 2, "timings from the record's variant only"
    assert r78.num == 78 and r78.variant == "combined" and "combined" in r78.script
    assert r78.other_variants == {"max_num_docs": 1, "muon-beta2": 1} and r78.baseline_logs == 1


def test_several_variants_pick_the_newest_and_skip_the_baselines(tmp_path):
    # record 85: the README links the folder itself; this_pr_v1..v3 and two xsa-baseline-* runs
    rec = T1 / "2026-05-27-MuddGatedAndDC"
    for v in (1, 2, 3):
        _write(tmp_path, rec / f"this_pr_v{v}" / f"run-{v}.txt", _log(f"v{v}", 3.27 + v / 1000, 76000 + v))
    _write(tmp_path, rec / "xsa-baseline-s1335" / "2d2609b4.txt", _log("xsa-baseline", 3.2801))
    _write(tmp_path, rec / "xsa-baseline-s1385" / "0904ecd7.txt", _log("xsa-baseline-2", 3.2799))
    r85 = _by_key(extract(tmp_path))["2026-05-27-MuddGatedAndDC"]
    assert r85.num == 85 and r85.track == 1
    assert r85.variant == "this_pr_v3" and "newest" in r85.variant_reason and "v3" in r85.script
    assert r85.other_variants == {"this_pr_v1": 1, "this_pr_v2": 1} and r85.baseline_logs == 2
    assert r85.reference_train_time_ms == 76003


def test_a_tree_link_into_a_variant_folder_and_baseline_file_names(tmp_path):
    # record 81 links the folder this_pr_v3; record 80 keeps baseline and PR logs side by side in logs/
    rec81 = T1 / "2026-04-22_MuddFormer"
    _write(tmp_path, rec81 / "this_pr_v1" / "a.txt", _log("v1"))
    _write(tmp_path, rec81 / "this_pr_v3" / "b.txt", _log("v3"))
    _write(tmp_path, rec81 / "this_pr_v4-unmerged" / "c.txt", _log("v4"))
    _write(tmp_path, rec81 / "baseline-s1430" / "d.txt", _log("base"))
    rec80 = T1 / "2026-04-08_PairedHeadMuon" / "logs"
    _write(tmp_path, rec80 / "baseline0-1480.txt", _log("baseline"))
    _write(tmp_path, rec80 / "split_qk0-1480.txt", _log("split-qk"))
    _write(tmp_path, rec80 / "split_qk1-1480.txt", _log("split-qk-seed"))
    by = _by_key(extract(tmp_path))
    r81, r80 = by["2026-04-22_MuddFormer"], by["2026-04-08_PairedHeadMuon"]
    assert r81.num == 81 and r81.variant == "this_pr_v3" and "v3" in r81.script, "the link wins over the newest"
    assert r80.num == 80 and r80.script_log.endswith("split_qk0-1480.txt") and r80.baseline_logs == 1
    assert is_baseline(tmp_path / rec80 / "baseline0-1480.txt", tmp_path / rec80.parent)


def test_other_tracks_are_listed_with_their_track_and_never_numbered(tmp_path):
    # a medium-track folder with a short-track record's exact name must not become record 5
    _write(tmp_path, Path("records") / "track_2_medium" / "2024-10-14_ModernArch" / "000_a.txt", _log("medium"))
    _write(tmp_path, Path("records") / "track_2_medium" / "2025-11-02-Smear-MTP" / "000_b.txt", _log("smear"))
    _write(tmp_path, Path("records") / "track_3_optimization" / "results" / "20260430_adamh" / "c.txt", _log("adamh"))
    sweep = Path("records") / "track_3_optimization" / "results" / "20260508_klsoap_h_clean_tuple_sweep"
    _write(tmp_path, sweep / "b1090_sh090" / "k1.txt", _log("b1090"))
    _write(tmp_path, sweep / "b1095_sh090" / "k2.txt", _log("b1095"))
    _write(tmp_path, T1 / "2024-10-14_ModernArch" / "dabaaddd.txt", _log("short"))
    index = extract(tmp_path)
    short = [r for r in index.records if r.track == 1 and r.script]
    assert [(r.num, r.key) for r in short] == [(5, "2024-10-14_ModernArch")] and "short" in short[0].script
    others = [r for r in index.records if r.track in (2, 3)]
    assert len(others) == 4 and all(r.num is None for r in others)
    medium = next(r for r in others if r.track == 2 and "medium" in r.script)
    assert medium.key == "records/track_2_medium/2024-10-14_ModernArch", "two tracks share a name: the key is a path"
    adamh = next(r for r in others if r.name == "adamh")
    assert adamh.track == 3 and adamh.date == "2026-04-30"
    swept = next(r for r in others if r.name == "klsoap_h_clean_tuple_sweep")
    assert swept.variant in ("b1090_sh090", "b1095_sh090") and swept.other_variants, "one sweep, two variants"


def test_track_from_the_path(tmp_path):
    assert track_of(tmp_path / "records" / "track_1_short" / "2024-10-14_ModernArch") == 1
    assert track_of(tmp_path / "records" / "track_3_optimization" / "results" / "x") == 3
    assert track_of(tmp_path / "records" / "101424_ModernArch") == 1, "the layout before track folders"
    assert track_of(tmp_path / "my_logs" / "2024-10-14_ModernArch") is None


def test_a_log_folder_outside_a_checkout_still_matches_track_1_numbers(tmp_path):
    _write(tmp_path, Path("mylogs") / "2024-10-14_ModernArch" / "a.txt",
           f"{SEPARATOR}\nprint('r5')\n{SEPARATOR}\nstep:5100/5100 val_loss:3.2741 train_time:910546ms step_avg:178.54ms\n")
    (r,) = extract(tmp_path / "mylogs").records
    assert (r.num, r.track) == (5, None)


def test_a_copy_of_a_record_folder_under_another_date_is_left_unnumbered(tmp_path):
    # record 30's folder exists twice (2025-05-09_ and 2025-09-05_SkipMLPBlocks); the README links the second
    for folder in ("2025-05-09_SkipMLPBlocks", "2025-09-05_SkipMLPBlocks"):
        _write(tmp_path, T1 / folder / "07e7ae76-b7d0-4481-b149-01e7d81b5ad4.txt", _log("skip-mlp"))
        _write(tmp_path, T1 / folder / "comparison_50e5b966.txt", _log("previous record"))
    by = _by_key(extract(tmp_path))
    assert by["2025-09-05_SkipMLPBlocks"].num == 30 and by["2025-09-05_SkipMLPBlocks"].baseline_logs == 1
    copy = by["2025-05-09_SkipMLPBlocks"]
    assert copy.num is None and "2025-09-05_SkipMLPBlocks" in copy.note
