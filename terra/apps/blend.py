"""``terra-blend``: a fine-tune blended with its starting checkpoint."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.training.blend import blend_spec

PROG = "terra-blend"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="blend_world_models", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    check_added_settings(PROG, cfg=cfg)
    spec = blend_spec(cfg)  # checked once: no torch yet, nothing written
    from terra.training.blend import blend

    done = blend(spec)
    print(f"{PROG}: wrote {spec.output}: {done['tensors']} tensors ({done['parameters'] / 1e6:.2f} M parameters), "
          f"{spec.base} + {spec.weight:g} x ({spec.tuned} - {spec.base}), {spec.dtype}")


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
