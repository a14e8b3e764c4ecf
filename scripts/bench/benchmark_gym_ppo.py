#!/usr/bin/env python
"""Stable-Baselines3's PPO on the registered gymnasium env (``terra/Drive-v0``, terra/closedloop/gym/env.py): a small
agent trained on the true world for a few minutes on a CPU, its mean episode return printed per rollout of
``--num-envs x --rollout-steps`` steps, so that it is seen to rise. The env: ``action_mode="actuation"`` (normalized
steering and acceleration), ``reward="lane_keeping"`` (metres along the road minus 0.5 per metre off the lane's
centre, each step), episodes of at most ``--num-steps`` steps ending when the car leaves the road; the policy:
SB3's ``MultiInputPolicy`` (a CNN on the frame beside the ego status and the command). The first line is the
untrained agent's (its initial policy is as good as random actions). Needs ``pip install -e '.[rl]'``. Example::

    python scripts/bench/benchmark_gym_ppo.py --minutes 5 --threads 1      # benchmarks/rl.md, "Reinforcement learning"
    python scripts/bench/benchmark_gym_ppo.py --minutes 5 --threads 1 --learning-rate 0    # the control: no learning
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from terra.closedloop.gym.env import ENV_ID

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import THREADS, Parser, exit_2_on_input_error, in_range  # noqa: E402


class ReturnPerRollout(BaseCallback):
    """Prints the episodes that ended in each rollout: their count, mean return (with its 95 % interval) and
    length; training stops once ``seconds`` have passed (SB3: a callback's step answering False)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.start, self.returns, self.lengths = seconds, time.perf_counter(), [], []

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:  # SB3's Monitor: the episode just ended
                self.returns.append(info["episode"]["r"])
                self.lengths.append(info["episode"]["l"])
        return time.perf_counter() - self.start < self.seconds

    def _on_rollout_end(self) -> None:
        returns = np.array(self.returns)
        half = 1.96 * returns.std(ddof=1) / np.sqrt(len(returns)) if len(returns) > 1 else float("nan")
        print(f"{self.num_timesteps:7d} steps {time.perf_counter() - self.start:6.0f} s  {len(returns):3d} episodes  "
              f"return {returns.mean():6.2f} +- {half:5.2f}  length {np.mean(self.lengths):5.1f}", flush=True)
        self.returns, self.lengths = [], []


@exit_2_on_input_error("benchmark_gym_ppo")
def main(argv: list[str] | None = None) -> None:
    parser = Parser("benchmark_gym_ppo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=in_range(float, 0, 7 * 24 * 60, above=True), default=5.0,
                        help="training time (wall clock)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch CPU threads")
    parser.add_argument("--num-envs", type=in_range(int, 1, 256), default=4,
                        help="drives per rollout (SB3's DummyVecEnv)")
    parser.add_argument("--rollout-steps", type=in_range(int, 2, 100_000), default=128,
                        help="steps per env per rollout (PPO's n_steps)")
    parser.add_argument("--num-steps", type=in_range(int, 1, 10_000), default=100,
                        help="steps per episode at most (10 s)")
    parser.add_argument("--image-size", type=in_range(int, 36, 1024), nargs=2, default=(36, 64),
                        help="frame height and width (36: the least SB3's CNN takes)")
    parser.add_argument("--learning-rate", type=in_range(float, 0, 1), default=3e-4,
                        help="PPO's (SB3's default); 0: the control, an agent that does not learn")
    parser.add_argument("--seed", type=in_range(int, 0, 2**31 - 1), default=0, help="(numpy's global seed: 32 bits)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = make_vec_env(ENV_ID, n_envs=args.num_envs, seed=args.seed, env_kwargs={
        "action_mode": "actuation", "reward": "lane_keeping", "num_steps": args.num_steps,
        "image_size": tuple(args.image_size), "num_scenarios": 16, "scenario_seed": args.seed})
    model = PPO("MultiInputPolicy", env, learning_rate=args.learning_rate, n_steps=args.rollout_steps, batch_size=128,
                n_epochs=4, seed=args.seed, device="cpu")
    print(f"PPO on {ENV_ID} ({gym.__version__}), {args.num_envs} envs x {args.rollout_steps} steps per rollout, "
          f"{args.threads} torch thread(s), {args.minutes:g} min", flush=True)
    model.learn(total_timesteps=10**9, callback=ReturnPerRollout(args.minutes * 60))


if __name__ == "__main__":
    sys.exit(main())
