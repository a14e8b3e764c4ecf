"""A fine-tuned world model blended with its starting checkpoint in weight space:
``python scripts/blend_world_models.py base=DIR tuned=DIR weight=0.8 output_dir=DIR`` runs terra/apps/blend.py
(the rule: terra/training/blend.py)."""

from terra.apps.blend import main

if __name__ == "__main__":
    main()
