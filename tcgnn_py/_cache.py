"""Layer 0: bounded caches -- the one rule by which the library's caches keep what they made.

Plans, bound launches, cast values and small device arrays are cached in plain dicts keyed by what they depend on;
each cache keeps a bounded number of entries, and the oldest (the first inserted) goes first, so a program that
cycles through many signatures holds a fixed amount of memory.
"""

__all__ = ["keep"]


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
