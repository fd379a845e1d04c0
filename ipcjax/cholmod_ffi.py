"""The sparse Newton direction inside XLA: CHOLMOD behind an FFI custom call.

:func:`ipcjax.ldl.sparse_solve` reaches the host factorization through
``jax.pure_callback``: every Newton iteration leaves the compiled program, copies the
element blocks into Python, builds the CSC matrix with numpy and comes back. And JAX
writes no persistent-cache entry for a program with a host callback, so the bag's step
compiled again in every process. :func:`solve` does the same solve where H must be
positive definite (the Newton direction, the projected implicit solve) as an XLA custom
call, ``ipcjax_cholmod_solve`` (``ipcjax/native/cholmod_ffi.c``): the assembly into a
kept CSC pattern, CHOLMOD's supernodal Cholesky with its analysis kept per pattern, the
naming of a failure by an LDLᵀ, all in C on the buffers XLA already holds. Its answers
are :func:`ipcjax.ldl.host_solve`'s (``require_pd=True``) to round-off, with the same
:class:`~ipcjax.result.LinearStatus` (tests/test_sparse.py). With ``name_failure=False``
it is ``ipcjax_cholmod_try``, the same without that LDLᵀ: any pivot ≤ 0 is
NOT_POSITIVE_DEFINITE, at the cost of the failed factorization alone (the exact tangent
the Newton direction tries first, :mod:`ipcjax.newton`).

The handler is plain C against XLA's FFI C API. It is compiled on first use, with the
machine's C compiler (``$CC``, else ``gcc``), against JAX's FFI headers
(``jax.ffi.include_dir()``) and the CHOLMOD library
inside the ``cvxopt`` wheel, into ``$IPCJAX_NATIVE_CACHE`` (default
``$XDG_CACHE_HOME/ipcjax/native``, i.e. ``~/.cache/ipcjax/native``; where that cannot be
written, ``ipcjax-native-UID`` in the temporary folder), one file per source, compiler,
headers and library (0.4 s, once per machine). Where it cannot be built
or loaded (no compiler, another CHOLMOD), :func:`available` is False and :func:`why_not`
says why; :class:`ipcjax.linear_solvers.SparseLDL` then uses the host callback and warns
once, naming the reason. ``IPCJAX_NATIVE=0`` switches the custom call off.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp

TARGET = "ipcjax_cholmod_solve"
TRY_TARGET = "ipcjax_cholmod_try"
ENV_OFF = "IPCJAX_NATIVE"
ENV_CACHE = "IPCJAX_NATIVE_CACHE"
SOURCE = os.path.join(os.path.dirname(__file__), "native", "cholmod_ffi.c")
_FLAGS = ["-O2", "-std=c11", "-shared", "-fPIC", "-pthread", "-w"]

_lock = threading.Lock()
_state: dict = {}  # "lib" (the loaded library) or "why" (why there is none)
_off: list = []    # reasons the custom call is switched off for now (:func:`switched_off`)


class NativeBuildError(RuntimeError):
    """The custom call's library could not be built or loaded; the message says why."""


