"""``ipcjax bag``: its flags to :class:`scenes.bag_run.BagRunOptions`, then the run.

Whatever :func:`scenes.bag_run.run_bag` can do from Python the command can do: the film's
E, μf and kθ (``--youngs-modulus``, ``--friction``, ``--bending-scale``) give
``BagRunOptions.params``, ``--perturb`` and ``--seed`` its start's velocity kick, and
summary.json records them as it does for a Python caller. ``--ensemble K`` runs K of
them in lockstep instead (:func:`scenes.bag_ensemble.run_bag_ensemble`), over several
processes with ``--coordinator HOST:PORT --processes N --process-id I``.
"""
from __future__ import annotations

import argparse

import numpy as np

from ipcjax import runfolder
from ipcjax.model import LINEAR_SOLVERS, PARAM_RANGES, Params

#: The film parameters ``ipcjax bag`` takes, flag: (Params field, help); their ranges are
#: ipcjax.model.PARAM_RANGES'.
FILM_FLAGS = {
    "--youngs-modulus": ("youngs_modulus", "film Young's modulus E, Pa (default 315e6)"),
    "--friction": ("friction", "friction coefficient μf (default 0.35)"),
    "--bending-scale": ("bending_scale", "bending stiffness scale kθ (default 1)"),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ipcjax bag", description=(
        "The bag experiment (docs/spec.md §5): lower a 30 µm pouch bag into a bin, drop seven spheres, carry "
        "the bag to the floor, unfold, gather, cinch, tie and release. Writes trajectory.npz, "
        "state.npz (for --resume) and summary.json (measurements and self-intersection audit) to --out."))
    ap.add_argument("--protocol", choices=["full", "short"], default="full", help="full: end 10.50 s; short: the "
                    "earlier protocol, released at 7.35 s, end 8.45 s (docs/spec.md §5)")
    ap.add_argument("--until", type=float, help="simulated end time in s (default: the protocol's end)")
    ap.add_argument("--save-every", type=int, default=1, help="save every n-th step's frame (default 1)")
    ap.add_argument("--resolution", choices=["full", "coarse"], default="full", help="full: 481 vertices; coarse: 85")
    ap.add_argument("--out", default="runs/bag", help="run folder (default runs/bag)")
    ap.add_argument("--resume", help="state .npz written by an earlier run (its state.npz)")
    ap.add_argument("--checkpoint-every", type=int, default=120, help="rewrite trajectory.npz, state.npz every n steps")
    ap.add_argument("--mesh-every", type=int, default=24, help="every n-th saved frame as .vtu/.obj in meshes/ (0: none)")
    ap.add_argument("--no-pictures", action="store_true", help="skip the time-series plot and the phase snapshots")
    ap.add_argument("--linear-solver", choices=list(LINEAR_SOLVERS), default="sparse", help="Newton linear solve")
    for flag, (_, what) in FILM_FLAGS.items():
        ap.add_argument(flag, type=float, help=what)
    ap.add_argument("--perturb", type=float, default=0.0, help="rms speed, m/s, of a seeded smooth velocity kick of "
                    "the film at the start, for ensembles of runs whose pleats differ (scenes/perturb.py; default 0)")
    ap.add_argument("--seed", type=int, help="the kick's seed (default 0); only with --perturb")
    ap.add_argument("--ensemble", type=int, metavar="K", help="run K bags in lockstep as one batched program "
                    "(scenes/bag_ensemble.py): member 0 unkicked, member j kicked with --perturb V and seed S+j; "
                    "needs --linear-solver dense or cg; writes member<j>/ folders, no meshes, pictures or checkpoints")
    ap.add_argument("--coordinator", metavar="HOST:PORT", help="with --ensemble: join the processes of one "
                    "ensemble with jax.distributed; process 0 listens at HOST:PORT, writes --out and audits")
    ap.add_argument("--processes", type=int, metavar="N", help="with --coordinator: how many processes")
    ap.add_argument("--process-id", type=int, metavar="I", help="with --coordinator: this process's index, 0 … N − 1")
    return ap


def join_processes(args: argparse.Namespace, check) -> None:
    """``--coordinator``, ``--processes`` and ``--process-id``: all three or none, only with
    ``--ensemble``; then ``jax.distributed.initialize`` before any device is touched."""
    flags = (args.coordinator, args.processes, args.process_id)
    if all(f is None for f in flags):
        return
    check(all(f is not None for f in flags), "--coordinator, --processes and --process-id go together; give all three")
    check(args.ensemble is not None, "--coordinator joins the processes of one --ensemble K run; give --ensemble")
    check(args.processes >= 2, f"--processes must be ≥ 2; got {args.processes}")
    check(0 <= args.process_id < args.processes,
          f"--process-id must be in 0 … {args.processes - 1}; got {args.process_id}")
    import jax

    jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id)


def film_params(args: argparse.Namespace, check) -> Params | None:
    """The film's Params from the film flags given, the rest at the film defaults; None when
    none is given. A value that is not finite or out of its range (PARAM_RANGES) is refused,
    naming its flag."""
    given = {}
    for flag, (field, _) in FILM_FLAGS.items():
        value = getattr(args, field)
        if value is not None:
            in_range, what = PARAM_RANGES[field]
            check(bool(np.isfinite(value) and in_range(value)), f"{flag} must be a finite number {what}; got {value}")
            given[field] = value
    return Params.film_defaults(**given) if given else None


def run(argv, check, positive) -> int:
    """Parse, check (``check(ok, message)``, ``positive(flag, value)``: jobs.cli's refusals),
    run the bag and print its summary; status 1 when the run failed or a frame intersects."""
    ap = parser()
    args = ap.parse_args(argv)
    positive("--until", args.until)
    check(args.save_every >= 1, f"--save-every must be ≥ 1; got {args.save_every}")
    check(args.checkpoint_every >= 1, f"--checkpoint-every must be ≥ 1; got {args.checkpoint_every}")
    check(args.mesh_every >= 0, f"--mesh-every must be ≥ 0; got {args.mesh_every}")
    check(bool(np.isfinite(args.perturb) and args.perturb >= 0), f"--perturb must be a finite speed ≥ 0 m/s; got "
                                                                   f"{args.perturb}")
    check(args.seed is None or args.perturb > 0, "--seed chooses the kick of --perturb V > 0; without one it "
                                                 "would change nothing")
    args.seed = 0 if args.seed is None else args.seed
    join_processes(args, check)   # before anything touches a device (Params are device arrays)
    params = film_params(args, check)
    from scenes.bag_run import BagRunOptions, run_bag

    film = tuple(field for field, _ in FILM_FLAGS.values())
    options = {k: v for k, v in vars(args).items()
               if k not in ("no_pictures", "ensemble", "coordinator", "processes", "process_id") and k not in film}
    options = BagRunOptions(**options, pictures=not args.no_pictures, params=params)
    if args.ensemble is not None:
        from scenes.bag_ensemble import check_ensemble_options, run_bag_ensemble

        unused = [f"--{name.replace('_', '-')}" for name in ("checkpoint_every", "mesh_every", "no_pictures")
                  if getattr(args, name) != ap.get_default(name)]
        check(not unused, f"--ensemble writes no checkpoints, meshes or pictures; drop {', '.join(unused)}")
        check_ensemble_options(options, args.ensemble, None)  # a ValueError: jobs.cli exits 2 with its message
        result = run_bag_ensemble(options, args.ensemble)
    else:
        result = run_bag(options)
    print(runfolder.dumps(result.summary))
    return 0 if result.ok else 1
