"""Command line: ``ipcjax drape | bag | fit | compare | verlet`` (also ``python3 -m jobs.cli``).

Only argument parsing and checking: each job is a library function (``scenes.drape_run``,
``scenes.bag_run``, ``fitting.rollout_fit``, ``fitting.bag_rest_fit``, ``jobs.compare``,
``baselines.verlet``), imported lazily. ``ipcjax bag``'s parser and options are in
:mod:`jobs.bag`; ``ipcjax fit``'s four jobs (the pouch, the bag's rest shape, a bag window,
the cantilever), each with a parser of its own flags only, and their options are in
:mod:`jobs.fit`. jobs/ is the top layer, the one that imports scenes/, fitting/ and
baselines/ all.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from ipcjax import compilation_cache, runfolder, xla_threads
from ipcjax.model import LINEAR_SOLVERS


def _check(ok: bool, message: str) -> None:
    """Refuse a bad input: ``main`` prints ``message`` as one line and exits 2."""
    if not ok:
        raise ValueError(message)


def _positive(flag: str, value: float | None) -> None:
    """Refuse a value that is not finite and > 0; None (a flag left at its default) passes."""
    _check(value is None or (np.isfinite(value) and value > 0), f"{flag} must be a finite number > 0; got {value}")


def _drape(argv):
    ap = argparse.ArgumentParser(prog="ipcjax drape", description=(
        "Drape a 30 µm film over a fixed sphere with friction and audit every frame for "
        "self-intersection. Writes trajectory.npz, summary.json, snapshots/ (first and last frames, PNG) and "
        "meshes/ (.vtu with frame.pvd for ParaView, .obj for Blender) to --out, and prints where."))
    ap.add_argument("--resolution", type=int, default=10, help="film vertices per side (default 10)")
    ap.add_argument("--steps", type=int, default=60, help="timesteps of 1/240 s (default 60)")
    ap.add_argument("--size", type=float, default=0.08, help="film side length in m (default 0.08)")
    ap.add_argument("--radius", type=float, default=0.02, help="sphere radius in m (default 0.02)")
    ap.add_argument("--membrane", choices=["neo_hookean", "stvk"], default="neo_hookean")
    ap.add_argument("--bending", choices=["hinge", "discrete_shell"], default="hinge")
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="dense", help="Newton linear solve")
    ap.add_argument("--mesh-every", type=int, default=1, help="every n-th frame as .vtu/.obj in meshes/ (0: none)")
    ap.add_argument("--out", default="runs/drape", help="output folder (default runs/drape)")
    args = ap.parse_args(argv)
    _check(args.steps >= 1, f"--steps must be ≥ 1; got {args.steps}")
    _check(args.mesh_every >= 0, f"--mesh-every must be ≥ 0; got {args.mesh_every}")
    _check(args.resolution >= 2, f"--resolution must be ≥ 2 vertices per side; got {args.resolution}")
    _positive("--size", args.size)
    _positive("--radius", args.radius)
    runfolder.prepare(args.out)
    from scenes.drape_run import DrapeRunOptions, run_drape, where
    summary, ok = run_drape(DrapeRunOptions(**vars(args)))
    print(runfolder.dumps(summary) + "\n" + where(args.out, summary["outputs"]))
    return 0 if ok else 1


def _bag(argv):
    from jobs import bag  # its flags and options: jobs/bag.py

    return bag.run(argv, _check, _positive)


def _fit(argv):
    from jobs import fit  # one parser per fit job, their options and the jobs: jobs/fit.py

    return fit.run(argv)


def _compare(argv):
    ap = argparse.ArgumentParser(prog="ipcjax compare", description=(
        "The bag on ipcjax IPC and Newton VBD side by side at the same instant: neck width, flap height, "
        "self-intersecting frames, sphere height range, minimum distances and wall time per simulated second, "
        "measured and audited by the same code. Reuses two run folders (--ipc, --vbd) or runs both (--run; VBD "
        "needs pip install -e '.[newton]'). Writes comparison.md, comparison.json and comparison.png to --out."))
    ap.add_argument("--ipc", default=None, help="run folder of `ipcjax bag`")
    ap.add_argument("--vbd", default=None, help="run folder of `python -m baselines.vbd_bag`")
    ap.add_argument("--run", action="store_true", help="run both now (into --out/ipc and --out/vbd)")
    ap.add_argument("--protocol", choices=["full", "short"], help="with --run: both solvers run it to its end, full "
                    "resolution by default (without it: a 0.5 s coarse smoke run)")
    ap.add_argument("--resolution", choices=["full", "coarse"], help="with --run (default coarse)")
    ap.add_argument("--until", type=float, help="with --run: simulated end time, s (default 0.5)")
    ap.add_argument("--at", type=float, default=None, help="compare at this instant, s (default: the last both reached)")
    ap.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="sparse", help="with --run: IPC's solve")
    args = ap.parse_args(argv)
    if args.run == bool(args.ipc or args.vbd) or (not args.run and not (args.ipc and args.vbd)):
        ap.error("give either --run or both --ipc and --vbd")
    _check(args.protocol is None or args.run,
           "--protocol chooses what --run runs; the protocol of --ipc/--vbd folders is in their summary.json")
    _positive("--until", args.until)
    _check(args.at is None or (np.isfinite(args.at) and args.at >= 0),
           f"--at must be a finite time ≥ 0 s; got {args.at}")
    for flag, folder in (("--ipc", args.ipc), ("--vbd", args.vbd)):
        _check(folder is None or os.path.isdir(folder), f"{flag} {folder}: no such folder")
    runfolder.prepare(args.out)
    from jobs.compare import compare_job, run_options
    run = run_options(args.protocol, args.resolution, args.until, args.linear_solver) if args.run else None
    data = compare_job(args.out, ipc=args.ipc, vbd=args.vbd, at=args.at, run=run)  # errors: see main
    print("\n".join([data["table"], *data["notes"],
                     f"wrote {os.path.join(args.out, 'comparison.md')}, comparison.json, comparison.png"]))
    return 0


def _verlet(argv):
    from baselines import verlet as V
    ap = argparse.ArgumentParser(prog="ipcjax verlet", description=(
        "Verlet mass-spring cloth (docs/spec.md §8, docs/verlet.md): simulate and export a mesh sequence."))
    ap.add_argument("--n-grid", type=int, default=14, help="grid side n (n×n particles) [14]")
    ap.add_argument("--size", type=float, default=4.0, help="cloth side; it starts at y = size/2 [4.0]")
    ap.add_argument("--steps", type=int, default=300, help="timesteps [300]")
    ap.add_argument("--save-every", type=int, default=10, help="save a frame every this many steps [10]")
    ap.add_argument("--out", default="runs/verlet", help="folder for the mesh sequence [runs/verlet]")
    ap.add_argument("--format", choices=("vtu", "obj"), default="vtu", help="mesh file format [vtu]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial N(0, noise²) perturbation [0]")
    ap.add_argument("--noise", type=float, default=0.01, help="perturbation std [0.01]")
    ap.add_argument("--iterations", type=int, default=12, help="relaxation sweeps per step [12]")
    for name, default in V.VerletParams()._asdict().items():
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=default,
                        help=f"{V.PARAM_HELP[name]} [{default:.5g}]")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.save_every < 1 or args.n_grid < 2 or args.iterations < 0:
        ap.error("need --steps >= 1, --save-every >= 1, --n-grid >= 2 and --iterations >= 0")
    cloth, state = V.cloth_grid(args.n_grid, args.size, iterations=args.iterations, seed=args.seed, noise=args.noise)
    params = V.VerletParams(**{k: getattr(args, k) for k in V.VerletParams._fields})
    return V.run_cloth(args.out, cloth, state, params, steps=args.steps, save_every=args.save_every, fmt=args.format)


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line; an OSError from the system names its file."""
    system = isinstance(e, OSError) and e.filename is not None and e.strerror
    return " ".join((f"{e.filename}: {e.strerror}" if system else str(e) or type(e).__name__).split())


