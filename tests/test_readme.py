"""Every Python snippet in the README runs as written, in order, and checks what it promises."""
import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _python_blocks(text):
    """The ```python blocks, dedented (a block inside a list item is indented)."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, flags=re.S | re.M):
        indent = len(m.group(1))
        blocks.append("\n".join(line[indent:] for line in m.group(2).splitlines()))
    return blocks


def test_readme_python_snippets_run_and_hold():
    blocks = _python_blocks(open(README).read())
    assert len(blocks) >= 2, "the README's usage and gradient examples"
    namespace = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)
    assert "grads" in namespace  # the gradient example ran to its assertions
