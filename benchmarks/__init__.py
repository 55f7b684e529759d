"""ucstage's benchmarks and profiles: one module per benchmark, one harness.

Run a benchmark from a checkout's root as a module, e.g.
``python -m benchmarks.shard_plan --files 100000 --json``; compare two commits
with ``python -m benchmarks.ab_compare --base REV --head REV BENCHMARK ...``.

The harness, shared by every benchmark:

* :mod:`benchmarks.timing`: timing a command (wall, the child's CPU and peak
  RSS from ``os.wait4``) or a function in this process;
* :mod:`benchmarks.pairs`: alternating pairs, medians per side, ratios;
* :mod:`benchmarks.report`: the one ``--json`` document every benchmark prints;
* :mod:`benchmarks.volumes`: rclone mounts, the emulated remote volume's
  settings, a moto S3 server;
* :mod:`benchmarks.datasets` and :mod:`benchmarks.files`: the reading datasets
  the loader benchmarks compare, and generated source files.

Not part of the installed package (pyproject's ``packages.find`` includes only
``ucstage*``); see docs/benchmarks.md.
"""
