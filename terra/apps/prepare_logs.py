"""``terra-prepare-logs``: a folder of driving clips → tokenized training shards."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.core.errors import TerraInputError
from terra.training.prepare_logs import prepare_spec
from terra.training.shards import INDEX_FILE

PROG = "terra-prepare-logs"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="prepare_driving_logs", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Settings; tokenizer and index; clips still to do; tokenize and write shards; summary."""
    # 1. the settings, checked once: no torch yet, nothing written
    check_added_settings(PROG, cfg=cfg)
    spec = prepare_spec(cfg)
    with spec.output.hold(INDEX_FILE):  # one run into this folder at a time: a second one stops here
        # 2. the tokenizer, on the device chosen once, and the index it must match
        from tqdm import tqdm

        from terra.core.device import resolve_device, set_threads
        from terra.core.progress import Progress
        from terra.tokenizer import load_tokenizer
        from terra.config.files import checkpoint_digest
        from terra.config.spec import redone_line
        from terra.training.prepare_logs import assign_splits, clip_inputs, clips_to_redo, open_index, prepare_shards
        from terra.training.shards import drop_clips

        set_threads(spec.num_threads)
        tokenizer = load_tokenizer(spec.tokenizer, device=resolve_device(spec.device))
        index, damaged = open_index(spec, tokenizer)
        # 3. the clips not yet done, each with its split
        made_of = checkpoint_digest(spec.tokenizer)
        inputs = {folder.name: clip_inputs(spec, folder, made_of) for folder in spec.clips}
        redo = clips_to_redo(index, damaged, inputs)
        if redo:
            tqdm.write(f"{PROG}: {redone_line(redo.values(), 'clip')}", file=sys.stderr)
        if redo or damaged:
            drop_clips(spec.output.path, index, set(redo), damaged)
        done = index.clip_ids()
        todo = [folder for folder in spec.clips if folder.name not in done]
        splits = assign_splits([folder.name for folder in todo], spec.val_fraction)
        # 4. read, resample, tokenize, write shards as they fill
        bar = Progress(len(todo), "clips", "clip", enabled=spec.progress, position=0)  # lines in a log
        frames = Progress(None, "frames tokenized", "frame", enabled=spec.progress, lines=False, position=1)
        summary = prepare_shards(spec, tokenizer, index, bar.counted(todo), splits,
                                 report=lambda line: tqdm.write(f"{PROG}: {line}", file=sys.stderr),
                                 on_frames=frames.update, inputs=inputs)
        frames.close()
        bar.close()
    # 5. the summary
    print(f"{PROG}: {summary.line(index, spec.output.path)}")
    if not index.shards:
        raise TerraInputError(f"no clip of logs={spec.logs} could be used; the lines above say why")


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
