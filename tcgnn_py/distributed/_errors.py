"""Layer 4: the errors of a distributed run (below the contexts and the rendezvous, which both raise them)."""

__all__ = ["DistributedError", "DistributedTimeoutError"]


class DistributedError(RuntimeError):
    """A rank of the group failed, so the collective this rank was in cannot finish."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """A collective did not finish in time: a peer died, stalled, or issued different collectives."""
