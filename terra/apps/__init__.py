"""Every entry point (``terra-generate``, ``terra-rollout``, ``terra-serve``, ...) and the runner they share."""
