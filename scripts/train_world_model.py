"""Training and fine-tuning: ``python scripts/train_world_model.py KEY=VALUE ...`` (or under ``torchrun``) runs
terra/apps/train.py, which documents the settings; the training itself is terra/training/."""

from terra.apps.train import main

if __name__ == "__main__":
    main()
