"""fedjax_inv: a vectorized JAX/Flax simulator for federated learning under distribution
shift. See README.md; the engine is in ``fedjax_inv.core``."""
__version__ = "0.1.0"