def cache_dir(environ=None) -> str:
    """Where the compiled handler is kept (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_CACHE):
        return os.path.abspath(os.path.expanduser(env[ENV_CACHE]))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ipcjax", "native")


def cholmod_library() -> str:
    """The CHOLMOD shared library of the installed cvxopt wheel (its ``cvxopt.libs``)."""
    import cvxopt
    import cvxopt.cholmod  # noqa: F401  (loads CHOLMOD and the libraries it needs into the process)

    libdir = os.path.join(os.path.dirname(os.path.dirname(cvxopt.__file__)), "cvxopt.libs")
    found = sorted(glob.glob(os.path.join(libdir, "libcholmod*.so*")))
    if not found:
        raise NativeBuildError(f"no libcholmod in {libdir}: this cvxopt is not the wheel ipcjax pins")
    return found[0]


def _compiler() -> str:
    cc = os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        raise NativeBuildError(f"no C compiler: {cc!r} is not on PATH (set CC)")
    return path


def _user_temp_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"ipcjax-native-{os.getuid()}")


def build(out_dir: str | None = None) -> str:
    """Compile the handler if this source, compiler, header set and CHOLMOD have no library
    in ``out_dir`` yet; returns the library's path. Without ``out_dir``: :func:`cache_dir`,
    or where that cannot be written a folder of this user's under the temporary folder.
    Raises :class:`NativeBuildError`."""
    cc, chol, include = _compiler(), cholmod_library(), jax.ffi.include_dir()
    with open(SOURCE, "rb") as f:
        source = f.read()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NativeBuildError(f"{cc} --version failed: {e}") from e
    key = hashlib.sha256(b"\0".join([source, version.encode(), include.encode(), chol.encode(),
                                     " ".join(_FLAGS).encode(), jax.__version__.encode()])).hexdigest()[:16]
    dirs = [out_dir] if out_dir is not None else [cache_dir(), _user_temp_dir()]
    for out_dir in dirs:
        target = os.path.join(out_dir, f"libipcjax_cholmod-{key}.so")
        if os.path.exists(target):
            return target
    errors = []
    for out_dir in dirs:  # the cache folder, else (unwritable) a folder of this user's under the temp dir
        target = os.path.join(out_dir, f"libipcjax_cholmod-{key}.so")
        try:
            os.makedirs(out_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
            break
        except OSError as e:
            errors.append(f"{out_dir} ({e.strerror or e})")
    else:
        raise NativeBuildError(f"cannot write {' nor '.join(errors)}; set {ENV_CACHE}")
    libdir = os.path.dirname(chol)
    cmd = [cc, *_FLAGS, f"-I{include}", SOURCE, "-o", tmp, chol,
           "-Wl,--disable-new-dtags", f"-Wl,-rpath,{libdir}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        os.remove(tmp)
        raise NativeBuildError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, target)  # atomic: a second process building the same file meanwhile is harmless
    return target


def _load():
    """Build, load and register the handler once per process; returns the library or None."""
    with _lock:
        if "lib" in _state or "why" in _state:
            return _state.get("lib")
        try:
            lib = ctypes.CDLL(build())
            lib.ipcjax_cholmod_check.restype = ctypes.c_char_p
            why = lib.ipcjax_cholmod_check().decode()
            if why:
                raise NativeBuildError(why)
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.IpcjaxCholmodSolve), platform="cpu")
            jax.ffi.register_ffi_target(TRY_TARGET, jax.ffi.pycapsule(lib.IpcjaxCholmodTry), platform="cpu")
        except (NativeBuildError, OSError) as e:
            _state["why"] = str(e)
            return None
        _state["lib"] = lib
        return lib


def _env_off() -> bool:
    return os.environ.get(ENV_OFF, "").strip().lower() in {"0", "off", "false", "no"}


def available() -> bool:
    """Whether the custom call is built, registered and not switched off (building it on
    the first call)."""
    return not _off and not _env_off() and _load() is not None


def why_not() -> str | None:
    """Why the custom call is not available, or None when it is."""
    if _off:
        return _off[-1]
    if _env_off():
        return f"switched off by {ENV_OFF}={os.environ[ENV_OFF]}"
    _load()
    return _state.get("why")


def switched_off_by_choice() -> bool:
    """True when the custom call is off because the user said so (``IPCJAX_NATIVE=0``,
    :func:`switched_off`), not because it could not be built."""
    return bool(_off) or _env_off()


class switched_off:
    """``with switched_off("why"):`` traces the sparse solve through the host callback
    (:func:`ipcjax.ldl.sparse_solve`), as where the custom call cannot be built: for
    comparisons and for benchmarks that look inside the host solve. It acts on what is
    traced inside it: a function traced before keeps its program, even through a new
    ``jax.jit`` of the same function (JAX keeps a function's trace)."""

    def __init__(self, why: str = "switched off by ipcjax.cholmod_ffi.switched_off"):
        self.why = why

    def __enter__(self):
        _off.append(self.why)
        return self

    def __exit__(self, *exc):
        _off.remove(self.why)


def solve_path(linear_solver: str) -> str | None:
    """How the positive definite solves of ``Config(linear_solver=...)`` run in this
    process, for a run's summary: ``"custom call"``, ``"host callback: WHY"``, or None
    for a solver other than ``"sparse"``."""
    if linear_solver != "sparse":
        return None
    return "custom call" if available() else f"host callback: {why_not()}"


def pattern_builds_agree(n: int, rows, blocks) -> int:
    """For tests: the handler's assembly pattern of these element groups (``rows`` (E, k)
    int32 and ``blocks`` (E, k, k) float64 per group, over ``n`` DOFs) built both ways the
    handler builds one (``ipcjax/native/cholmod_ffi.c``: by particles where the rows come in
    particle triples, else by entries). 0: the two are the same in every array; 1: the rows
    are not in triples (only the build by entries applies); 2: they differ; 3: a block that
    is read is not finite; -1: out of memory. Raises ValueError for groups of another shape
    or of more than 255 rows (the handler's limit), :class:`NativeBuildError` when the
    library cannot be built."""
    import numpy as np

    lib = _load()
    if lib is None:
        raise NativeBuildError(f"the CHOLMOD custom call is not available: {why_not()}")
    rows = [np.ascontiguousarray(r, np.int32) for r in rows]
    blocks = [np.ascontiguousarray(b, np.float64) for b in blocks]
    if (len(rows) != len(blocks) or
            any(r.ndim != 2 or r.shape[1] > 255 or b.shape != r.shape + r.shape[1:] for r, b in zip(rows, blocks))):
        raise ValueError("pattern_builds_agree: each group needs rows (E, k) and blocks (E, k, k), k <= 255")
    g = len(rows)
    fn = lib.ipcjax_pattern_selfcheck
    fn.restype = ctypes.c_int
    return int(fn(ctypes.c_int32(n), ctypes.c_int(g), (ctypes.c_int64 * g)(*[r.shape[0] for r in rows]),
                  (ctypes.c_int64 * g)(*[r.shape[1] for r in rows]),
                  (ctypes.c_void_p * g)(*[r.ctypes.data for r in rows]),
                  (ctypes.c_void_p * g)(*[b.ctypes.data for b in blocks])))


def solve(hb, rhs, *, name_failure: bool = True):
    """u = H⁻¹ rhs for positive definite H over the free DOFs, by the custom call; returns
    (u, status) as :func:`ipcjax.ldl.sparse_solve` with ``require_pd=True`` does (u NaN
    unless the int32 :class:`~ipcjax.result.LinearStatus` is SUCCESSFUL). With
    ``name_failure=False`` a failed factorization is NOT_POSITIVE_DEFINITE without the
    LDLᵀ that tells a zero pivot (SINGULAR) from a negative one. Traceable; under
    ``vmap`` it runs once per batch member. Raises :class:`NativeBuildError` when the
    custom call is not :func:`available`."""
    if not available():
        raise NativeBuildError(f"the CHOLMOD custom call is not available: {why_not()}")
    args = [hb.diag.astype(jnp.float64), rhs.astype(jnp.float64)]
    for r, B in zip(hb.rows, hb.blocks):
        args += [r.astype(jnp.int32), B.astype(jnp.float64)]
    out = (jax.ShapeDtypeStruct(rhs.shape, jnp.float64), jax.ShapeDtypeStruct((), jnp.int32))
    return jax.ffi.ffi_call(TARGET if name_failure else TRY_TARGET, out, vmap_method="sequential")(*args)
