"""``terra-tokenize``: encode every frame of a clip dataset with an image tokenizer into one tokenized-clips file."""

from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.training.tokenize import tokenize_spec

PROG = "terra-tokenize"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="tokenize_dataset", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """(1) the settings, checked once; (2) tokenize and write; (3) a one-line summary."""
    check_added_settings(PROG, cfg=cfg)
    start = time.perf_counter()
    spec = tokenize_spec(cfg)
    from terra.training.tokenize import run  # torch and the tokenizer

    clips = run(spec)
    n, t, h, w = clips.codes.shape
    routes = "no routes" if clips.routes is None else f"routes of {clips.routes.shape[2]} points"
    print(f"wrote codes of {n} clips x {t} frames ({h}x{w} codes, codebook {clips.codebook_size}; {routes}) to "
          f"{spec.out} in {time.perf_counter() - start:.1f} s")


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
