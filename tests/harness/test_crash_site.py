"""A crash names the program's own line; a failure inside the port's replacement names both."""

from trainbridge.harness.crash import crash_site

TRACE = '''Traceback (most recent call last):
  File "/usr/lib/python3.11/runpy.py", line 291, in run_path
    return _run_module_code(code, init_globals, run_name,
  File "/runs/x/programs/50c65fd51f1a/train_gpt.py", line 1377, in step
    quantize_transpose_mlp_down_weights(self.w, self.out, self.next, self.used, self.amax)
  File "/runs/x/programs/50c65fd51f1a/_tb_kernels.py", line 137, in quantize_transpose_mlp_down_weights
    assert partial_amax.shape == (num_layers, nh * nd)
AssertionError
'''


def test_a_failure_in_a_replacement_leads_with_the_programs_call():
    site = crash_site(TRACE)
    assert (site.file, site.line, site.function) == ("train_gpt.py", 1377, "step")
    assert site.code.startswith("quantize_transpose_mlp_down_weights(")
    assert site.via == "_tb_kernels.py:137 `assert partial_amax.shape == (num_layers, nh * nd)`"
    text = str(site)
    assert text.startswith("train_gpt.py:1377 `quantize_transpose") and "via the port's replacement _tb_kernels.py:137" in text
    assert text.endswith(": AssertionError")


def test_a_failure_in_the_program_has_no_via():
    trace = TRACE.split('  File "/runs/x/programs/50c65fd51f1a/_tb_kernels.py"')[0] + "RuntimeError: boom\n"
    site = crash_site(trace)
    assert (site.file, site.line, site.via) == ("train_gpt.py", 1377, None)
    assert site.exception == "RuntimeError: boom"


def test_a_traceback_outside_the_program_says_so():
    site = crash_site('  File "/usr/lib/python3.11/site-packages/torch/x.py", line 3, in f\nValueError: no\n')
    assert site.file is None and str(site) == "outside the program's own files: ValueError: no"
