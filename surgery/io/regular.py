"""Read only regular files, and never more than a bound: the one place every reader of the input opens a file.

A FIFO in place of ``config.json`` blocks ``open()`` forever, ``/dev/zero`` linked as a JSON file reads until
memory runs out, and a 600 MB "config" costs 600 MB before the parser sees it. So every local
input file is opened here with ``O_NONBLOCK`` (a FIFO's ``open`` returns at once instead of waiting for a
writer), checked with ``fstat`` to be a regular file (``S_ISREG``: not a FIFO, socket, device or folder),
and read up to a limit. A remote path (fsspec) has no FIFOs or devices: it is opened as such, and bounded
by the same limits.

JSON is parsed by :func:`parse_json`: bounded size, nesting depth (Python's parser recurses), integers of
at most 4,300 digits (CPython's limit, raised as ValueError), no ``NaN``/``Infinity`` (not JSON; ``1e400``
is refused too, as it parses to ``inf``), no ``\\ud800`` escape of a lone surrogate (Python cannot write it
back as UTF-8), and duplicate keys refused (the format forbids them; the safetensors library keeps the
last). Every refusal is a :class:`CheckpointError` (exit 3) naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any

from ..model.errors import CheckpointError

JSON_LIMIT = 64 * 1024**2  # bytes of a config, index or tokenizer JSON we read (the largest real: ~20 MB)
INDEX_LIMIT = 256 * 1024**2  # an index names every tensor: as many as a few 100 MB safetensors headers hold
JSON_DEPTH = 512  # nesting of a JSON value (real configs: < 10; Python's parser recurses per level)

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def kind_of(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a FIFO (named pipe)", "a folder", "a regular file")."""
    return "a regular file" if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _is_local(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and not type(path).__module__.startswith("upath")


def open_regular(path: Any, what: str | None = None) -> IO[bytes]:
    """Open ``path`` for binary reading, refusing anything but a regular file.

    Args:
        path: a local path (``str``/``Path``) or a remote ``UPath`` (opened as it is: object stores have no
            special files).
        what: how messages name the file ("config.json", "the shard"); default its name.

    Returns:
        a buffered binary file object positioned at 0 (blocking mode restored).

    Raises:
        CheckpointError: missing, a FIFO, device, socket or folder, or unreadable (permission); the message
            names the file and what it is.
    """
    if not _is_local(path):
        return path.open("rb")
    p = Path(path)
    name = what or p.name
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{name} not found", p, "check the path") from None
    except PermissionError:
        raise CheckpointError(f"{name} cannot be read (permission denied)", p, "make it readable") from None
    except OSError as e:
        raise CheckpointError(f"{name} cannot be opened ({e.strerror})", p, "check the file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                f"{name} is {kind_of(mode)}, expected a regular file", p, "replace it with the real file"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Any, limit: int, what: str | None = None) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes.

    Raises:
        CheckpointError: as :func:`open_regular`, or the file is larger than ``limit`` (the message says
            the limit), or a read fails.
    """
    name = what or Path(str(path)).name
    with open_regular(path, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise CheckpointError(f"{name} cannot be read ({e.strerror})", path, "check the file") from None
    if len(data) > limit:
        raise CheckpointError(
            f"{name} is larger than {limit:,} bytes, more than tietool reads from such a file",
            path,
            "check that it is the right file",
        )
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"{s[:40]} is out of range")
    return v


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's ``(key, value)`` pairs as a dict (``json`` ``object_pairs_hook``).

    Raises:
        ValueError: a key appears twice (naming it).
    """
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {dup[:80]!r} appears twice in one object")
    return d


def parse_json(
    blob: bytes | str,
    path: Any,
    what: str | None = None,
    depth: int = JSON_DEPTH,
    *,
    pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    int_hook: Callable[[str], Any] | None = None,
) -> Any:
    """Parse JSON text strictly (see the module docstring); ``path``/``what`` name it in errors.

    Args:
        depth: the deepest nesting accepted (the outermost object or array is level 1).
        pairs_hook: builds each object from its ``(key, value)`` pairs instead of :func:`dict` (the
            safetensors header makes its entries compact with it); it must refuse repeated keys itself
            (:func:`unique_pairs`), raising ``ValueError``.
        int_hook: parses each integer literal (default ``int``); a ``ValueError`` it raises is a refusal.

    Raises:
        CheckpointError: not UTF-8, not JSON, nested deeper than ``depth``, an integer over 4,300 digits,
            ``NaN``/``Infinity``/an overflowing float, or a repeated key.
    """
    name = what or Path(str(path)).name
    try:
        _check_depth(blob, depth)
        text = blob.decode("utf-8") if isinstance(blob, bytes) else blob
        data = json.loads(
            text,
            object_pairs_hook=pairs_hook or unique_pairs,
            parse_constant=_no_constant,
            parse_float=_float,
            parse_int=int_hook,
        )
        if _SURROGATE_ESCAPE.search(text):
            _refuse_lone_surrogates(text)
        return data
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        kind = "nested too deep" if isinstance(e, RecursionError) else str(e)[:200]
        raise CheckpointError(f"{name} is not valid JSON ({kind})", path, "fix or restore the file") from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(text: str) -> None:
    """A ``\\ud800`` escape with no partner parses to a string Python cannot encode as UTF-8 (a write of
    it fails late, and serde_json, the safetensors library's parser, refuses it): refuse it here.
    Only called when the text has such an escape at all (a valid pair parses to one character). The text
    is parsed again plainly, because a ``pairs_hook`` may have built objects ``json.dumps`` cannot write
    (the safetensors reader's ``TensorInfo``)."""
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a \\u escape of a lone UTF-16 surrogate, which is not a character") from None


def _check_depth(text: bytes | str, depth: int) -> None:
    """Refuse nesting deeper than ``depth`` before the recursive parser sees it, in time linear in the text
    and in C (a 100 MB safetensors header has millions of brackets): escaped backslashes and quotes are
    removed (they cannot end a string), then everything but quotes and brackets, then the strings; the
    deepest level is the maximum of the running sum of the brackets left (+1 opening, -1 closing).
    Exact for valid JSON; invalid JSON is refused by the parser afterwards either way."""
    if depth >= len(text):
        return  # a caller that lets the parser's recursion limit decide
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= depth:
        return
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    import numpy as np  # only for texts with more brackets than ``depth``: never a small config

    chars = np.frombuffer(raw, dtype=np.uint8)
    level = quotes = 0
    for i in range(0, len(chars), 1 << 23):  # 8 Mi characters at a time: bounded memory
        c = chars[i : i + (1 << 23)]
        q = c == 34
        odd = (np.cumsum(q, dtype=np.int64) + quotes) & 1  # 1 from an opening quote to its closing one
        run = np.cumsum(np.where(c[(odd == 0) & ~q] & 2, 1, -1), dtype=np.int64) + level
        if run.size and int(run.max()) > depth:
            raise ValueError(f"nested more than {depth} levels deep")
        quotes, level = int(odd[-1]), int(run[-1]) if run.size else level


# every byte but the quote and the four brackets (``[`` 0x5B and ``{`` 0x7B have bit 0x02 set, ``]`` 0x5D and
# ``}`` 0x7D clear)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


_PARSED: ContextVar[dict[tuple[Any, Any], Any] | None] = ContextVar("parsed_json", default=None)


@contextmanager
def parsed_once() -> Iterator[None]:
    """Within it (in this thread or task), :func:`load_json` ``shared=True`` parses the same bytes once and
    hands every later caller the same value: a 17 MB ``tokenizer.json`` is read by detection, the
    tokenizer checks and the planner of one run, ~0.4 s a parse. Keyed by the file's bytes (read each time,
    so a changed file is parsed again); the values live until the block ends."""
    token = _PARSED.set({})
    try:
        yield
    finally:
        _PARSED.reset(token)


def load_json(
    path: Any,
    what: str | None = None,
    limit: int = JSON_LIMIT,
    depth: int = JSON_DEPTH,
    *,
    shared: bool = False,
) -> Any:
    """:func:`read_bounded` then :func:`parse_json`: the way to read any JSON file of the input.

    ``shared``: the caller never modifies the value, so within :func:`parsed_once` it may be the value an
    earlier call parsed from the same bytes.

    Raises:
        CheckpointError: as those two (exit 3, naming the file).
    """
    blob = read_bounded(path, limit, what)
    return parse_shared(blob, path, what, depth) if shared else parse_json(blob, path, what, depth)


def memoized(key: Hashable | None, make: Callable[[], Any]) -> Any:
    """``make()``; within :func:`parsed_once`, the value an earlier call with the same ``key`` made (``key``
    None: never kept). For values nobody modifies (a frozen dataclass), keyed by what they are made of."""
    cache = _PARSED.get()
    if cache is None or key is None:
        return make()
    k = ("memo", key)
    if k not in cache:
        cache[k] = make()
    return cache[k]


def folder_files_key(folder: Any) -> tuple | None:
    """A local folder's path and each file's name, size, modification time (ns) and inode: what a
    :func:`memoized` value read from its files is keyed by (None for a remote folder: not kept)."""
    if not _is_local(folder):
        return None
    try:
        with os.scandir(folder) as it:
            files = sorted((e.name, st.st_size, st.st_mtime_ns, st.st_ino) for e in it if (st := e.stat()))
    except OSError:
        return None
    return (str(Path(folder).resolve()), tuple(files))


def parse_shared(blob: bytes, path: Any, what: str | None = None, depth: int = JSON_DEPTH) -> Any:
    """:func:`parse_json` of ``blob`` for a caller that never modifies the value: within
    :func:`parsed_once`, the value parsed from the same bytes before, if any (a refusal is not kept).

    Raises:
        CheckpointError: as :func:`parse_json`.
    """
    cache = _PARSED.get()
    if cache is None:
        return parse_json(blob, path, what, depth)
    key = (depth, blob)
    if key not in cache:
        cache[key] = parse_json(blob, path, what, depth)
    return cache[key]


def require_regular(path: Any, what: str | None = None) -> None:
    """Check that ``path`` is a regular file tietool can read (as :func:`open_regular`, then closed): for
    a file that is copied, not parsed (tokenizer files, carried files, rank files), so that a FIFO, device,
    socket or unreadable file is refused by name before anything is written, not met half-way through
    the copy (a FIFO blocks it; a permission error would be reported as a failed write).

    Raises:
        CheckpointError: as :func:`open_regular`.
    """
    if _is_local(path):
        open_regular(path, what).close()
