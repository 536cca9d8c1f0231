"""Communication policies and the scheduler they drive: pure decisions, shared by the
real runtime and the simulator."""

from .policies import POLICIES, InFlight, Policy, make_policy
from .scheduler import CommScheduler

__all__ = ["POLICIES", "CommScheduler", "InFlight", "Policy", "make_policy"]
