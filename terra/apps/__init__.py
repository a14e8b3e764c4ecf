"""Every entry point on one floor: ``terra-generate`` (:mod:`terra.apps.generate`), ``terra-rollout``
(:mod:`terra.apps.rollout`) and ``terra-serve`` (:mod:`terra.apps.serve`), with the runner they share
(:mod:`terra.apps.runner`: configs, resolvers, how each ends)."""
