"""Local provider: processes on this machine."""

from .provider import LocalProvider, local_capacity

__all__ = ["LocalProvider", "local_capacity"]
