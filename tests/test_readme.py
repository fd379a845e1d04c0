"""Every Python snippet in the README runs as written, in order, and checks what it promises."""
import os
import re

import numpy as np

from tests.test_fitting import compilations_of, xla_compilations

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _python_blocks(text):
    """The ```python blocks, dedented (a block inside a list item is indented)."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, flags=re.S | re.M):
        indent = len(m.group(1))
        blocks.append("\n".join(line[indent:] for line in m.group(2).splitlines()))
    return blocks


def test_readme_opens_with_the_two_set_up_commands():
    """The first block of the README is the install-and-drape and install-and-test pair
    (.ci/run runs the second as written)."""
    text = open(README).read()
    first = re.search(r"^```bash\n(.*?)^```", text, flags=re.S | re.M).group(1).splitlines()
    assert first == ['python3 -m pip install -q -e . && ipcjax drape',
                     'python3 -m pip install -q -e ".[test]" && python3 -m pytest -q']
    ci = open(os.path.join(os.path.dirname(README), ".ci", "run")).read()
    assert first[1] in ci


def test_readme_figures_exist():
    text = open(README).read()
    paths = re.findall(r'(?:src="|\]\()(docs/figures/[^")]+)', text)
    assert paths, "the README's picture"
    for p in paths:
        assert os.path.isfile(os.path.join(os.path.dirname(README), p)), p


def test_readme_python_snippets_run_and_hold():
    """Simulate, differentiate, fit: the three examples run in order and assert what they say.

    The fit is the default suite's end-to-end fit on a rollout (the fast sibling of
    tests/test_fitting.py::test_recovers_bending_scale_from_two_times_off, docs/tests.md)."""
    blocks = _python_blocks(open(README).read())
    assert len(blocks) == 3, "the README's simulate, differentiate and fit examples"
    namespace = {}
    for i, code in enumerate(blocks[:2]):
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)
    assert "grads" in namespace  # the gradient example ran to its assertions
    # the fit: one compilation of the measurement-and-Jacobian program serves the target,
    # the start and every iteration (what the README says of MeasuredRollout)
    with xla_compilations() as compiled:
        exec(compile(blocks[2], "README.md python block 2", "exec"), namespace)
    assert compilations_of(compiled, "measurements_and_jacobian") == 1, compiled
    res = namespace["res"]  # the fit example ran to its assertion; its loss fell on a non-zero gradient
    assert res.history[-1].loss < res.history[0].loss * 1e-4
    assert all(np.isfinite(h.grad_norm) and h.grad_norm > 0 for h in res.history[:-1])
