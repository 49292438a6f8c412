"""The GPU kernels of training programs and their PyTorch replacements.

`scan` finds a program's Triton kernels, NVRTC kernels and their launchers; `fingerprint`
identifies a kernel up to formatting and renaming; `catalog` says what each known kernel
computes and which replacement (in `targets/shims/kernels.py`) stands in for its launcher;
`extract`, `cases`, `runner`, `compare` and `interp_numerics` are the machinery of
`targets/kernel_check.py`, which checks a replacement against the kernel itself;
`nvrtc_reference` is the independent reference for the one kernel that cannot run here.
"""
