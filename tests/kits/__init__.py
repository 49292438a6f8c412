"""Code the tests share, imported plainly (`from tests.kits.paths import FIXTURES`):

- paths: ROOT, TESTS, FIXTURES, WORKLOADS and `import_fixture` (a program under tests/fixtures/ as a module)
- small_workloads: the shipped workloads copied small enough for a CI minute
- recipe_testkit: recipe-test helpers (load/compare programs, the torch_npu stand-in, eager compile)
- triton_programs: this suite's own Triton programs in the records' forms
- openai_server: a scripted OpenAI-compatible HTTP server on 127.0.0.1
"""
