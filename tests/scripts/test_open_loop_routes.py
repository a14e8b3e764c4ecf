"""scripts/experiments/open_loop_routes.py: bad input (a thread count below 1, a model without route slots) is one
line and exit 2, before any model is loaded."""

from __future__ import annotations

import json
import subprocess
import sys

from terra.config.assets import demo_checkpoints
from tests.conftest import SCRIPTS, load_script

SCRIPT = SCRIPTS / "experiments" / "open_loop_routes.py"


def refused(args: list[str], *words: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and all(word in lines[0] for word in words), lines[0]


def test_threads_below_one_are_one_line():
    refused([str(demo_checkpoints()[0]), "--threads", "0"], "open_loop_routes: error: argument --threads", "from 1 to")


def test_a_model_without_route_slots_is_refused(tmp_path):
    config = json.loads((demo_checkpoints()[0] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_route_tokens": 0,
                                                               "num_spatio_embeddings": 150}))
    refused([str(demo_checkpoints()[0]), str(tmp_path)], str(tmp_path), "no route slots")


def test_the_demo_model_is_a_route_model():
    load_script("experiments/open_loop_routes").check_route_model(demo_checkpoints()[0])
