"""ipcjax: differentiable Incremental Potential Contact for thin film and spheres, in JAX.

Importing ipcjax enables JAX's float64 mode: distances, derivatives and the global
linear system are FP64 by design (positions are stored rounded to FP32).
"""
import jax as _jax

_jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"
