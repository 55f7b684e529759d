"""``python -m benchmarks``: list the benchmarks, each with its first docstring
line, and a suite's variants (its ``VARIANTS``), read from the source alone."""

from __future__ import annotations

import ast
import os

from benchmarks.ab_compare import PACKAGE, benchmark_modules


def _variants(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "VARIANTS" for t in node.targets)):
            return [str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)]
    return []


def main() -> int:
    for name in benchmark_modules():
        with open(os.path.join(PACKAGE, f"{name}.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        doc = ast.get_docstring(tree) or ""
        print(f"python -m benchmarks.{name:20s} {doc.splitlines()[0] if doc else ''}")
        variants = _variants(tree)
        if variants:
            print(f"    VARIANT: {', '.join(variants)}")
    print("python -m benchmarks.ab_compare --base REV [--head REV] NAME [ARGS...]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
