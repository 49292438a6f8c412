"""trainbridge's test suite: one folder per pipeline stage, mirroring trainbridge/ (see tests/README.md).

`tests` is a package so shared code is imported plainly: `from tests.kits.small_workloads import
small_nanogpt`. pytest puts the repository root on sys.path for it (the folder above the topmost
`__init__.py`), and `python -m pytest` from the root does too.
"""
