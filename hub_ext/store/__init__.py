"""Persistence of allocations and events (SQLAlchemy; an SQLite file by default)."""

from gpupool.store.db import Store
from gpupool.store.jobs import TrainJob
from gpupool.store.models import Allocation, Event
from gpupool.store.moves import Move  # registers its table before Store creates them
from gpupool.store.parked import Parked  # registers its table before Store creates them
from gpupool.store.usage_tables import BudgetGrant, PodSpanRow, UsageHour  # usage accounting and budgets

__all__ = [
    "Allocation",
    "BudgetGrant",
    "Event",
    "Move",
    "Parked",
    "PodSpanRow",
    "Store",
    "TrainJob",
    "UsageHour",
]
