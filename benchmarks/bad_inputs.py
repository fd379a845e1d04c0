"""Every bad input of the no-silent-failures check, the message it gets and how long that takes.

    python3 -m benchmarks.bad_inputs [--skip-rollout] > table.md

Command-line mistakes run as subprocesses (`python3 -m jobs.cli …`, timed from process
start, so the times include Python and JAX start-up); library mistakes run in this process.
The last row forces a rollout's capacity too small under `jax.grad` and so includes one
compilation (about a minute on 2 cores); `--skip-rollout` leaves it out. Prints a Markdown
table (docs/validation.md, "Bad input").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(args):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    msg = lines[-1] if lines else r.stdout.strip().splitlines()[-1]
    return f"exit {r.returncode}: `{msg}`", time.perf_counter() - t0


def _api(fn):
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # the point is to show what is raised
        return f"{type(e).__name__}: `{str(e).splitlines()[0]}`", time.perf_counter() - t0
    return "no error", time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-rollout", action="store_true", help="leave out the row that compiles a rollout")
    args = ap.parse_args(argv)

    import jax.numpy as jnp

    from ipcjax.candidates import initial_capacity
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from ipcjax.step import advance, make_state
    from scenes.film import drape_scene

    tmp = tempfile.mkdtemp(prefix="ipcjax-bad-")
    path = lambda name: os.path.join(tmp, name)
    with open(path("malformed.json"), "w") as f:
        f.write("{\"neck_x_m\": 0.04,")
    with open(path("list.json"), "w") as f:
        json.dump([0.04, 0.04, 0.02], f)
    with open(path("corrupt.npz"), "wb") as f:
        f.write(b"PK\x03\x04 not really a zip")
    np.savez(path("only_x.npz"), x=np.zeros((85 + 7 + 20, 3)))
    from scenes.bag import bag_scene
    n = bag_scene("coarse")["model"].n_particles
    np.savez(path("shape.npz"), x=np.zeros((n - 1, 3)), v=np.zeros((n - 1, 3)), t=0.0, step=0,
             unfold_checked=False, resolution="coarse")

    sc = drape_scene(n=10)
    m = sc["model"]
    state = make_state(sc["x"])
    ctl = Controls.empty(m.n_particles)
    p = Params.film_defaults()
    rows = []

    def api(label, fn):
        rows.append((label, *_api(fn)))

    def cli(label, argv):
        rows.append((label, *_cli(argv)))

    for name, value in (("youngs_modulus", -315e6), ("friction", -0.35), ("poisson", 0.7),
                        ("thickness", 0.0), ("barrier_stiffness", -1000.0)):
        api(f"`advance` with {name} = {value:g}",
            lambda: advance(m, p._replace(**{name: jnp.asarray(value)}), state, ctl, 1 / 240))
    for dt in (-1 / 240, 0.0):
        api(f"`advance` with dt = {dt:g}", lambda: advance(m, p, state, ctl, dt))
    cli("`ipcjax bag --until -1`", ["bag", "--until", "-1", "--out", path("bag")])
    cli("`ipcjax drape --steps 0`", ["drape", "--steps", "0", "--out", path("drape")])
    cli("`ipcjax drape --out /proc/x`", ["drape", "--out", "/proc/x"])
    cli("`ipcjax fit --targets` missing file", ["fit", "--targets", path("missing.json"), "--out", path("fit")])
    cli("`ipcjax fit --targets` malformed JSON", ["fit", "--targets", path("malformed.json"), "--out", path("fit")])
    cli("`ipcjax fit --targets` a JSON list", ["fit", "--targets", path("list.json"), "--out", path("fit")])
    for label, f in (("corrupt .npz", "corrupt.npz"), ("only `x`", "only_x.npz"), ("wrongly shaped `x`", "shape.npz")):
        cli(f"`ipcjax bag --resume` {label}",
            ["bag", "--resolution", "coarse", "--resume", path(f), "--out", path("bag")])
    if not args.skip_rollout:
        def too_small():
            import jax
            roll = make_rollout(m, Config(), initial_capacity(m.topology)._replace(sf=8), max_regrow=0)
            steps = stack_controls([ctl] * 10)
            x0 = jnp.asarray(sc["x"])
            jax.grad(lambda q: roll(q, x0, jnp.zeros_like(x0), steps, 1 / 240)[0][-1, :, 2].mean())(p)
        api("README gradient example, capacity forced too small (`max_regrow=0`)", too_small)

    print("| input | what the user gets | s |")
    print("|---|---|---:|")
    for label, msg, secs in rows:
        print(f"| {label} | {msg.replace('|', '¦')} | {secs:.2f} |")


if __name__ == "__main__":
    main()
