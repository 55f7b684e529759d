"""The one ``--json`` contract every benchmark follows.

With ``--json`` a benchmark prints exactly one JSON document on stdout (its
human-readable Markdown goes to stderr); without it, the Markdown goes to
stdout. The document's shape (docs/benchmarks.md, "The --json contract")::

    {
      "benchmark": "shard_plan",          # the module's name under benchmarks/
      "params": {"files": 1000000, ...},  # what it was run with
      "results": [                        # one object per measured row
        {"name": "fingerprint", "seconds": 0.18, ...}, ...
      ],
      "summary": {"peak_rss_mib": 632.0, ...},   # the headline figures
      "env": {"python": "3.12.3", "ucstage_file": ".../ucstage/__init__.py", ...}
    }

``results`` rows carry a unique ``name`` where the benchmark has one, so a
comparison (benchmarks.ab_compare) can match rows by name rather than by
position. Every number a comparison should read is a JSON number. A
benchmark may add top-level keys of its own (ab_compare adds ``runs``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_KEYS = ("benchmark", "params", "results", "summary", "env")


def json_argument(parser: argparse.ArgumentParser) -> None:
    """Add the contract's ``--json`` flag to ``parser``."""
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document on stdout (docs/benchmarks.md, "
                             "'The --json contract'); the Markdown goes to stderr")


def environment() -> dict[str, Any]:
    """Where a run happened: interpreter, the ucstage it imported, the machine's load."""
    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "load_average_1m": os.getloadavg()[0]}
    try:
        import ucstage

        env["ucstage_file"] = ucstage.__file__
        env["ucstage_version"] = getattr(ucstage, "__version__", None)
    except ImportError:  # a benchmark that does not need the library
        env["ucstage_file"] = None
    return env


def _clean(value: Any) -> Any:
    """JSON-safe: tuples become lists, NaN and infinities become null."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass
class Report:
    """A benchmark's findings in the contract's shape."""

    benchmark: str
    params: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # further top-level keys

    def to_dict(self) -> dict[str, Any]:
        return _clean({"benchmark": self.benchmark, "params": self.params,
                       "results": self.results, "summary": self.summary,
                       "env": environment(), **self.extra})

    def emit(self, as_json: bool, markdown: str = "") -> None:
        """Print the report: the JSON document on stdout with ``as_json`` (the
        Markdown on stderr), else the Markdown on stdout."""
        if as_json:
            if markdown:
                print(markdown, file=sys.stderr)
            json.dump(self.to_dict(), sys.stdout, indent=1, allow_nan=False)
            sys.stdout.write("\n")
        else:
            print(markdown)


def benchmark_name(path: str) -> str:
    """The contract's ``benchmark`` value for a module's ``__file__``:
    ``.../benchmarks/shard_plan.py`` -> ``shard_plan`` (``__name__`` is
    ``__main__`` under ``python -m``)."""
    return os.path.splitext(os.path.basename(path))[0]


Variant = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
"""A suite's variant: what adds its options to its parser, and what runs it."""


def suite(name: str, doc: str, variants: Mapping[str, Variant], argv: list[str] | None) -> int:
    """Run the variant of a suite that ``argv`` names: ``python -m benchmarks.SUITE
    VARIANT [OPTIONS]``. ``doc``: the suite's docstring (its first paragraph is
    the description); each variant's help is its run function's first docstring
    paragraph, its description the whole docstring. The variant's name lands in
    the report's ``params`` as ``variant``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}",
                                     description=doc.split("\n\n")[0])
    sub = parser.add_subparsers(dest="variant", required=True, metavar="VARIANT")
    for name, (arguments, run) in variants.items():
        text = inspect.cleandoc(run.__doc__ or "")
        child = sub.add_parser(name, help=text.split("\n\n")[0], description=text,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        arguments(child)
        child.set_defaults(run=run)
    args = parser.parse_args(argv)
    run = args.run
    del args.run
    return run(args)


def params_of(args: argparse.Namespace, drop: Iterable[str] = ("json",)) -> dict[str, Any]:
    """A parsed command line as the report's ``params`` (without ``--json`` itself)."""
    return {k: v for k, v in vars(args).items() if k not in set(drop)}


def validate(doc: Any) -> None:
    """Raise ``ValueError`` when ``doc`` does not follow the contract."""
    if not isinstance(doc, dict):
        raise ValueError("a benchmark's JSON document is an object")
    missing = [k for k in SCHEMA_KEYS if k not in doc]
    if missing:
        raise ValueError(f"missing keys {missing}")
    if not isinstance(doc["benchmark"], str) or not isinstance(doc["params"], dict):
        raise ValueError("'benchmark' is a string and 'params' an object")
    if not isinstance(doc["results"], list) or not all(isinstance(r, dict)
                                                       for r in doc["results"]):
        raise ValueError("'results' is a list of objects")
    if not isinstance(doc["summary"], dict):
        raise ValueError("'summary' is an object")


def numbers(doc: Mapping[str, Any]) -> dict[str, float]:
    """The numeric figures of a contract document, keyed by a dotted path.

    ``summary`` leaves as ``summary.KEY...``; ``results`` rows as
    ``results.NAME.KEY...`` (``NAME``: the row's ``name``, else its index).
    ``params`` and ``env`` are not figures.
    """
    out = _leaves(doc.get("summary", {}), "summary.")
    for i, row in enumerate(doc.get("results", [])):
        label = row.get("name", i)
        out.update(_leaves({k: v for k, v in row.items() if k != "name"},
                           f"results.{label}."))
    return out


def _leaves(value: Any, prefix: str) -> dict[str, float]:
    if isinstance(value, Mapping):
        out: dict[str, float] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{prefix}{key}."))
        return out
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            out.update(_leaves(item, f"{prefix}{i}."))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {prefix.rstrip("."): float(value)}
    return {}
