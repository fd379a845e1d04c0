"""The rest-state derivative of a bag run: at its final state the static balance
G(x; θ) = ∇(V + D)(x; θ) − M g − f = 0, and dy/dz = −(∂y/∂x) H⁻¹ ∂G/∂z by the implicit
function theorem (the method: fitting/bag_rest.py's docstring, item 3)."""
from __future__ import annotations

from fitting.fit import from_z

#: The parameters the bag fit can fit (log-parameters z).
BAG_NAMES = ("youngs_modulus", "friction", "bending_scale")
#: Parameters the rest-state derivative cannot see (it holds the friction anchors: 0.003 mm
#: per unit log μf at the film defaults); estimator "rest" takes the spline's derivative for them.
PATH_ONLY = ("friction",)


def rest_problem(model, config, params, anchor, controls, *, dt, contacts, active=None):
    """The :class:`~ipcjax.problem.StepProblem` of a step that starts at rest at ``anchor``
    (friction lagged there; its rows compacted into ``active``, as in the step)."""
    import jax.numpy as jnp

    from ipcjax.problem import StepInputs
    from ipcjax.step import step_problem

    return step_problem(model, config, StepInputs(params, anchor, jnp.zeros_like(anchor), controls, dt), contacts,
                        active=active)


def rest_residual(x, problem, contacts):
    """G(x; θ) over the free DOFs (3F,), N: the step's ∇ₓΦ (``problem`` from
    :func:`rest_problem`) less its mass term M(x − anchor)/dt², i.e. ∇(V + D)(x) − M g − f
    with the friction D lagged at the anchor (the previous step's positions)."""
    from ipcjax.implicit import free_gradient

    model, ctx = problem.model, problem.context
    g = free_gradient(x, problem, contacts)
    m = model.mass[model.free_particles]
    dx = (x - ctx.x0)[model.free_particles]
    return g - (m[:, None] * dx).reshape(-1) / ctx.dt**2


def _largest_term_force(x, problem, contacts):
    """The largest force one energy term of V + D puts on one particle, N (the scale of the
    rest check: a balance of large opposing forces is judged against them, not the weight)."""
    import jax
    import jax.numpy as jnp

    from ipcjax.potential import TERMS

    free = problem.model.free_particles
    out = 0.0
    for term in TERMS:
        if term.inertial:  # V + D: the rest state has no inertia
            continue
        g = jax.grad(lambda x, term=term: term.value(x, problem, contacts))(x)[free]
        out = jnp.maximum(out, jnp.max(jnp.linalg.norm(g, axis=1)))
    return out


def make_rest_jacobian(model, config, capacity, measure, names=BAG_NAMES):
    """A jitted ``(x, v, params, controls, dt) -> (y, J, H_chol, residual, force, overflow)``
    at the final state (x, v) of a run.

    The anchor of the lagged friction is the previous step's positions x − dt·v. y =
    measure(x) (m,); J = dy/dz (m, len(names)) by the implicit function theorem on G = 0
    (module docstring), z the log of ``names``; H_chol the Cholesky factor of H (NaN where
    H is not positive definite); residual = G(x) (3F,); force = the largest force one energy
    term puts on one particle (the scale the residual is compared with); overflow: the contact query or
    the active rows overflowed ``capacity``.
    """
    import jax
    import jax.numpy as jnp

    from ipcjax.energies import PSDProjection
    from ipcjax.newton import active_size, query_contacts
    from ipcjax.potential import dense_hessian, gradient_and_blocks

    free = model.free_particles
    active = active_size(capacity)  # only stencils inside d̂, as the step's implicit VJP assembles them

    def jac(x, v, params, controls, dt):
        anchor = x - dt * v
        contacts, stats = query_contacts(x, x, model, config, capacity)
        problem = rest_problem(model, config, params, anchor, controls, dt=dt, contacts=contacts, active=active)
        _, hb = gradient_and_blocks(x, problem, contacts, projection=PSDProjection.NONE, active=active)
        H = dense_hessian(hb._replace(diag=jnp.zeros_like(hb.diag)))  # the inertia diagonal out
        L = jnp.linalg.cholesky(H)
        y = measure(x)
        A = jax.jacrev(measure)(x)[:, free, :].reshape(y.shape[0], -1)  # (m, 3F)
        U = jax.scipy.linalg.cho_solve((L, True), A.T)                   # H⁻¹ Aᵀ (3F, m)
        z0 = jnp.log(jnp.stack([getattr(params, n) for n in names]))

        def G(z):
            p = rest_problem(model, config, from_z(names, z, params), anchor, controls, dt=dt, contacts=contacts,
                             active=active)
            return rest_residual(x, p, contacts)

        residual, vjp = jax.vjp(G, z0)
        J = -jax.vmap(lambda u: vjp(u)[0])(U.T)                            # (m, k)
        force = _largest_term_force(x, problem, contacts)
        overflow = stats.overflow | (active is not None and hb.n_active > active)
        return y, J, L, residual, force, overflow

    return jax.jit(jac)
