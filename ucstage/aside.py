"""Run one call in a short-lived forked child and return its result here.

obstore runs its requests on one process-global Tokio runtime whose threads do
not survive ``fork``: once a process has used obstore, a child forked from it
cannot (``ucstage.engines.objstore.usable``). A training script lists its volume in
the main process, then DataLoader workers fork from it; if the listing started
the runtime, every forked worker falls back to fsspec, at about twice the
client CPU per file, and the only way around it, starting workers from a
forkserver, needs a dataset that pickles, which a class defined in a notebook
cell or inside a function is not.

So the main process keeps itself clean: the few metadata calls it makes
before workers start (resolving a source, listing it) run in a child forked
for the call, which starts its own runtime, answers through a pipe and exits.
A fork of the main process costs a few milliseconds and inherits everything
already imported, so this is far cheaper than any fresh interpreter; the
parent's workers, forked later, then build their own clients and read through
obstore too.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["aside"]

T = TypeVar("T")

_CHUNK = 1 << 20


def aside(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, computed in a forked child; its exception re-raised here.

    The result (or the exception) must pickle. Ctrl-C here ends the child at
    once. The child never returns into the caller's code: whatever happens,
    it leaves with ``os._exit``.
    """
    read_fd, write_fd = os.pipe()
    # Ctrl-C is held until the parent is inside the block that ends the child
    # on it: one arriving between the fork and that block would leave the
    # child running, holding the caller's stdout open.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # the child
        os.close(read_fd)
        # Ctrl-C goes to the parent, which ends the child; the child's own
        # KeyboardInterrupt would only race it to the pipe.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        code = 0
        try:
            try:
                payload = pickle.dumps((True, fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:  # every failure is the parent's to raise
                payload = _pickled_error(exc)
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view[:_CHUNK]):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held Ctrl-C lands here
        chunks = []
        while True:
            chunk = os.read(read_fd, _CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    if not chunks:
        raise OSError("a child process listing the store ended without an answer")
    ok, value = pickle.loads(b"".join(chunks))
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def _pickled_error(exc: BaseException) -> bytes:
    """The exception, pickled with its cause; an unpicklable one as an
    ``OSError`` with its text (the caller's error handling expects OSErrors
    from a store)."""
    try:
        data = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # some exceptions pickle but do not unpickle
        return data
    except Exception:
        return pickle.dumps((False, OSError(f"{type(exc).__name__}: {exc}")))
