"""Driving logs → training shards: ``python scripts/prepare_driving_logs.py logs=DIR output_dir=DIR`` runs
terra/apps/prepare_logs.py (the clip layout and the rules: terra/training/driving_logs.py)."""

from terra.apps.prepare_logs import main

if __name__ == "__main__":
    main()
