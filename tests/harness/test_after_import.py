"""The child sets Inductor's fallback_random as the program first imports Inductor, not before
(importing it up front cost every run about 1.6 s): the hook fires once, after the module ran,
and leaves the import system as it was. test_random_streams.py checks it end to end."""

import sys

from trainbridge.harness.after_import import when_imported


def test_the_hook_runs_after_the_first_import_and_removes_itself(tmp_path, monkeypatch):
    (tmp_path / "tb_probe_pkg").mkdir()
    (tmp_path / "tb_probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "tb_probe_pkg" / "config.py").write_text("flag = False\nloaded = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(sys.meta_path)
    seen = []
    when_imported("tb_probe_pkg.config", lambda m: (seen.append(m.loaded), setattr(m, "flag", True)))
    assert "tb_probe_pkg.config" not in sys.modules and len(sys.meta_path) == len(before) + 1
    import tb_probe_pkg  # noqa: F401  (the parent alone does not fire it)
    assert seen == []
    from tb_probe_pkg import config

    assert config.flag is True and seen == [True]  # after the module's own code ran
    assert sys.meta_path == before
    when_imported("tb_probe_pkg.config", lambda m: seen.append("again"))  # already imported: at once
    assert seen == [True, "again"]
    for name in ("tb_probe_pkg.config", "tb_probe_pkg"):
        sys.modules.pop(name, None)
