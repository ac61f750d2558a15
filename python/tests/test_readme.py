"""The README's "Python in ten lines" block runs as written (on the CPU), so
the first code a newcomer copies stays true."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_python_blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_quickstart_runs():
    blocks = readme_python_blocks()
    assert blocks, "README.md has no ```python block"
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    o, state, q, v = scope["o"], scope["state"], scope["q"], scope["v"]
    B, T, H, HV, K, V = (scope[n] for n in ("B", "T", "H", "HV", "K", "V"))
    assert tuple(o.shape) == (B, T, HV, V)
    assert tuple(state.shape) == (B, HV, K, V)
    assert q.grad is not None and tuple(q.grad.shape) == (B, T, H, K)
    assert v.grad is not None and bool(v.grad.abs().sum() > 0)
