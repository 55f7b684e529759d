"""``python -m benchmarks``: list the benchmarks, each with its first docstring line."""

from __future__ import annotations

import ast
import os

from benchmarks.ab_compare import PACKAGE, benchmark_modules


def main() -> int:
    for name in benchmark_modules():
        with open(os.path.join(PACKAGE, f"{name}.py"), encoding="utf-8") as fh:
            doc = ast.get_docstring(ast.parse(fh.read())) or ""
        print(f"python -m benchmarks.{name:20s} {doc.splitlines()[0] if doc else ''}")
    print("python -m benchmarks.ab_compare --base REV [--head REV] NAME [ARGS...]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
