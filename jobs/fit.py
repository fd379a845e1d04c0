"""``ipcjax fit``: one parser per fit job, each job's flags to its typed options, then the job.

``ipcjax fit`` is four jobs, told apart by ``--scene`` and ``--window`` (:data:`FIT_JOBS`):

* ``--scene pouch`` (the default): :func:`fitting.rollout_fit.fit_pouch`;
* ``--scene bag`` without ``--window``, the rest-shape fit: :func:`fitting.bag_rest_fit.fit_bag_rest`;
* ``--scene bag --window K``: :func:`fitting.rollout_fit.fit_bag_state`;
* ``--scene cantilever``: :func:`fitting.rollout_fit.fit_cantilever`.

Each job lists only the flags it uses, with its own defaults and ``--param`` choices, and
gets a parser of its own (:func:`parser`; ``ipcjax fit [--scene S [--window K]] --help``
lists them). :func:`parse` picks the job (:func:`pick`), writes out abbreviated flags
against every job's flags at once, as the single parser of before read them, and parses
with that job's parser; a flag of another job is argparse's usage error naming the flag
and the jobs that take it, a flag no job knows its "unrecognized arguments". So no flag of
one job reaches another, and the job functions here check only values (``--param`` with
``--pair``, ``--synthetic`` with targets, the targets themselves, ``--model-scatter``),
build the options (:class:`fitting.bag_rest_fit.BagFitOptions`,
:class:`fitting.rollout_fit.ShapeFitOptions`) and the targets, call the job, and print its
record. The jobs themselves take those typed options, never an ``argparse.Namespace``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, NamedTuple

import numpy as np

from fitting import bag_rest_fit, rollout_fit
from fitting.bag_rest import SPEC_TARGETS
from fitting.bag_rest_fit import BagFitOptions
from fitting.rest_derivative import BAG_NAMES
from fitting.rollout_fit import POUCH_PARAMS, ShapeFitOptions
from fitting.smoothing import DEFAULT_STEP
from fitting.targets import TARGET_FLAGS, FlagError, check_window_flags, targets_from
from ipcjax import runfolder
from scenes.perturb import ENSEMBLE_KICK

SCENES = ("pouch", "bag", "cantilever")
CANTILEVER_PARAMS = ("bending_scale", "youngs_modulus", "thickness")  # no contact: no friction


def three_mm(text, error, flag="--model-scatter"):
    """``flag X,Y,F`` (mm) as a tuple, None when not given; ``error`` on bad text."""
    if text is None:
        return None
    try:
        v = tuple(float(t) for t in text.split(","))
    except ValueError:
        v = ()
    if len(v) != 3 or not all(np.isfinite(x) and x > 0 for x in v):
        error(f"{flag} takes three values > 0 in mm (neck x, neck y, flap), e.g. 1.62,3.56,1.10; got {text!r}")
    return v


def _targets(args):
    """The measured targets from ``--targets`` or the target flags (FlagError on a mistake)."""
    return targets_from(args.targets, (args.neck_x, args.neck_y, args.flap),
                        (args.neck_x_mm, args.neck_y_mm, args.flap_mm))


def bag_rest_job(args, error) -> int:
    """``ipcjax fit --scene bag`` without --window, from its parsed flags: the rest-shape
    fit (:func:`fitting.bag_rest_fit.fit_bag_rest`); ``error`` reports a usage error
    (argparse's). Returns the exit status: 0 with a fitted value, 1 when the fit failed or
    the answer lies outside the model's reach (both said on stderr and in fit.json)."""
    if args.pair and args.param:
        error("give --param or --pair, not both")
    if args.perturb is not None and args.runs_per_node == 1:
        error("--perturb kicks the runs 1 … K − 1 of --runs-per-node K; with one run per node there is none to kick")
    names = tuple(args.pair.split(",")) if args.pair else (args.param or "youngs_modulus",)
    try:
        targets = _targets(args)
    except FlagError as e:
        error(str(e))
    if args.synthetic and targets is not None:
        error("--synthetic makes the targets; leave out --targets, --neck-x, --neck-y and --flap")
    if targets is None and not args.synthetic:
        targets = SPEC_TARGETS
    options = BagFitOptions(names=names, start=args.state, start_value=args.start, start_factor=args.start_factor,
                            iterations=args.iterations, step=args.lattice_step, noise_mm=args.noise,
                            model_scatter_mm=three_mm(args.model_scatter, error),
                            bag_scatter_mm=three_mm(args.bag_scatter, error, "--bag-scatter"), workers=args.workers,
                            progress=not args.quiet, runs_per_node=args.runs_per_node,
                            perturb=ENSEMBLE_KICK if args.perturb is None else args.perturb)
    options.check()
    record = bag_rest_fit.fit_bag_rest(args.out, targets, options)
    print(runfolder.dumps({k: v for k, v in record.items() if k not in ("iterates", "synthetic_evaluation")}))
    # misfit and history_bias: said, and the fitted value kept (status 0)
    for what in ("failed", "outside_reach", "misfit", "history_bias"):
        if record[what]:
            print(f"fit: {record[what]}", file=sys.stderr)
    return 0 if record["fitted"] is not None else 1


def shape_fit_job(args, error) -> int:
    """``ipcjax fit`` for the pouch and for ``--scene bag --window K``, from its parsed flags
    (``error`` reports a usage error, argparse's). Returns the exit status: 1 when a fit or
    the window's reference run failed."""
    options = ShapeFitOptions(param=args.param, joint=args.joint, start=args.start, start_factor=args.start_factor,
                              iterations=args.iterations, progress=not args.quiet)
    options.groups()
    try:
        targets = _targets(args)
        if args.scene == "bag":
            check_window_flags(args.state, args.window)
    except FlagError as e:
        error(str(e))
    if args.scene == "pouch":
        summary = rollout_fit.fit_pouch(args.out, targets, options)
    else:
        summary = rollout_fit.fit_bag_state(args.out, args.state, args.window, targets, options)
        if summary is None:  # the reference run of the window failed (said on stderr)
            return 1
    print(runfolder.dumps(summary))
    return 1 if any("failed" in f for f in summary["fits"]) else 0


def cantilever_job(args, error) -> int:
    """``ipcjax fit --scene cantilever``, from its parsed flags: one parameter from a clamped
    film's tip height (:func:`fitting.rollout_fit.fit_cantilever`)."""
    print(runfolder.dumps(rollout_fit.fit_cantilever(
        args.out, args.param, target=args.target, start=args.start, steps=args.steps, iterations=args.iterations,
        lr=args.lr, progress=not args.quiet)))
    return 0


# --------------------------------------------------------------------------- the jobs' flags


def _scene(scene: str, window: bool = False) -> list:
    """``--scene`` (and ``--window K``) as the job's usage shows them; every parser takes
    each scene's name, as ``--scene`` given twice (the last wins) was read before."""
    if scene == "pouch":
        return [("--scene", dict(choices=SCENES, default="pouch", help="the fit job: pouch (this one, the "
                                 "default), bag or cantilever; each has its own flags (see the end)"))]
    flags = [("--scene", dict(choices=SCENES, required=True, metavar=scene, help=f"the {scene} (this job)"))]
    if window:
        flags.append(("--window", dict(type=int, required=True, metavar="K",
                                       help="differentiate K steps from --state, not the rest shape")))
    return flags


def _start(names, who: str, factor: float | None = None, **param) -> list:
    """``--param`` (``names``, and ``param``'s keywords), ``--start`` and, with a ``factor``,
    ``--start-factor``."""
    flags = [("--param", dict(choices=names, help=f"fit only this parameter ({who})", **param)),
             ("--start", dict(type=float, help="initial value of a single parameter"))]
    if factor is not None:
        flags.append(("--start-factor", dict(type=float, default=factor,
                                             help=f"otherwise start at this × the film default (default {factor:g})")))
    return flags


def _measured() -> list:
    """``--targets`` and the target flags in m and in mm (fitting.targets.targets_from)."""
    flags = [("--targets", dict(help="JSON with neck_x_m, neck_y_m, flap_m, or a summary.json"))]
    for flag, what in TARGET_FLAGS:
        flags += [(flag, dict(help=f"measured {what}, m, or a value with its unit (e.g. 38.83mm)")),
                  (flag + "-mm", dict(help=f"measured {what}, mm"))]
    return flags


def _run(iterations: int) -> list:
    """``--iterations`` (the job's default), ``--quiet`` and ``--out``."""
    return [("--iterations", dict(type=int, default=iterations, help=f"maximum iterations (default {iterations})")),
            ("--quiet", dict(action="store_true", help="no progress bars")),
            ("--out", dict(default="runs/fit", help="output folder (default runs/fit)"))]


def _cantilever_param(name: str) -> str:
    """The cantilever's ``--param``; friction is refused saying why, not as a bad choice."""
    if name == "friction":
        raise argparse.ArgumentTypeError("the cantilever has no contact: friction cannot be fitted there")
    return name


JOINT = ("--joint", dict(action="store_true", help="fit E, μf and kθ together"))
EACH = "default: E, μf and kθ each in turn"


class FitJob(NamedTuple):
    """One fit job of ``ipcjax fit``: how the command line names it, its flags, its function."""

    name: str          # the flags that choose it, as an error message names it
    what: str          # what it fits, in a few words
    args: str          # what `ipcjax fit ARGS --help` needs to list its flags
    description: str
    flags: list        # (flag, add_argument's keywords)
    run: Callable      # (parsed flags, argparse's error) -> exit status


FIT_JOBS = {
    "pouch": FitJob("--scene pouch", "the pouch fit", "", (
        "Fit material parameters to measured shapes with optax and implicit gradients: a 30 µm film pouch around "
        "a sphere on a floor, pinched, tied and released; the measurements are its neck width (x, y) and flap "
        "height. Without targets they are simulated with the film's default parameters, and E, μf and kθ are "
        "each recovered alone from --start-factor × off (--joint: all three together). The job is "
        "fitting.rollout_fit.fit_pouch."),
        [*_scene("pouch"), *_start(POUCH_PARAMS, EACH, 2.0), JOINT, *_measured(), *_run(30)], shape_fit_job),
    "bag": FitJob("--scene bag without --window", "the rest-shape fit", "--scene bag", (
        "Fit E, μf or kθ (--param), or two of them (--pair), to the 481-vertex bag's rest shape, smoothed over "
        "runs from the tie checkpoint (--state) to 10.50 s on a lattice in the parameters, against the "
        "specification's measured bag (or --synthetic). The job is fitting.bag_rest_fit.fit_bag_rest."),
        [*_scene("bag"),
         ("--state", dict(help="state.npz to start from (default scenes/data/bag_full_tie.npz)")),
         ("--pair", dict(help="fit two parameters, e.g. youngs_modulus,friction")),
         ("--synthetic", dict(action="store_true", help="targets from the film defaults' bag")),
         ("--lattice-step", dict(type=float, default=DEFAULT_STEP,
                                 help="smoothing lattice step in log-parameters (default 2 ln 2 / 7)")),
         ("--noise", dict(type=float, default=0.5, help="noise of the 1σ interval, mm (default 0.5)")),
         ("--model-scatter", dict(help="one run's scatter X,Y,F, mm (default 1.62,3.56,1.10, the E sweep's)")),
         ("--bag-scatter", dict(help="one measured bag's own scatter X,Y,F, mm (default: whole-history bags', "
                                     "fitting.uncertainty.BAG_SCATTER_MM)")),
         ("--workers", dict(type=int, help="node processes (default: the cores)")),
         ("--runs-per-node", dict(type=int, default=1, help="K: each lattice node the mean of K runs, the unperturbed "
                                  "one and K − 1 with the film's start velocities kicked (default 1)")),
         ("--perturb", dict(type=float, help="rms m/s of that kick (scenes/perturb.py; "
                            f"default {ENSEMBLE_KICK:g}); only with --runs-per-node K > 1")),
         *_start(BAG_NAMES, "default youngs_modulus", 1.0), *_measured(), *_run(30)], bag_rest_job),
    "window": FitJob("--scene bag --window K", "the bag window fit", "--scene bag --window K", (
        "Fit E, μf and kθ, each alone (--param: one) or together (--joint), to the bag's neck width and flap "
        "height after K steps from a state written by `ipcjax bag` (--state), differentiating the K steps. "
        "The job is fitting.rollout_fit.fit_bag_state."),
        [*_scene("bag", window=True), ("--state", dict(help="state.npz written by `ipcjax bag` (needed)")),
         *_start(POUCH_PARAMS, EACH, 2.0), JOINT, *_measured(), *_run(30)], shape_fit_job),
    "cantilever": FitJob("--scene cantilever", "the cantilever fit", "--scene cantilever", (
        "Fit one parameter of a clamped film to its tip height after --steps steps, with adam. The job is "
        "fitting.rollout_fit.fit_cantilever."),
        [*_scene("cantilever"),
         ("--target", dict(type=float, help="measured tip height in m (default: simulated at the film defaults)")),
         ("--steps", dict(type=int, default=6, help="rollout steps of 1/240 s (default 6)")),
         *_start(CANTILEVER_PARAMS, "default bending_scale", default="bending_scale", type=_cantilever_param),
         ("--lr", dict(type=float, default=0.1, help="adam learning rate on log-parameters (default 0.1)")),
         *_run(80)], cantilever_job),
}


def parser(job: str) -> argparse.ArgumentParser:
    """The parser of one fit job (a key of :data:`FIT_JOBS`), with its flags only; the
    abbreviations are written out by :func:`pick` before it parses."""
    fj = FIT_JOBS[job]
    others = "; ".join(" ".join(filter(None, ("ipcjax fit", o.args, "--help"))) + f" ({o.what})"
                       for o in FIT_JOBS.values() if o is not fj)
    ap = argparse.ArgumentParser(prog="ipcjax fit", allow_abbrev=False, description=fj.description,
                                 epilog=f"The other fit jobs take flags of their own: {others}.")
    for flag, kw in fj.flags:
        ap.add_argument(flag, **kw)
    return ap


def pick(argv) -> tuple[str, list]:
    """Which fit job ``argv`` asks for (pouch, bag: the rest shape, window: ``--scene bag
    --window K``, cantilever), and ``argv`` with each abbreviated flag (``--quie``) written
    out against every job's flags at once, as the one parser of before read them; a usage
    error for an abbreviation that could be several flags or a scene that is none."""
    pre = argparse.ArgumentParser(prog="ipcjax fit", add_help=False, allow_abbrev=False,
                                  usage="ipcjax fit [--scene {pouch,bag,cantilever} [--window K]] [-h] ...")
    pre.add_argument("--scene", choices=SCENES, default="pouch")
    pre.add_argument("--window", nargs="?", const="")  # its value is the window job's to read
    flags = sorted({"--help", *(flag for fj in FIT_JOBS.values() for flag, _ in fj.flags)})
    written = []
    for token in argv:
        name, eq, value = token.partition("=")
        hits = [f for f in flags if f.startswith(name)] if name.startswith("--") and name not in flags else []
        if len(hits) > 1 and name != "--":
            pre.error(f"ambiguous option: {name} could match {', '.join(hits)}")
        written.append(hits[0] + eq + value if len(hits) == 1 else token)
    args, _ = pre.parse_known_args(written)
    return "window" if args.scene == "bag" and args.window is not None else args.scene, written


def _names(jobs) -> str:
    """Fit jobs (keys of FIT_JOBS) as an error names them: one with what it is, several by
    their flags alone."""
    names = [FIT_JOBS[k].name for k in jobs]
    if len(jobs) == 1:
        return f"{names[0]} ({FIT_JOBS[jobs[0]].what})"
    return ", ".join(names[:-1]) + f" and {names[-1]}"


def parse(argv):
    """``ipcjax fit ARGV`` as (job, its parsed flags, its parser's ``error``). A flag of
    another fit job is a usage error (status 2) that names it and the jobs that take it."""
    job, argv = pick(argv)
    ap = parser(job)
    args, extra = ap.parse_known_args(argv)
    strays = {}  # the other jobs that take a flag: its flags
    for flag in dict.fromkeys(t.partition("=")[0] for t in extra if t.startswith("--")):
        takers = tuple(k for k, o in FIT_JOBS.items() if k != job and flag in dict(o.flags))
        if takers:
            strays.setdefault(takers, []).append(flag)
    if strays:
        ap.error(f"{FIT_JOBS[job].name} ({FIT_JOBS[job].what}): " + "; ".join(
            f"not {', '.join(flags)}, which {'is' if len(flags) == 1 else 'are'} only for {_names(takers)}"
            for takers, flags in strays.items()))
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    return job, args, ap.error


def run(argv) -> int:
    """``ipcjax fit ARGV``: parse, check, run the job, print its record; the exit status."""
    job, args, error = parse(argv)
    return FIT_JOBS[job].run(args, error)
