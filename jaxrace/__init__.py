"""jaxrace: automated reward design for racing agents, on a JAX racing simulator."""

from jaxrace.envs import make

__version__ = "0.1.0"
__all__ = ["make"]
