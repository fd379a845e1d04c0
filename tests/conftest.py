"""Test configuration: every test runs in float64 (derivative comparisons need it)."""
import jax

jax.config.update("jax_enable_x64", True)
