"""Refusals the pool core can give. Every message says what to do next."""


class PoolError(Exception):
    """Base: a request the pool will not serve. `str(err)` is shown to the user."""

    status = 400


class InvalidRequest(PoolError):
    """Malformed or impossible input (a tampered form, -1 GPUs)."""


class QuotaExceeded(PoolError):
    """Allowed in principle, but the user's or group's fixed quota is used up."""

    status = 403


class NoCapacity(PoolError):
    """Within quota, but no GPU has room right now."""

    status = 409


class HubStopping(PoolError):
    """The hub is stopping: nothing new starts (a start now would outlive it, uncounted)."""

    status = 503


class DiskReserve(PoolError):
    """The disk that holds the hub's databases is down to its reserve: nothing new starts, so that
    users' files (homes, job folders on the same disk) cannot take the space the hub writes to."""

    status = 507


class RoomBeingFreed(NoCapacity):
    """No room yet, but train jobs that borrowed GPUs are being stopped for it (build first):
    the spawn may wait for them."""
