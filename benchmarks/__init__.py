"""ucstage's benchmarks and profiles: a few suites named by what they measure, one harness.

Run a suite's variant from a checkout's root, e.g. ``python -m
benchmarks.epochs warm --pairs 5 --json`` (``python -m benchmarks.SUITE
--help`` lists its variants), or ``python -m benchmarks.shard_plan --files
100000 --json``; compare two commits with ``python -m benchmarks.ab_compare
--base REV --head REV SUITE VARIANT ...``. The suites: ``staging`` (``cache
warm`` against copy tools and bare clients), ``epochs`` (loaders over
epochs), ``first_batch``, ``tables``, ``faults`` and ``planning``.

The harness, shared by every benchmark:

* :mod:`benchmarks.timing`: timing a command (wall, the child's CPU and peak
  RSS from ``os.wait4``) or a function in this process;
* :mod:`benchmarks.pairs`: alternating pairs, medians per side, ratios;
* :mod:`benchmarks.report`: the one ``--json`` document every benchmark prints,
  and ``suite``, a suite's variants as sub-commands;
* :mod:`benchmarks.volumes`: rclone mounts, the emulated remote volume's
  settings, a moto S3 server;
* :mod:`benchmarks.datasets` and :mod:`benchmarks.files`: the reading datasets
  the loader benchmarks compare, and generated source files.

Not part of the installed package (pyproject's ``packages.find`` includes only
``ucstage*``); see docs/benchmarks.md.
"""
