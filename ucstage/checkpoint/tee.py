"""A rank's scratch files while torch writes them: checksummed as they are
written, and readable by the upload as they grow.

torch's ``FileSystemWriter`` writes each file through the stream its file
system's ``create_stream`` returns. :class:`TeeFileSystem` returns a
:class:`_TeeStream`: it writes straight to the scratch file (unbuffered, so
a byte written is a byte another reader of the file sees), feeds the file's
checksum and that of the current item as the bytes pass, and tells the
file's :class:`Growing` how far it has got. The upload of a file starts
when torch opens it and reads each part as soon as the part exists
(:meth:`Growing.wait`), so a save no longer writes everything, reads it all
again for its checksums, then uploads: the three overlap.

An item's checksum comes from the same pass: torch asks the stream's
position (``tell``) before and after each item it writes, so the bytes
between two such calls are one item's, hashed as they go. An item whose
range is not one such span (a writer that seeks, another serialisation
format) is hashed from the file afterwards (:meth:`Growing.range_checksums`);
a file torch seeks back in is hashed whole afterwards, and its upload, which
may have sent the bytes before they were rewritten, is checked against that
and sent again when it differs (the writer's compare-and-retry).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem

from . import digests

NOTIFY = 1024 * 1024
"""Bytes written between two wake-ups of the upload waiting for them (and
at every flush and at the end)."""
POLL_S = 0.1
"""How often a waiting upload looks whether the save is stopping."""
STALL_S = 300.0
"""How long an upload waits for torch to write another byte of its file
before it gives up, naming the file (a writer stuck on a hung local disk
must not hold the save, and the training loop's next save, for ever)."""


class WriteFailed(Exception):
    """The file's writer stopped (an error, Ctrl-C): its upload stops too."""


class Growing:
    """One scratch file as torch writes it: how far it has got, whether it is
    done, and its checksums so far."""

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self.kind = kind
        self._cond = threading.Condition()
        self._size = 0
        self._moved = time.monotonic()
        self._done = False
        self._failed: str | None = None
        self._whole = digests.new_hasher(kind)
        self._span_start = 0
        self._span = digests.new_hasher(kind)
        self._spans: dict[tuple[int, int], str] = {}
        self.rewritten = False
        """torch moved back in the file: the running checksums do not hold."""
        self.interrupted = False
        """Ctrl-C reached torch's writer while it wrote this file."""

    # -- the writer's side (torch's thread) --------------------------------------

    def _wrote(self, data: memoryview, pos: int) -> None:
        self._whole.update(data)
        self._span.update(data)
        if pos - self._size >= NOTIFY:
            self._publish(pos)

    def _publish(self, pos: int, *, done: bool = False) -> None:
        with self._cond:
            self._size = pos
            self._done = self._done or done
            self._moved = time.monotonic()
            self._cond.notify_all()

    def _boundary(self, pos: int) -> None:
        """torch asked the position: an item starts or ends here."""
        if pos != self._span_start:
            self._spans[(self._span_start, pos)] = f"{self.kind}:{self._span.hexdigest()}"
            self._span = digests.new_hasher(self.kind)
            self._span_start = pos

    def fail(self, why: str) -> None:
        """The writer stopped (or the save did): a waiting upload raises
        :class:`WriteFailed`, and the file is never complete."""
        with self._cond:
            self._failed = why
            self._cond.notify_all()

    # -- the upload's side ------------------------------------------------------------

    def wait(self, upto: int, go_on: Callable[[int], None] = lambda _n: None) -> int:
        """Block until the file holds ``upto`` bytes or is complete; the
        bytes it holds. ``go_on(0)`` is called while waiting (it raises to stop).
        Gives up with :class:`WriteFailed` when torch writes nothing to the
        file for :data:`STALL_S` seconds."""
        with self._cond:
            while True:
                if self._failed is not None:
                    raise WriteFailed(f"{self.name} was not written: {self._failed}")
                if self._size >= upto or self._done:
                    break
                if time.monotonic() - self._moved > STALL_S:
                    raise WriteFailed(
                        f"{self.name} was not written: torch wrote no byte of it for "
                        f"{STALL_S:g} s (waited for byte {upto:,}; it holds {self._size:,})")
                self._cond.wait(POLL_S)
                go_on(0)
            return self._size

    @property
    def done(self) -> bool:
        return self._done

    # -- once it is written ---------------------------------------------------------

    def checksum(self) -> tuple[int, str]:
        """``(size, kind:<hex>)`` of the complete file."""
        assert self._done
        if self.rewritten:
            size, checksum, _ = digests.of_file(self.path, self.kind)
            return size, checksum
        return self._size, f"{self.kind}:{self._whole.hexdigest()}"

    def range_checksums(self, spans: Sequence[tuple[int, int]]) -> list[str]:
        """The checksum of each ``(offset, length)`` item of the file: from
        the write's own pass, or read from the file for an item it did not
        delimit."""
        assert self._done
        found: dict[int, str] = {}
        missing: list[int] = []
        for i, (offset, length) in enumerate(spans):
            known = None if self.rewritten else self._spans.get((offset, offset + length))
            if known is None:
                missing.append(i)
            else:
                found[i] = known
        if missing:
            _, _, sums = digests.of_file(self.path, self.kind, [spans[i] for i in missing])
            found.update(zip(missing, sums, strict=True))
        return [found[i] for i in range(len(spans))]


class _TeeStream(io.RawIOBase):
    """The stream torch writes one scratch file through (see the module docstring)."""

    def __init__(self, raw: io.FileIO, growing: Growing) -> None:
        self._raw = raw
        self._growing = growing
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self._growing._failed is not None:
            # The save stopped (its error is raised where it happened): the
            # rest of what torch's writer threads write goes nowhere, so they
            # end at once and quietly, and nothing reaches the disk.
            return memoryview(b).nbytes
        try:
            view = memoryview(b).cast("B")
            done = 0
            while done < len(view):
                done += self._raw.write(view[done:]) or 0
            self._growing._wrote(view, self._pos + done)
        except KeyboardInterrupt:
            # Ctrl-C lands here most often (torch's C++ serialiser calls this
            # for every block), and that serialiser reports it as an error of
            # its own: the save says it was Ctrl-C (TeeFileSystem.interrupted).
            self._growing.interrupted = True
            raise
        self._pos += done
        return done

    def tell(self) -> int:
        self._growing._boundary(self._pos)
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        # torch's writer only appends; a writer that moves back rewrites bytes
        # the checksums and perhaps the upload have already seen.
        pos = self._raw.seek(offset, whence)
        if pos != self._pos:
            self._growing.rewritten = True
            self._pos = pos
            self._growing._span_start = pos
        return pos

    def flush(self) -> None:
        self._growing._publish(self._pos)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            if self._growing._failed is None:
                self._growing._boundary(self._pos)
                # A rewritten file reports its real size.
                size = os.path.getsize(self._growing.path) if self._growing.rewritten \
                    else self._pos
                self._growing._publish(size, done=True)
        super().close()


class TeeFileSystem(FileSystem):
    """torch's local ``FileSystem``, whose files opened for writing go through
    a :class:`_TeeStream`; ``opened`` is told of each new :class:`Growing`.

    :meth:`stop` ends the writing: torch writes from several threads
    (``thread_count``), and a save stopped in one of them (Ctrl-C reaches
    the main thread) must not remove the scratch folder while the others
    still write into it."""

    def __init__(self, kind: str, opened: Callable[[Growing], None] | None = None) -> None:
        self.kind = kind
        self.opened = opened
        self._cond = threading.Condition()
        self._open: list[Growing] = []
        self._all: list[Growing] = []
        self._stopped = False

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C reached torch's writer in one of the files."""
        with self._cond:
            return any(g.interrupted for g in self._all)

    def stop(self, why: str, timeout: float) -> bool:
        """Refuse new files, send what torch still writes to the open ones
        nowhere, and wait up to ``timeout`` seconds for them to close; whether
        they did."""
        with self._cond:
            self._stopped = True
            for growing in self._open:
                growing.fail(why)
            return self._cond.wait_for(lambda: not self._open, timeout)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb" or self.opened is None:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        growing = Growing(os.fspath(path), self.kind)
        with self._cond:
            # Made under the lock: once stop() has it, no new file appears (the
            # scratch folder is removed next, whether the writers stopped or not).
            stopped = self._stopped
            if not stopped:
                raw = open(os.fspath(path), "wb", buffering=0)  # noqa: SIM115 (the tee closes it)
                self._open.append(growing)
                self._all.append(growing)
        if stopped:  # a file torch starts after the save stopped is not made
            raise WriteFailed(f"{growing.name} was not written: the save stopped")
        try:
            tee = _TeeStream(raw, growing)
            try:
                self.opened(growing)
                yield tee
            except BaseException as exc:
                growing.fail(f"{type(exc).__name__}: {exc}".rstrip(": "))
                raise
            finally:
                tee.close()
        finally:
            with self._cond:
                self._open.remove(growing)
                self._cond.notify_all()

    def init_path(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        return path if isinstance(path, Path) else Path(path)
