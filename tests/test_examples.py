"""examples/quickstart.py runs as the README shows it and says what its
docstring claims (examples/distributed_node_classification.py is run by
test_distributed.py)."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / 'examples' / 'quickstart.py'


def test_quickstart_saturates_at_t_1_and_learns_at_t_100(capsys, one_thread):
    """With t = 1 nearly all attention stays on the self-loop, with t = 100
    little does; trained at t = 100 the classifier separates the two
    communities (chance 50%; measured 74.4%)."""
    runpy.run_path(str(QUICKSTART), run_name='__main__')
    out = capsys.readouterr().out
    weights = dict(re.findall(r't = +([\d.]+): mean self-loop attention at '
                              r'initialisation ([\d.]+)', out))
    assert float(weights['1.0']) > 0.9 and float(weights['100.0']) < 0.3, out
    accuracy, = re.findall(r'test accuracy \(t = 100\): ([\d.]+)', out)
    assert float(accuracy) >= 0.65, out
