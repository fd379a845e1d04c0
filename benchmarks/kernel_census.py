"""Where a step program's compile time goes: XLA's HLO passes against LLVM, and the LLVM
code by the Python function it came from (issue #31; docs/benchmarks.md "The step
program's compile time, by source").

A child process (so that XLA's flags and logging are set before JAX starts) lowers and
compiles the jitted ``ipcjax.step.step`` of the README's drape (10 × 10 film, the dense
solver), or with ``--program gradient`` the README's gradient (``jax.jit`` of ``jax.grad``
of the drape's 10-step rollout through the implicit VJP), under the test suite's kernel emitter (``--xla_cpu_use_fusion_emitters=false``,
tests/conftest.py; ``--xla-flags`` replaces it), with XLA's dump of every kernel's LLVM IR.
It prints:

* the compile's two phases, from XLA's own timers: HLO passes, then LLVM code generation;
* the number of kernels (fusion instructions of the optimised HLO) and of LLVM IR bytes;
* the IR bytes and kernels by the innermost Python function of each kernel's source
  (XLA keeps a stack frame per instruction), and by region (``REGIONS``: the named scope
  or function in each instruction's ``op_name``): the candidate query (``find_candidates``,
  every copy of it), in a gradient program the differentiated step's forward solve and
  the parts of its backward (XLA's source frames stop at the ``custom_vjp`` call), and
  the rest; kernels XLA adds
  itself carry no source and are named by their kind, e.g. "(no source: reduce-window)"
  for the windows of XLA's tree reduction of long reductions; and by file.

    python3 benchmarks/kernel_census.py [--program step|gradient] [--top 25] [--tree PATH] [--json out.json]

``--tree`` measures another checkout (e.g. a ``git worktree`` of an older commit) with
this script. The census is one compile; its time varies by ±10 % from run to run here, so
compare trees by alternating runs.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_FLAGS = "--xla_cpu_use_fusion_emitters=false"


#: The programs the census can take, by the name XLA gives their module.
PROGRAMS = {"step": "jit_step", "gradient": "jit_gradient"}


def child(tree: str, program: str) -> None:
    sys.path.insert(0, tree)
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    from ipcjax import capacity as C
    from ipcjax.implicit import make_rollout, stack_controls
    from ipcjax.model import Config, Controls, Params
    from ipcjax.step import make_state, step
    from scenes.film import drape_scene

    scene = drape_scene(n=10)
    m = scene.model
    if program == "step":
        cap = C.resolve_capacity(C.initial_capacity(m.topology), m.topology)
        lowered = step.lower(m, Params.film_defaults(), make_state(scene.x), Controls.empty(m.n_particles),
                             1 / 240, config=Config(), capacity=cap)
    else:  # the README's gradient: d(mean height after 10 steps)/d(parameters)
        roll = make_rollout(m, Config())
        ctl = stack_controls([Controls.empty(m.n_particles)] * 10)
        x0 = jnp.asarray(scene.x)
        roll(Params.film_defaults(), x0, jnp.zeros_like(x0), ctl, 1 / 240)  # sizes the capacity outside jit

        def gradient(p):
            return jax.grad(lambda q: roll(q, x0, jnp.zeros_like(x0), ctl, 1 / 240)[0][-1, :, 2].mean())(p)

        lowered = jax.jit(gradient).lower(Params.film_defaults())
    t0 = time.perf_counter()
    compiled = lowered.compile()
    wall = time.perf_counter() - t0
    with open(os.environ["CENSUS_HLO"], "w") as f:
        f.write(compiled.as_text())
    print(json.dumps({"compile_s": wall}))


def _table(txt: str, name: str, nxt: str | None) -> list[str]:
    start = txt.index("\n" + name + "\n") + len(name) + 2
    end = txt.index("\n" + nxt + "\n", start) if nxt else len(txt)
    return [line for line in txt[start:end].strip().splitlines()]


def _frames(txt: str):
    """stack_frame_id -> innermost 'file.py:function' of the optimised HLO's frame tables."""
    files = {int(l.split()[0]): l.split('"')[1] for l in _table(txt, "FileNames", "FunctionNames")}
    funcs = {int(l.split()[0]): l.split('"')[1] for l in _table(txt, "FunctionNames", "FileLocations")}
    locs = {int(l.split()[0]): dict(re.findall(r"(\w+)=(\d+)", l)) for l in _table(txt, "FileLocations", "StackFrames")}
    out = {}
    for line in _table(txt, "StackFrames", None):
        if not line or not line[0].isdigit():
            break
        d = dict(re.findall(r"(\w+)=(\d+)", line))
        loc = locs[int(d["file_location_id"])]
        out[int(line.split()[0])] = (f"{os.path.basename(files[int(loc['file_name_id'])])}:"
                                     f"{funcs[int(loc['function_name_id'])]}")
    return out


