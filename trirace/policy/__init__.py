"""Communication policies and where they launch chunks: pure decisions, shared by the
real runtime and the simulator."""

from .policies import POLICIES, Policy, make_policy

__all__ = ["POLICIES", "Policy", "make_policy"]
