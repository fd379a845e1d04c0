"""The FP32 gap recheck on the Newton solve's last candidate set (ipcjax.step.recheck_rounded
with ``contacts``): the same smallest gap as a fresh query at the stored positions, step
after step while the film comes into contact, and still no step that loses its gap."""
import jax
import jax.numpy as jnp
import numpy as np

from ipcjax import candidates as C
from ipcjax.model import Config, Controls, Params
from ipcjax.step import make_state, recheck_rounded, step
from scenes.film import vertex_triangle_scene

DT = 1.0 / 240.0


def test_recheck_on_the_solve_contacts_equals_a_fresh_query():
    sc = vertex_triangle_scene()
    m, cfg, p = sc.model, Config(), Params.film_defaults()
    cap = C.initial_capacity(m.topology)
    ctl = Controls.empty(m.n_particles)
    st = make_state(sc.x, sc.v)
    recheck = jax.jit(lambda x: recheck_rounded(m, x, cfg, cap))  # one program, not hundreds op by op
    inside = 0
    for _ in range(12):
        st, info = step(m, p, st, ctl, DT, config=cfg, capacity=cap)
        assert int(info.code) == 0
        fresh, stats = recheck(jnp.asarray(st.x))
        assert not bool(stats.overflow)
        g = float(info.min_gap)
        assert g > 0
        if float(fresh) <= cfg.dhat:
            inside += 1
            assert g == float(fresh)  # the same stencil's gap, bit for bit
        else:
            assert g > cfg.dhat  # above d̂: the smallest of what each set holds
    assert inside >= 3  # the vertex reached d̂ and stayed there
    assert np.all(np.isfinite(np.asarray(st.x)))