#: Regions by the JAX named scopes (and functions) that a kernel's op_name passes through,
#: innermost first: the implicit VJP's scopes (ipcjax/implicit.py) split what XLA's source
#: frames cannot, the forward solve of a differentiated step from its backward pass.
REGIONS = (("find_candidates", "the candidate query (find_candidates)"),
           ("solve_at_active_rows", "backward: the active-row solve"),
           ("implicit_vjp", "backward: the VJP over the step's inputs"),
           ("implicit_backward", "backward: the rest"),
           ("implicit_forward", "the differentiated step's forward solve"))


def _region(op: str) -> str:
    return next((name for key, name in REGIONS if key in op), "the rest")


def census(hlo: str, dump: str, top: int, module: str) -> dict:
    frames = _frames(hlo)
    info = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = ", line)
        if not m:
            continue
        op = re.search(r'op_name="([^"]*)"', line)
        fid = re.search(r"stack_frame_id=(\d+)", line)
        info[m.group(1)] = (op.group(1) if op else "", frames.get(int(fid.group(1)), "?") if fid else "(no source)")
    by_fn, n_fn, by_region = collections.Counter(), collections.Counter(), collections.Counter()
    by_file = collections.Counter()
    total = 0
    for name in os.listdir(dump):
        if f".{module}." not in name or not name.endswith("ir-no-opt.ll"):
            continue
        with open(os.path.join(dump, name)) as f:
            ir = f.read()
        for body in ir.split("\ndefine ")[1:]:
            fn = re.search(r"@([\w.\-]+)\(", body)
            if not fn:
                continue
            size = len(body)
            total += size
            key = re.sub(r"_kernel$|_parallel.*$", "", fn.group(1))
            op, src = info.get(fn.group(1)) or info.get(key) or ("", "(no source)")
            if src == "(no source)":  # named by its instruction's kind: reduce-window, gemv, …
                src = f"(no source: {re.sub(r'[._]?[0-9.]+$', '', key)})"
            by_file["(no source)" if src.startswith("(") else src.split(":")[0]] += size
            by_fn[src] += size
            n_fn[src] += 1
            region = _region(op)
            by_region[region] += size
    kernels = len(re.findall(r" fusion\(", hlo))
    return dict(
        kernels=kernels, llvm_ir_mb=round(total / 1e6, 2),
        reduce_window_kernels=len(re.findall(r" reduce-window\(", hlo)),
        by_region_mb={k: round(v / 1e6, 2) for k, v in by_region.most_common()},
        by_file_mb={k: round(v / 1e6, 2) for k, v in by_file.most_common(12)},
        by_function=[dict(function=k, ir_mb=round(v / 1e6, 3), share=round(v / total, 3), functions=n_fn[k])
                     for k, v in by_fn.most_common(top)])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--program", choices=sorted(PROGRAMS), default="step",
                    help="step: the drape's jitted step; gradient: jit(grad) of its 10-step rollout")
    ap.add_argument("--tree", default=ROOT, help="the checkout to measure (default: this one)")
    ap.add_argument("--xla-flags", default=TEST_FLAGS)
    ap.add_argument("--json")
    args = ap.parse_args()
    module = PROGRAMS[args.program]
    with tempfile.TemporaryDirectory() as tmp:
        dump, hlo_path = os.path.join(tmp, "dump"), os.path.join(tmp, "step.hlo")
        env = dict(os.environ, CENSUS_HLO=hlo_path, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="cpu_compiler=1",
                   XLA_FLAGS=f"{args.xla_flags} --xla_dump_to={dump} --xla_dump_hlo_module_re={module}")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", os.path.abspath(args.tree),
                            args.program],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"the child failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        wall = json.loads(r.stdout.strip().splitlines()[-1])["compile_s"]
        phase = lambda pattern: sum(float(v) * {"s": 1, "ms": 1e-3, "us": 1e-6}[u] for v, u in
                                    re.findall(pattern + r" time: ([\d.]+) (s|ms|us) ", r.stderr))
        with open(hlo_path) as f:
            doc = dict(command="python3 benchmarks/kernel_census.py " + " ".join(sys.argv[1:]),
                       tree=os.path.abspath(args.tree), xla_flags=args.xla_flags, compile_s=round(wall, 1),
                       program=args.program,
                       hlo_passes_s=round(phase(rf"Running HLO passes on \[{module}\] for CPU"), 1),
                       llvm_codegen_s=round(phase(rf"Compiling \[{module}\] for CPU using JIT"), 1),
                       **census(f.read(), dump, args.top, module))
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
