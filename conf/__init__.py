"""The Hydra configs, installed as the package ``terra.conf`` (see ``pyproject.toml`` and ``terra/apps/runner.py``)."""
