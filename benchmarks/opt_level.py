"""Would the test suite be faster at LLVM optimisation level 0, or under other XLA flags?
(issue #31; docs/benchmarks.md "The test suite").

Four fifths of the default suite's time is XLA compiling programs (docs/benchmarks.md).
``--xla_backend_optimization_level=0`` compiles faster; this script measures what it costs,
or what any other ``--flags`` cost.

Each child process runs the same two jobs under its ``XLA_FLAGS``:
the README's drape (10 × 10 film, 10 steps through ``simulate``) and the gradient of a
3-step rollout of the frictional vertex–triangle slide in E, μf and κ (the default suite's
Taylor-test case), each called twice. It reports the seconds XLA spent compiling, the
second call's run time, and the results' bytes. The base flags (level 2, XLA's default,
unless ``--base``) and the flags measured (level 0 unless ``--flags``) alternate, each in
its own process, ``--rounds`` times; the figures are the medians' ratios. The older CPU
kernel emitter that the test suite compiles with (tests/conftest.py):

    python3 benchmarks/opt_level.py [--rounds 2]
    python3 benchmarks/opt_level.py --base=--xla_cpu_use_fusion_emitters=true --flags=--xla_cpu_use_fusion_emitters=false
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child() -> dict:
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from ipcjax.step import make_state, simulate
    from scenes.film import drape_scene, vertex_triangle_scene

    compile_s = [0.0]

    def listen(event, secs, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compile_s[0] += secs

    jax.monitoring.register_event_duration_secs_listener(listen)
    out, digest = {}, hashlib.sha256()

    sc = drape_scene(n=10)
    p = Params.film_defaults()

    def drape():
        frames, _, reports = simulate(sc.model, p, make_state(sc.x), Controls.empty(sc.model.n_particles),
                                      steps=10, dt=1 / 240)
        assert all(r.ok for r in reports)
        return np.asarray(frames)

    vt = vertex_triangle_scene()
    x0 = vt["x"].copy(); x0[:3, 2] -= 0.0015
    v0 = np.zeros_like(x0); v0[:3] = [0.3, 0.1, -0.02]
    m = vt["model"]
    roll = make_rollout(m, Config(), round_fp32=False)
    ctl = stack_controls([Controls.empty(m.n_particles, tolerance=1e-12)] * 3)
    W = jnp.asarray(np.random.default_rng(1).normal(size=x0.shape))
    x0, v0 = jnp.asarray(x0), jnp.asarray(v0)
    grad = jax.jit(jax.grad(lambda q: jnp.sum(W * roll(q, x0, v0, ctl, 1 / 240)[0][-1])))

    def gradient():
        g = grad(p)
        return np.asarray([float(g.youngs_modulus), float(g.friction), float(g.barrier_stiffness)])

    for name, job in (("drape", drape), ("gradient", gradient)):
        c0, t0 = compile_s[0], time.perf_counter()
        r1 = job()
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        r2 = job()
        second = time.perf_counter() - t1
        assert np.array_equal(r1, r2)
        digest.update(np.ascontiguousarray(r1, dtype=np.float64).tobytes())
        out[name] = {"compile_s": compile_s[0] - c0, "first_call_s": first, "second_call_s": second,
                     "result": r1.ravel().tolist() if r1.size < 10 else None}
        out[name + "_frames"] = np.ascontiguousarray(r1, dtype=np.float64).tobytes().hex() if name == "drape" else None
    out["digest"] = digest.hexdigest()
    out["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return out


def run(flags: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": flags}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"XLA_FLAGS={flags!r}: child failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(child()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flags", default="--xla_backend_optimization_level=0",
                    help="the XLA_FLAGS measured (default: level 0)")
    ap.add_argument("--base", default="--xla_backend_optimization_level=2",
                    help="the XLA_FLAGS they are measured against (default: level 2, XLA's default)")
    args = ap.parse_args()
    base, other = args.base, args.flags
    if base == other:
        ap.error("--base and --flags are the same")
    res = {base: [], other: []}
    for i in range(args.rounds):
        for flags in (base, other):
            res[flags].append(run(flags))
            r = res[flags][-1]
            print(f"round {i + 1} XLA_FLAGS={r['xla_flags']!r}: " + ", ".join(
                f"{j} compile {r[j]['compile_s']:.1f} s, run {r[j]['second_call_s']:.2f} s" for j in ("drape", "gradient")),
                flush=True)
    import numpy as np

    def med(flags, job, key):
        return statistics.median(r[job][key] for r in res[flags])

    for job in ("drape", "gradient"):
        print(f"{job}: compile [{other}] / [{base}] = {med(other, job, 'compile_s') / med(base, job, 'compile_s'):.2f}; "
              f"run (second call) = {med(other, job, 'second_call_s') / med(base, job, 'second_call_s'):.2f}")
    a = np.frombuffer(bytes.fromhex(res[base][0]["drape_frames"]))
    b = np.frombuffer(bytes.fromhex(res[other][0]["drape_frames"]))
    print(f"drape frames: identical bit for bit: {bool(np.array_equal(a, b))} (max |Δx| {np.max(np.abs(a - b)):.3g} m)")
    ga, gb = np.asarray(res[base][0]["gradient"]["result"]), np.asarray(res[other][0]["gradient"]["result"])
    print(f"gradient (E, μf, κ): identical bit for bit: {bool(np.array_equal(ga, gb))} "
          f"(largest relative difference {np.max(np.abs(ga - gb) / np.abs(ga)):.3g})")
    same = len({r["digest"] for rs in res.values() for r in rs}) == 1
    print(f"every run's results identical: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
