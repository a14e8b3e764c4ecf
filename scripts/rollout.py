"""Batch rollouts: ``python scripts/rollout.py KEY=VALUE ...`` runs ``terra-rollout`` (terra/apps/rollout.py,
which documents the settings, resuming, sharding and Ray runs)."""

from terra.apps.rollout import main

if __name__ == "__main__":
    main("python scripts/rollout.py")
