"""Write an output checkpoint to object storage (an output given as a URL, :mod:`surgery.io.store`).

Object stores have no rename, so the local recipe (write a temporary folder, rename it into place) cannot
be used. The output is staged, then *published in order* by its store
(:meth:`surgery.io.stores.RemoteStore.publish`):

1. the rewritten weight files (the shards the plan touches, streamed with bounded memory) are written to
   a local temporary folder and read back there (:mod:`surgery.io.readback`), as a local run does; the
   whole files the output holds unchanged are not copied there but recorded (:class:`DeferredCopier`);
2. the store copies those (server-side within one store) and uploads the staged files, the index last.

A failed request stops the run, the objects written so far are deleted (best effort), and the error names
the object; the index is never written then. What is not atomic: while the run goes on, and after a failure
whose clean-up could not reach the store, objects other than the index can be listed under the output
prefix.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..io import stores
from ..io.checkpoint import REPORT_NAME
from ..model.errors import OutputError, StorageError, TietoolError
from ..plan.plan import Plan
from .publish import write_json


class DeferredCopier:
    """Stands in for :class:`surgery.write.copy.Copier`: records the whole-file copies
    (:class:`surgery.io.stores.Copy`) instead of copying them into the local folder; the store's
    ``publish`` copies them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.jobs: list[stores.Copy] = []

    def submit(self, src: Any, dst: Path, label: str | None, tensor_bytes: int = 0) -> None:
        self.jobs.append(stores.Copy(src, dst.relative_to(self.tmp).as_posix(), label, tensor_bytes))

    def poll(self, block: bool = False) -> None:
        """Nothing runs until the store publishes."""

    def close(self) -> None:
        """Nothing runs until the store publishes."""


def execute_remote(
    plan: Plan,
    out: Any,
    write_all: Callable[[Path, DeferredCopier], dict],
    progress: Any = None,
    report: Any = None,
) -> dict:
    """Write ``plan``'s output to the URL ``out`` (a remote ``UPath``), in the order the module describes.

    Args:
        write_all: writes the rewritten files into the staging folder with the given copier (the writer's
            own loop, handed in: this module does not import the writer) and returns the facts.
        progress, report: as :func:`surgery.write.writer.execute`.

    Returns:
        the report (:func:`surgery.ops` adds the bytes moved, ``store.TRANSFER``).

    Raises:
        OutputError: a request failed (one line naming the object); no index was written and the objects
            written were deleted where the store could be reached (objects left: always this error, exit 6,
            naming them).
        StorageError: the network or the store failed and every object written was deleted: run again.
    """
    st = stores.RemoteStore(out)  # ``out`` checked by the caller (surgery.run.run), once
    tmp = Path(tempfile.mkdtemp(prefix="tietool-out-"))
    written: list[Any] = []
    try:
        copier = DeferredCopier(tmp)
        facts = write_all(tmp, copier)
        if report is not None:
            facts = report(facts)
            write_json(tmp / REPORT_NAME, facts)
        st.publish(tmp, out, copier.jobs, progress, written)
    except BaseException as e:
        left = st.remove(written)
        if left and isinstance(e, TietoolError):
            # objects left under the prefix: running again is refused until they are deleted, so a failure
            # of the store is no longer "retry" (exit 75) but an output to clear (exit 6)
            raise (OutputError if isinstance(e, StorageError) else type(e))(
                f"{e.message}; {len(left)} object(s) it had written could not be deleted",
                e.path,
                f"delete every object under {out}, check the endpoint, the credentials and the connection, "
                "and run again",
            ) from None
        if isinstance(e, TietoolError | KeyboardInterrupt):
            raise
        if isinstance(e, OSError) and not hasattr(getattr(e, "filename", None), "fs"):  # not about an object
            raise OutputError(f"cannot write the local staging copy: {e.strerror or e}", str(tmp)) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return facts
