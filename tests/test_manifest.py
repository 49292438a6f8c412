"""A bad manifest fails at load time with an error naming the file and the field."""

import textwrap

import pytest

from trainbridge.workload import ManifestError, load_workload

GOOD = """
name = "w"
entry = "train.py"
editable = ["train.py"]
[work]
unit = "tokens"
per_step = 64
"""


def _write(tmp_path, text, script=True):
    (tmp_path / "trainbridge.toml").write_text(textwrap.dedent(text))
    if script:
        (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_good_manifest_loads_with_defaults(tmp_path):
    wl = load_workload(_write(tmp_path, GOOD))
    assert wl.manifest.steps.warmup == 3 and wl.manifest.steps.measured == 10
    assert wl.editable_files() == ["train.py"]
    assert wl.entry_path.name == "train.py"


@pytest.mark.parametrize(
    "text, field",
    [
        (GOOD.replace('per_step = 64', 'per_step = -1'), "work.per_step"),
        (GOOD.replace('[work]\nunit = "tokens"\nper_step = 64\n', ""), "work"),
        (GOOD.replace('unit = "tokens"', 'unit = "bytes"'), "work.unit"),
        (GOOD.replace('entry = "train.py"', 'entry = "train.sh"'), "entry"),
        (GOOD + "\n[steps]\nwarmup = 'three'\n", "steps.warmup"),
        (GOOD + "\nunknown_field = 1\n", "work.unknown_field"),
        ("top_level_typo = 1\n" + GOOD, "top_level_typo"),
        (GOOD.replace('editable = ["train.py"]', "editable = []"), "editable"),
    ],
)
def test_bad_field_is_named(tmp_path, text, field):
    with pytest.raises(ManifestError) as e:
        load_workload(_write(tmp_path, text))
    msg = str(e.value)
    assert "trainbridge.toml" in msg and f"'{field}'" in msg


def test_missing_entry_and_protected_file(tmp_path):
    with pytest.raises(ManifestError, match="field 'entry'"):
        load_workload(_write(tmp_path, GOOD, script=False))
    bad = GOOD + '\n[[protected]]\nfile = "data.py"\nsymbols = ["load"]\n'
    with pytest.raises(ManifestError, match=r"protected\.0\.file"):
        load_workload(_write(tmp_path, bad))


def test_not_toml_and_no_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no trainbridge.toml"):
        load_workload(tmp_path)
    with pytest.raises(ManifestError, match="not valid TOML"):
        load_workload(_write(tmp_path, "name = = 1"))


def test_the_work_per_step_is_checked_against_the_counted_work():
    from trainbridge.workload import WorkConfig, work_note

    assert work_note(WorkConfig(per_step=128), [128, 128, 128]) is None
    note = work_note(WorkConfig(per_step=256, unit="tokens"), [128, 128, 129])
    assert note and "per_step = 256" in note and "counted 128" in note
    assert work_note(WorkConfig(per_step=5), []) is None
