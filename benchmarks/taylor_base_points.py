"""The slow contact rollouts' Taylor test at base points beside the test's own (#30, #34).

    python3 benchmarks/taylor_base_points.py [--case "vertex-triangle press"] [--scales 1.0,0.97,1.03]

``tests/test_implicit.py::test_rollout_gradients_with_contact_pass_the_taylor_test`` checks
the gradient of a 3-step contact rollout in E by the Taylor remainder at the default E.
This takes the test's own loss (``contact_rollout_loss``) and Taylor call (tests/helpers.py)
and runs them with E scaled by each of ``--scales``, printing each verdict: where the
default fails and the points beside it pass, the default lies near a kink of the rollout
rather than the gradient being wrong (docs/differentiation.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="vertex-triangle press")
    ap.add_argument("--scales", default="1.0,0.97,1.03")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)  # as tests/conftest.py sets it
    import jax.numpy as jnp
    import numpy as np

    from ipcjax.model import Params
    from tests.helpers import taylor_test
    from tests.test_implicit import contact_rollout_loss

    loss = contact_rollout_loss(args.case)  # the test's own rollout, weights and loss

    out = dict(command="python3 benchmarks/taylor_base_points.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               case=args.case, points=[])
    for scale in (float(a) for a in args.scales.split(",")):
        p0 = Params.film_defaults()
        base = float(p0.youngs_modulus) * scale
        p0 = p0._replace(youngs_modulus=jnp.asarray(base))
        (val, codes), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(p0)
        f = lambda s: loss(p0._replace(youngs_modulus=jnp.asarray(base * (1 + s))))[0]
        try:
            verdict = "pass: " + str(taylor_test(f, float(g.youngs_modulus) * base, 0.3, n=16, f0=float(val), rtol=3e-3))
        except AssertionError as e:
            verdict = "fail: " + str(e).splitlines()[0]
        out["points"].append(dict(e_scale=scale, codes_ok=bool(np.all(np.asarray(codes) == 0)), verdict=verdict))
        print(f"E x {scale}: {verdict}", file=sys.stderr)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
