"""Test configuration: every test runs in float64 (derivative comparisons need it), and the
command-line jobs the tests start write no persistent compilation cache into the user's
home (tests/test_compile_cache.py sets its own folders)."""
import os

import jax

os.environ.setdefault("IPCJAX_COMPILATION_CACHE", "off")

jax.config.update("jax_enable_x64", True)
