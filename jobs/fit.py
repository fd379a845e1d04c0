"""``ipcjax fit``'s parsed flags to the typed fit jobs of :mod:`fitting.rollout_fit` and
:mod:`fitting.bag_rest_fit`.

The command line (:mod:`jobs.cli`) parses the flags; the functions here refuse the
combinations that mean nothing (a usage error through argparse's ``error``), build the
options (:class:`fitting.bag_rest_fit.BagFitOptions`,
:class:`fitting.rollout_fit.ShapeFitOptions`) and the targets, call the job, and print its
record. The jobs themselves take those typed options, never an ``argparse.Namespace``.
"""
from __future__ import annotations

import sys

import numpy as np

from fitting import bag_rest_fit, rollout_fit
from fitting.bag_rest import SPEC_TARGETS
from fitting.bag_rest_fit import BagFitOptions
from fitting.rollout_fit import ShapeFitOptions
from fitting.smoothing import DEFAULT_STEP
from fitting.targets import FlagError, check_window_flags, targets_from
from ipcjax import runfolder


def three_mm(text, error):
    """``--model-scatter X,Y,F`` (mm) as a tuple, None when not given; ``error`` on bad text."""
    if text is None:
        return None
    try:
        v = tuple(float(t) for t in text.split(","))
    except ValueError:
        v = ()
    if len(v) != 3 or not all(np.isfinite(x) and x > 0 for x in v):
        error(f"--model-scatter takes three values > 0 in mm (neck x, neck y, flap), e.g. 1.62,3.56,1.10; got {text!r}")
    return v


def bag_rest_job(args, error) -> int:
    """``ipcjax fit --scene bag`` without --window, from its parsed flags: the rest-shape
    fit (:func:`fitting.bag_rest_fit.fit_bag_rest`); ``error`` reports a usage error
    (argparse's). Returns the exit status: 0 with a fitted value, 1 when the fit failed or
    the answer lies outside the model's reach (both said on stderr and in fit.json)."""
    if args.joint:
        error("--scene bag fits one parameter (--param) or two (--pair), not --joint")
    if args.pair and args.param:
        error("give --param or --pair, not both")
    names = tuple(args.pair.split(",")) if args.pair else (args.param or "youngs_modulus",)
    try:
        targets = targets_from(args.targets, (args.neck_x, args.neck_y, args.flap),
                               (args.neck_x_mm, args.neck_y_mm, args.flap_mm))
    except FlagError as e:
        error(str(e))
    if args.synthetic and targets is not None:
        error("--synthetic makes the targets; leave out --targets, --neck-x, --neck-y and --flap")
    if targets is None and not args.synthetic:
        targets = SPEC_TARGETS
    options = BagFitOptions(names=names, start=args.state, start_value=args.start,
                            start_factor=1.0 if args.start_factor is None else args.start_factor,
                            iterations=30 if args.iterations is None else args.iterations,
                            step=DEFAULT_STEP if args.lattice_step is None else args.lattice_step,
                            noise_mm=args.noise, model_scatter_mm=three_mm(args.model_scatter, error),
                            workers=args.workers, progress=not args.quiet)
    options.check()
    record = bag_rest_fit.fit_bag_rest(args.out, targets, options)
    print(runfolder.dumps({k: v for k, v in record.items() if k not in ("iterates", "synthetic_evaluation")}))
    for what in ("failed", "outside_reach"):
        if record[what]:
            print(f"fit: {record[what]}", file=sys.stderr)
    return 0 if record["fitted"] is not None else 1


def shape_fit_job(args, error) -> int:
    """``ipcjax fit`` for the pouch and for ``--scene bag --window K``, from its parsed flags
    (``error`` reports a usage error, argparse's). The rest-shape fit's own flags are
    refused here, not ignored. Returns the exit status: 1 when a fit or the window's
    reference run failed."""
    rest_only = [f for f, v in (("--pair", args.pair), ("--synthetic", args.synthetic), ("--lattice-step", args.lattice_step),
                                ("--model-scatter", args.model_scatter), ("--workers", args.workers)) if v]
    if rest_only:
        error(f"{', '.join(rest_only)}: only for --scene bag without --window (the rest-shape fit)")
    options = ShapeFitOptions(param=args.param, joint=args.joint, start=args.start,
                              start_factor=2.0 if args.start_factor is None else args.start_factor,
                              iterations=30 if args.iterations is None else args.iterations, progress=not args.quiet)
    options.groups()
    try:
        targets = targets_from(args.targets, (args.neck_x, args.neck_y, args.flap),
                               (args.neck_x_mm, args.neck_y_mm, args.flap_mm))
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
