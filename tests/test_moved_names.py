"""Renamed settings (terra/config/moved.py; docs/moved-names.md): the old names still work until 0.2.0, each
with one line on stderr naming the old and the new setting, on the command line, in a user's config file and as
Python keywords; the new names work without a line; a bad value is one error line either way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from terra.batch import BatchConfig
from terra.config.moved import move_settings, moved_overrides
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from tests.test_cli import ENV, FAST, TERRA_GENERATE, terra_generate

DECODER_LINE = "decoding= is now decoder= (framewise is tokenizer); the old name goes in 0.2.0"
DRAFT_TOKENS_LINE = "sampling.block_size= is now sampling.draft_tokens=; the old name goes in 0.2.0"


def stderr_lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_old_names_on_the_command_line_get_their_new_names(capsys):
    args = ["decoding=framewise", "sampling.block_size=8", "--multirun", "sampling=greedy", "decoder=refiner",
            "decoding=framewise,refiner", "~decoding", "+sampling.block_size=4", "decoding='refiner'", "x.decoding=1",
            "--config-name", "decoding"]  # an option's value is no setting
    assert moved_overrides(args, "terra-generate") == [
        "decoder=tokenizer", "sampling.draft_tokens=8", "--multirun", "sampling=greedy", "decoder=refiner",
        "decoder=tokenizer,refiner", "~decoder", "++sampling.draft_tokens=4", "decoder=refiner", "x.decoding=1",
        "--config-name", "decoding"]
    lines = stderr_lines(capsys)
    assert lines[:2] == [f"terra-generate: {DECODER_LINE}", f"terra-generate: {DRAFT_TOKENS_LINE}"]
    assert len(lines) == 6 and all(line.startswith("terra-generate: ") for line in lines)  # one per old name given
    assert moved_overrides(["decoder=tokenizer", "sampling.draft_tokens=8"], "p") == [
        "decoder=tokenizer", "sampling.draft_tokens=8"]
    assert stderr_lines(capsys) == []  # new names: nothing said


def test_an_old_name_with_a_value_it_never_had_is_one_error_line(capsys):
    with pytest.raises(TerraInputError) as err:
        moved_overrides(["decoding=bogus"], "terra-generate")
    assert str(err.value) == ("decoding='bogus' is unknown; decoding= is now decoder=: use decoder=tokenizer or "
                              "decoder=refiner")
    assert stderr_lines(capsys) == []  # the error is the only line


@pytest.mark.parametrize("arg, value", [("sampling.block_size=8", 8), ("+sampling.block_size=8", 8),
                                        ("++sampling.block_size=8", 8), ("decoding=framewise", "tokenizer"),
                                        ("+decoding=refiner", "refiner"), ("++decoding=framewise", "tokenizer")])
def test_every_documented_form_of_an_old_name_reaches_the_new_setting(capsys, arg, value):
    from hydra import compose, initialize_config_module

    with initialize_config_module("terra.conf", version_base=None):
        cfg = compose("generate", moved_overrides([arg], "terra-generate"))
    new = "sampling.draft_tokens" if "block_size" in arg else "decoder"
    assert OmegaConf.select(cfg, new) == value
    assert len(stderr_lines(capsys)) == 1


@pytest.mark.parametrize("arg, line", [
    ("sampling.block_size=0", "sampling.block_size=0: sampling.draft_tokens must be a whole number from 1 to 4096"),
    ("+sampling.block_size=abc", "sampling.block_size='abc': sampling.draft_tokens must be a whole number"),
    ("decoding=bogus", "decoding='bogus' is unknown; decoding= is now decoder="),
])
def test_a_refused_value_of_an_old_name_is_the_only_line(capsys, arg, line):
    with pytest.raises(TerraInputError, match=line):
        moved_overrides([arg], "terra-generate")
    assert stderr_lines(capsys) == []
    with pytest.raises(TerraInputError, match="sampling.draft_tokens must be a whole number"):
        SamplingConfig.from_mapping({"block_size": 0})
    assert stderr_lines(capsys) == []


def test_old_names_in_a_config_file_move_to_the_new_ones(capsys):
    cfg = OmegaConf.create({"decoding": "refiner", "decoder": "tokenizer", "num_frames": 2,
                            "sampling": {"temperature": 0.9, "block_size": 8, "draft_tokens": 32}})
    OmegaConf.set_struct(cfg, True)  # as Hydra composes it
    move_settings(cfg, "terra-rollout")
    assert OmegaConf.to_container(cfg) == {"decoder": "refiner", "num_frames": 2,
                                           "sampling": {"temperature": 0.9, "draft_tokens": 8}}
    assert stderr_lines(capsys) == [
        "terra-rollout: decoding= is now decoder=; the old name goes in 0.2.0",
        f"terra-rollout: {DRAFT_TOKENS_LINE}"]
    move_settings(cfg, "terra-rollout")  # nothing old left: nothing said
    assert stderr_lines(capsys) == []


def test_python_keywords_take_the_old_names(capsys, tmp_path):
    assert SamplingConfig(block_size=8) == SamplingConfig(draft_tokens=8)
    assert SamplingConfig.from_mapping({"decoding": "speculative", "block_size": 4}).draft_tokens == 4
    assert stderr_lines(capsys) == [f"terra: {DRAFT_TOKENS_LINE}"] * 2
    with pytest.raises(TerraInputError, match="sampling.draft_tokens must be a whole number"):
        SamplingConfig(block_size=0)
    with pytest.raises(TerraInputError, match="some of decoding, draft_tokens, guesses, temperature, top_k, top_p"):
        SamplingConfig.from_mapping({"blok_size": 4})  # the old name is not advertised
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), decoding="framewise")
    assert config.decoder == "tokenizer" and config.spec().run.decoder == "tokenizer"
    assert stderr_lines(capsys)[-1] == f"terra: {DECODER_LINE}"
    with pytest.raises(TerraInputError, match="decoding='bogus' is unknown; decoding= is now decoder="):
        BatchConfig(samples=str(samples), output_dir="out", decoding="bogus")
    with pytest.raises(TerraInputError, match="decoder='framewise' is unknown; use decoder=tokenizer"):
        BatchConfig(samples=str(samples), output_dir="out", decoder="framewise").spec()


def test_the_pipeline_takes_decode_batch_size(capsys):
    """``WorldModelPipeline(decode_batch_size=)`` sized encode batches as well as decode ones: it is
    ``tokenizer_batch_size`` now, the old keyword taken with one line."""
    from terra.models.presets import TINY_TOKENIZER
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer import LFQTokenizer

    tokenizer = LFQTokenizer(TINY_TOKENIZER)
    assert WorldModelPipeline(tokenizer, None, decode_batch_size=3).tokenizer_batch_size == 3
    assert stderr_lines(capsys) == [
        "terra: decode_batch_size= is now tokenizer_batch_size=; the old name goes in 0.2.0"]
    assert WorldModelPipeline(tokenizer, None, tokenizer_batch_size=3).tokenizer_batch_size == 3
    assert stderr_lines(capsys) == []  # the new name: nothing said


def test_from_pretrained_takes_block_size(capsys):
    from terra.pipeline import WorldModelPipeline

    pipeline = WorldModelPipeline.from_pretrained("demo", backend="hf", device="cpu", block_size=8)
    pipeline.close()
    lines = stderr_lines(capsys)  # and Transformers' "Loading weights" bar
    assert [line for line in lines if "is now" in line] == [f"terra: {DRAFT_TOKENS_LINE}"]


@pytest.mark.skipif(not TERRA_GENERATE.exists(), reason="terra-generate is not installed next to this Python")
def test_terra_generate_runs_with_the_old_names_and_says_so_once_each(tmp_path):
    """decoding= on the command line, sampling.block_size in the user's own sampling file (--config-dir)."""
    conf = tmp_path / "conf" / "sampling"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("temperature: 0.0\ndecoding: speculative\nblock_size: 8\n")
    out = tmp_path / "out"
    result = terra_generate(tmp_path / "cwd", "--config-dir", str(tmp_path / "conf"), *FAST, "sampling=mine",
                            "decoding=framewise", "num_frames=1", "output.formats=[gif]", f"output.dir={out}")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"terra-generate: {DECODER_LINE}", f"terra-generate: {DRAFT_TOKENS_LINE}"]
    sidecar = json.loads((out / "rollout.json").read_text())
    assert sidecar["config"]["decoder"] == "tokenizer" and "decoding" not in sidecar["config"]
    assert sidecar["config"]["sampling"] == {"temperature": 0.0, "decoding": "speculative", "draft_tokens": 8}
    assert sidecar["rollouts"][0]["decoding"]["draft_tokens"] == 8  # the speculative passes ran with 8 guesses


