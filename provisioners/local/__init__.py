"""Local provider: processes on this machine."""

from .provisioner import LocalProvisioner, local_capacity

__all__ = ["LocalProvisioner", "local_capacity"]
