"""Layer 0: bounded caches -- the one rule by which the library's caches keep what they made, and the one store
of bound calls.

Plans, bound launches, cast values and small device arrays are cached in plain dicts keyed by what they depend on;
each cache keeps a bounded number of entries, and the oldest (the first inserted) goes first, so a program that
cycles through many signatures holds a fixed amount of memory (:func:`keep`).  What a signature binds -- a
product's plan, a layer's bound call, an attention pass, a dense product, a cuBLASLt plan -- goes to a
:class:`Store`: at most ``limit`` per place (a device and stream), nothing kept while the stream captures a CUDA
graph (whose buffers are the graph's own).  A graph's tiling holds one store (:meth:`Tiling.bound`, what its
products and layers bind); :data:`BOUND` holds what no graph owns (the dense products and small kernels of a
training step, the cuBLASLt plans).
"""

__all__ = ["keep", "Store", "BOUND", "BOUND_KEEP"]


def keep(store, key, value, limit):
    """``store[key] = value`` with at most ``limit`` entries in ``store``, the oldest dropped first; returns ``value``.

    Replacing a key's value drops nothing.

    Examples
    --------
    >>> from tcgnn_py._cache import keep
    >>> store = {}
    >>> for k in range(5):
    ...     _ = keep(store, k, k * k, 3)
    >>> store
    {2: 4, 3: 9, 4: 16}
    """
    if key not in store and len(store) >= limit:
        del store[next(iter(store))]
    store[key] = value
    return value


class Store(dict):
    """Signature -> bound call: a dict (``get`` is a dict's, for the calls that look a signature up per call) whose
    :meth:`put` keeps at most :attr:`limit` entries per place, the oldest of that place dropped first, and keeps
    nothing while capturing.

    Examples
    --------
    >>> from tcgnn_py._cache import Store
    >>> s = Store(2)
    >>> for k in range(3):
    ...     _ = s.put(("a", k), k, place=0)
    >>> _ = s.put("b", 9, place=1)
    >>> _ = s.put("c", 8, place=1, capturing=True)
    >>> sorted(s.items(), key=str)
    [('b', 9), (('a', 1), 1), (('a', 2), 2)]
    """

    __slots__ = ("limit", "_places")

    def __init__(self, limit):
        super().__init__()
        self.limit = limit
        self._places = {}  # place -> {key: None} in insertion order

    def put(self, key, value, place, capturing=False):
        """Keep ``value`` under ``key`` for ``place`` (the device and stream it was bound on, or what stands for
        them); returns ``value``, kept or not."""
        if capturing:
            return value
        order = self._places.get(place)
        if order is None:
            order = self._places[place] = {}
        if key not in order and len(order) >= self.limit:
            old = next(iter(order))
            del order[old]
            self.pop(old, None)
        order[key] = None
        self[key] = value
        return value

    def __reduce__(self):  # a copy starts empty: what it holds is bound to one process's device state
        return (Store, (self.limit,))


#: Bound calls per place in :data:`BOUND` and in a tiling's store: a training step binds a few dozen signatures
#: per graph; a program cycling through more rebinds the oldest rather than holding each one's buffers.
BOUND_KEEP = 256

#: What no graph owns: bound dense products and small kernels, cuBLASLt plans.
BOUND = Store(BOUND_KEEP)
