"""Tensors made when they are written: the one "made when written" type of every writer path.

A :class:`Made` is a :class:`~surgery.io.safetensors_io.Source` whose size (and shape) is known when the
output is planned, and whose bytes a recipe makes only when a format writer streams them
(:meth:`Made.write_to`), so that a write holds one new tensor in memory at a time (a 128k-row fp32 moment
is 2.1 GB). The recipe is made through the write's one :class:`Memo`: equal recipes (an embedding's
resized table, its aliases and a head equal to it) share one made array, one random draw.

* an edit's and a new checkpoint's tensors: a :mod:`surgery.plan.recipes` recipe, made by
  ``recipes.make`` with one memo for the whole write (the writer builds the :class:`Memo`);
* a flex checkpoint's replaced tensors (weights, moments, master weights): a zero-argument function
  (:meth:`Made.call`), made once per write and dropped after (:data:`CALLED`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .safetensors_io import Source

Data = Any
"""What a recipe makes: an array in its stored dtype (bf16 as ``uint16`` bits) or a :class:`Source`."""


class Memo:
    """The data of one write's recipes: each made once by ``build(recipe, data)`` (which may memoize its
    sub-recipes in ``data`` too), held while a later tensor may need it.

    Two ways to let data go: ``uses`` (the recipe of every tensor to be written, with repeats) drops a
    recipe's data once its last user is made (:meth:`made`); :meth:`keep_only` drops every recipe that a
    list of recipes still to come does not need (an edit, after each file).
    """

    def __init__(self, build: Callable[[Any, dict[Any, Data]], Data], uses: Iterable[Any] = ()):
        self._build = build
        self.data: dict[Any, Data] = {}
        self._left = Counter(uses)

    def made(self, recipe: Any) -> Data:
        """The data of ``recipe`` (made now unless held); dropped from the memo when it was the last of its
        counted uses."""
        data = self._build(recipe, self.data)
        if recipe in self._left:
            self._left[recipe] -= 1
            if not self._left[recipe]:
                del self._left[recipe]
                self.data.pop(recipe, None)
        return data

    def keep_only(self, needed: Iterable[Any], parts: Callable[[Any], Iterable[Any]]) -> None:
        """Drop the data of every recipe that is not in ``needed`` nor one of their ``parts``
        (recursively)."""
        keep: set[Any] = set()
        todo = list(needed)
        while todo:
            r = todo.pop()
            if r not in keep:
                keep.add(r)
                todo.extend(parts(r))
        for k in list(self.data):
            if k not in keep:
                del self.data[k]


CALLED = Memo(lambda make, _data: make())
"""The memo of :meth:`Made.call`: the recipe is a function, called each time it is made, nothing held."""


class Made(Source):
    """A tensor's bytes, made by ``recipe`` through ``memo`` when they are written.

    Attributes:
        recipe: what the data is (a :mod:`surgery.plan.recipes` recipe, or a function for :data:`CALLED`).
        shape: the planned shape.
        nbytes: the planned size in bytes (what a header records before the bytes are made).
        dtype: the planned numpy storage dtype when known (a flex tensor's), else None.
        memo: the write's :class:`Memo`.
    """

    __slots__ = ("recipe", "shape", "dtype", "memo")

    def __init__(
        self, recipe: Any, shape: tuple[int, ...], nbytes: int, memo: Memo, dtype: np.dtype[Any] | None = None
    ):
        super().__init__(nbytes=nbytes)
        self.recipe, self.shape, self.dtype, self.memo = recipe, tuple(shape), dtype, memo

    @classmethod
    def call(
        cls, make: Callable[[], np.ndarray[Any, Any]], shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> Made:
        """A tensor of ``shape`` and storage ``dtype`` whose array ``make()`` computes (C order) each time it
        is made, the result dropped after it is written."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return cls(make, shape, nbytes, CALLED, np.dtype(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def make(self) -> Callable[[], Data]:
        """A function making the data once (for a caller that wraps it)."""
        return lambda: self.memo.made(self.recipe)

    def made(self) -> Source:
        """The data as a :class:`Source`, made now.

        Raises:
            ValueError: the recipe made another size, shape or dtype than planned (a bug: nothing of it is
                written).
        """
        data = self.memo.made(self.recipe)
        if isinstance(data, Source):
            if data.nbytes != self.nbytes:
                raise ValueError(f"internal: a recipe made {data.nbytes} bytes, {self.nbytes} were planned")
            return data
        a = np.ascontiguousarray(data)
        if (
            a.nbytes != self.nbytes
            or a.shape != self.shape
            or (self.dtype is not None and a.dtype != self.dtype)
        ):
            raise ValueError(
                f"internal: a recipe made {a.shape} {a.dtype}, planned {self.shape} {self.dtype}"
            )
        return Source(array=a)

    def as_array(self) -> np.ndarray[Any, Any]:
        """The data as an array, made now (a recipe that made a :class:`Source` of byte ranges is refused:
        only :meth:`call` tensors are asked for arrays).

        Raises:
            ValueError: not the planned shape and dtype. AssertionError: no array (both bugs).
        """
        src = self.made()
        assert src.array is not None, "internal: an array was asked of a byte-range recipe"
        return src.array

    def write_to(self, f: Any) -> None:
        """Make the bytes and append them to ``f`` (the data dropped after, unless the memo holds it)."""
        self.made().write_to(f)
