#!/usr/bin/env python
"""What the loop's vehicle costs per drive and step (terra/closedloop/car/motion.py): ``step`` (the next frame, 0.1 s)
and ``forecast`` at the action times (the world model's action, 2.95 s), and the loop's pair (a forecast, then the
step along the same plan: the bicycle's step takes the state the forecast reached), for each vehicle on a curving,
braking plan at NAVSIM's 8 poses at 0.5 s and at 10 Hz over 4 s. One process, one core; the median of
``--repeats`` calls.
Example::

    python scripts/bench/benchmark_vehicle.py --repeats 300
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from terra.closedloop.car.motion import VEHICLES
from terra.closedloop.plans import Plan
from terra.contract.actions import ACTION_TIMES

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, exit_2_on_input_error, in_range  # noqa: E402


def plan(spacing: float, count: int) -> Plan:
    """A 30 m radius turn, braking from 8 m/s at 1 m/s^2, headings given."""
    t = spacing * np.arange(1, count + 1)
    angle = (8.0 * t - 0.5 * t * t) / 30.0
    return Plan.trajectory(np.c_[30.0 * np.sin(angle), 30.0 * (1.0 - np.cos(angle)), angle], dt=spacing)


def forecast_then_step(car, made: Plan) -> None:
    """What the loop does with each plan (terra/closedloop/loop.py): the action's forecast, then the step."""
    car.forecast(made, ACTION_TIMES)
    car.step(made)


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


@exit_2_on_input_error("benchmark_vehicle")
def main(argv: list[str] | None = None) -> None:
    parser = Parser("benchmark_vehicle", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=in_range(int, 1, 10**6), default=300)
    args = parser.parse_args(argv)
    print("| vehicle | plan | step ms | forecast ms | forecast, then step ms |\n|---|---|---:|---:|---:|")
    for kind in VEHICLES:
        for name, (spacing, count) in {"8 poses at 0.5 s": (0.5, 8), "40 poses at 10 Hz": (0.1, 40)}.items():
            made = plan(spacing, count)
            car = VEHICLES[kind](8.0)
            step = median_ms(lambda: VEHICLES[kind](8.0).step(made), args.repeats)  # noqa: B023 (timed now)
            forecast = median_ms(lambda: car.forecast(made, ACTION_TIMES), args.repeats)  # noqa: B023 (timed now)
            both = median_ms(lambda: forecast_then_step(VEHICLES[kind](8.0), made),  # noqa: B023 (timed now)
                             args.repeats)
            print(f"| {kind} | {name} | {step:.3f} | {forecast:.3f} | {both:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