@pytest.mark.parametrize("app, args, line", [
    ("terra-rollout", ["samples=x.jsonl", "decoding=bogus"],
     "terra-rollout: error: decoding='bogus' is unknown; decoding= is now decoder=: use decoder=tokenizer or "
     "decoder=refiner"),
    ("terra-generate", ["decoder=framewise"],
     "terra-generate: error: decoder='framewise' is unknown; use decoder=tokenizer (the tokenizer's frames) or "
     "decoder=refiner (Terra's video refiner, GPU)"),
    ("terra-serve", ["sampling.draft_tokens=0"],
     "terra-serve: error: sampling.draft_tokens must be a whole number from 1 to 4096 (got 0); e.g. "
     "sampling.draft_tokens=32"),
])
def test_a_bad_value_is_one_line(tmp_path, app, args, line):
    script = Path(sys.executable).with_name(app)
    if not script.exists():
        pytest.skip(f"{app} is not installed next to this Python")
    result = subprocess.run([str(script), *args], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.splitlines() == [line]



def test_a_renamed_value_of_a_kept_setting_moves_that_value_alone(capsys):
    """``action_mode=control`` (the gymnasium envs') is ``action_mode=actuation``; its other values, and the
    setting itself, are not moved and say nothing."""
    from terra.config.moved import ACTION_MODE, moved_value

    assert moved_overrides(["action_mode=plan", "action_mode=control"], "terra-x") == [
        "action_mode=plan", "action_mode=actuation"]
    assert moved_value(ACTION_MODE, "plan") == "plan" and moved_value(ACTION_MODE, "actuation") == "actuation"
    assert stderr_lines(capsys) == [
        "terra-x: action_mode=control is now action_mode=actuation; the old value goes in 0.2.0"]
    cfg = OmegaConf.create({"action_mode": "control", "other": 1})
    move_settings(cfg, "terra-x")
    assert OmegaConf.to_container(cfg) == {"action_mode": "actuation", "other": 1}
