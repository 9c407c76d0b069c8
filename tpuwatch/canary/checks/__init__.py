"""The canary's suite: one small check per class of fault the field reports, each against a float64 answer.

- ``reference_model``: the fixed attention + MLP block in float32 HIGHEST (what the canary always ran);
- ``gemm``: a matrix product of fresh operands each run, from a seeded schedule (data-dependent faults);
- ``transcendental``: exp, tanh, log, rsqrt, erf and softmax across their ranges (vector units);
- ``bf16``: the reference model with bfloat16 matmul operands (the jobs' precision);
- ``memory``: a pattern kept at rest on the chip through the run (HBM);
- ``collective``: an all-gather and an all-reduce across the idle chips (the interconnect);
- speed: every check's device time, each chip against its peers (canary/judge.py).

``suite.Suite`` runs them on a list of devices and re-runs a deviating check at
once (the worker and the scoreboard both use it); ``faults`` injects the field's
faults inside one chip's computation.  Imports numpy; jax is passed in.
"""