JOBS = {  # job: (its function, what it does, an example), as `ipcjax --help` lists them
    "drape": (_drape, "drape a 30 µm film over a sphere; trajectory, snapshots, meshes", "ipcjax drape --steps 120"),
    "bag": (_bag, "the bag experiment: fill, carry, unfold, cinch, tie, release", "ipcjax bag --resolution coarse"),
    "fit": (_fit, "fit E, μf, kθ to a measured neck width and flap height (a pouch; --scene bag: the bag)",
            "ipcjax fit --scene bag --neck-x-mm 38.83 --neck-y-mm 37.20 --flap-mm 18.43"),
    "compare": (_compare, "the bag on IPC and Newton VBD side by side", "ipcjax compare --run --until 0.5"),
    "verlet": (_verlet, "the Verlet mass-spring cloth baseline, as a mesh sequence", "ipcjax verlet --steps 100"),
}
USAGE = "usage: ipcjax JOB [options]   (ipcjax JOB --help: that job's options)\n\njobs:\n" + "\n".join(
    f"  {job:<8} {what}\n  {'':<8}   e.g. {example}" for job, (_, what, example) in JOBS.items())


def main(argv=None) -> int:
    """Run ``ipcjax JOB [options]`` and return its exit status (``ipcjax --help`` lists the jobs).

    Each job checks its flags, input files and output folder before it simulates or
    compiles anything. A mistake in the inputs (a ValueError, TypeError or OSError: a flag
    out of range, a missing or corrupt file, an unwritable ``--out``) ends as one line on
    stderr, ``ipcjax JOB: error: MESSAGE``, with status 2, as argparse's own errors do; a
    step that fails (:class:`ipcjax.step.StepFailed`) ends as ``ipcjax JOB: failed: MESSAGE``
    with status 1. Set ``IPCJAX_TRACEBACK=1`` to get the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in JOBS:  # --help: the jobs on stdout; no job or an unknown one: an error
        asked = argv[0] in ("-h", "--help") if argv else False
        error = "" if asked or not argv else f"ipcjax: error: no job {argv[0]!r}; choose one of {', '.join(JOBS)}\n\n"
        print(error + USAGE, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    job = argv[0]
    try:
        xla_threads.single_threaded_xla()  # ipcjax/xla_threads.py: before JAX starts its backend
        compilation_cache.enable_compilation_cache()  # ipcjax/compilation_cache.py
        return int(JOBS[job][0](argv[1:]) or 0)
    except (ValueError, TypeError, OSError) as e:
        if os.environ.get("IPCJAX_TRACEBACK"):
            raise
        print(f"ipcjax {job}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from ipcjax.step import StepFailed

        if not isinstance(e, StepFailed) or os.environ.get("IPCJAX_TRACEBACK"):
            raise
        print(f"ipcjax {job}: failed: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
