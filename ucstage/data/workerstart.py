"""How the ucstage DataLoader starts its workers: ``fork`` (the cheapest
start, and the only one a dataset defined in a notebook cell survives), or
``forkserver`` when forked workers could not use the object-store engine.

obstore runs every request on one process-global Tokio runtime, which does not
survive ``fork``: a worker forked after the main process fetched through
obstore reads through fsspec instead (:func:`ucstage.engines.objstore.usable`), at
about twice the client CPU per file. The main process's own metadata calls
(resolving and listing a source) run in a short-lived forked child
(:mod:`ucstage.aside`), so listing leaves it clean and forked workers build
their own clients and runtimes. Only when this process has itself read through
obstore (iterated a dataset without workers, warmed a cache in-process) would
forked workers fall back (:func:`ucstage.engines.objstore.forks_fall_back`); then, when
the user did not choose a start method and the default one is ``fork``, the
loader starts them from a ``forkserver`` instead, whose process never touched
obstore.

The forkserver preloads :data:`PRELOAD` (torch, numpy, pyarrow, obstore and
ucstage), so each worker forks with them imported. The preload list belongs
to the process's one forkserver (the standard library keeps a single server):
ours is added to the list already set (``['__main__']`` by default), and only
before the server starts; a server already running is used as it is. The
loader starts the server when it is made (:func:`start_early`), so its
start-up and preloads (about 1.3 s on a 2-core machine, mostly importing
torch) overlap the listing and the rest of the set-up before the first epoch.

Workers that do not fork need what they run to pickle, as with ``spawn``: the
dataset, ``collate_fn`` and ``worker_init_fn``, and a script that iterates
the loader under ``if __name__ == "__main__":`` (the workers import the main
script again). When that does not hold, the loader forks and says why, once.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import sys
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any

from ..engines import engine, objstore
from ..volumes import Volume

__all__ = ["PRELOAD", "WithEnviron", "forkserver", "gc_frozen_for_fork", "reads_object_store",
           "start_context", "start_early"]

_log = logging.getLogger("ucstage")

PRELOAD = ("torch", "numpy", "pyarrow", "obstore", "ucstage", "ucstage.cache", "ucstage.data")
"""Modules the forkserver imports once, so that each worker starts with them."""

_COST = ("so they read through fsspec, at about twice the client CPU per file "
         "(obstore cannot run in a process forked after it was used)")
_warned: set[str] = set()


def start_early(given: Any, num_workers: int, object_store: bool, *pickled: Any) -> bool:
    """Start the forkserver now, in the background, when this loader's workers
    will start from it: ``object_store`` (the volume is an object store that
    obstore reads), obstore already ran in this process, and no start method
    of the user's. The server preloads :data:`PRELOAD` while the model's
    set-up and whatever else comes before the first ``iter(loader)`` run,
    instead of after it. Returns whether it started (or was running)."""
    if given is not None or num_workers <= 0 or not object_store or \
            not objstore.forks_fall_back():
        return False
    default = multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_all_start_methods()[0]
    if default != "fork" or _main_reruns() is not None or _unpicklable(pickled) is not None:
        return False  # start_context decides at the first epoch, and says why
    forkserver()
    multiprocessing.forkserver.ensure_running()  # spawns it; the preload runs in it
    return True


def start_context(given: Any, num_workers: int, volume: Volume | None, *pickled: Any) -> Any:
    """The ``multiprocessing_context`` for this epoch's workers.

    Args:
        given: the context the user chose (a name, a context, or None).
        num_workers: the loader's workers.
        volume: the VolumeDataset's volume, or None when the loader has none.
        pickled: what each worker gets pickled (the dataset, ``collate_fn``,
            ``worker_init_fn``), checked before leaving fork.

    Returns ``given`` when the user chose, else None (torch's default) or the
    forkserver context. Logs one warning when workers will fork onto an
    object-store volume after obstore was used here.
    """
    if num_workers <= 0 or volume is None or not _object_store(volume):
        return given
    if not objstore.forks_fall_back():
        return given  # forked workers build their own client and runtime
    if given is not None:
        if _method(given) == "fork":
            _warn_once(f"DataLoader workers started with fork read {volume.url} {_COST}; "
                       "leave multiprocessing_context unset (ucstage then starts them "
                       "from a forkserver) or pass 'forkserver' or 'spawn'")
        return given
    default = multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_all_start_methods()[0]
    if default != "fork":
        return None  # the default start is already fresh
    reason = _main_reruns() or _unpicklable(pickled)
    if reason is not None:
        _warn_once(f"DataLoader workers fork because {reason}, {_COST}; fix that to let "
                   "ucstage start them from a forkserver")
        return None
    return forkserver()


class WithEnviron:
    """A ``worker_init_fn`` that first gives the worker the main process's
    environment as it was when the epoch started, then calls the user's.

    A forked worker inherits the environment; one forked from the forkserver
    would get the server's, frozen when the server started, and miss a
    credential or endpoint set since (obstore's clients read the environment).
    """

    def __init__(self, environ: dict[str, str], init: Any) -> None:
        self.environ = environ
        self.init = init

    def __call__(self, worker_id: int) -> None:
        for name in [name for name in os.environ if name not in self.environ]:
            del os.environ[name]
        os.environ.update(self.environ)
        if self.init is not None:
            self.init(worker_id)


def forkserver() -> BaseContext:
    """The ``forkserver`` context, its server set to preload :data:`PRELOAD`."""
    context = multiprocessing.get_context("forkserver")
    server = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    # Before the server starts only: a running server keeps what it imported.
    if getattr(server, "_forkserver_pid", None) is None:
        current = list(getattr(server, "_preload_modules", None) or ["__main__"])
        wanted = current + [m for m in PRELOAD if m not in current]
        if wanted != current:
            context.set_forkserver_preload(wanted)
    return context


def reads_object_store(volume: Volume | None) -> bool:
    """Whether ``volume`` is an object store that obstore reads in this process."""
    return volume is not None and _object_store(volume) and not engine.of(volume).fork_safe


def _object_store(volume: Volume | None) -> bool:
    return isinstance(getattr(volume, "fs", None), objstore.ObjectFS)


def _method(context: Any) -> str:
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        _log.warning("%s", message)


class _Sink:
    """Where the pickling check writes: nowhere (only whether it pickles counts)."""

    def write(self, data: bytes) -> int:
        return len(data)


class _Checker(ForkingPickler):
    """torch's pickler, noting whether anything comes from ``__main__``."""

    from_main = ""

    def persistent_id(self, obj: Any) -> None:
        # Classes and functions pickle by name: a worker imports them again.
        if not self.from_main and callable(obj) and \
                getattr(obj, "__module__", None) == "__main__":
            self.from_main = getattr(obj, "__qualname__", type(obj).__qualname__)
        return None


def _unpicklable(objects: tuple[Any, ...]) -> str | None:
    """Why a forkserver worker could not get ``objects``, or None."""
    checker = _Checker(_Sink(), 4)
    try:
        checker.dump(objects)
    except Exception as exc:  # any pickling failure means: fork
        return f"what they run does not pickle ({type(exc).__name__}: {exc})"
    main = sys.modules.get("__main__")
    if checker.from_main and getattr(main, "__file__", None) is None:
        return (f"{checker.from_main} is defined in an interactive session "
                "(put it in a module)")
    return None


def _main_reruns() -> str | None:
    """Why starting a worker fresh would run the training again, or None: the
    main script iterates the loader at its top level, outside
    ``if __name__ == "__main__":``, and every fresh worker imports it again."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return None  # `python -m pkg`: not imported again
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None  # interactive: nothing is imported again
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>"
                                     and frame.f_globals is main.__dict__):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None  # not called from the script's top level
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return f"{path} could not be read to check its `if __name__ == '__main__':` guard"
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            return None
    return f"{path} iterates the loader outside `if __name__ == '__main__':`"


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


@contextlib.contextmanager
def gc_frozen_for_fork(context: Any, num_workers: int) -> Iterator[None]:
    """The garbage collector's objects frozen while forked workers start.

    A forked worker inherits every object of the training script; its first
    full collections walk them all, in every worker at once (measured: a
    later epoch stalled 0.6-0.9 s at 4 workers, 230-320 ms of gen-2
    collection in each). Frozen (``gc.freeze``) before the fork, they sit in
    the children's permanent generation, never walked and never written to
    (nor copied on write). The parent unfreezes as soon as the workers are
    started, so its own collections are unchanged. Nothing is done for
    forkserver or spawn workers (they inherit no objects), without workers,
    or when the script has frozen objects itself.
    """
    if context is not None:  # torch's setter has made a context of a name
        method = context.get_start_method()
    else:  # the default, without fixing it (get_start_method() would)
        method = multiprocessing.get_start_method(allow_none=True) or \
            multiprocessing.get_all_start_methods()[0]
    if num_workers == 0 or method != "fork" or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
