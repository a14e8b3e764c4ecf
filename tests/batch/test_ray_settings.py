"""The ``ray`` block of a batch run (terra/config/ray_settings.py): checked without importing Ray, one line per
bad value naming the setting and a fix."""

from __future__ import annotations

from dataclasses import fields

import pytest

from terra.batch.config import BatchConfig, check_config
from terra.config.ray_settings import RaySettings
from terra.core.errors import TerraInputError
from terra.core.ray_cluster import ClusterSettings


def test_defaults_and_a_full_block():
    assert RaySettings.parse(None) == RaySettings()
    settings = RaySettings.parse({"address": " auto ", "num_actors": 4, "cpus_per_actor": 2.5, "max_restarts": 0,
                                  "max_retries": 100, "runtime_env": {"working_dir": "."}, "log_to_driver": True})
    assert settings == RaySettings("auto", 4, 2.5, 0, 100, {"working_dir": "."}, True)


def test_the_cluster_reads_fields_the_ray_block_has():
    """terra/core/ray_cluster.py cannot import the settings (the ground floor imports nothing of the project's): what
    it reads of them (``ClusterSettings``) are fields of ``RaySettings``, of the same types."""
    assert ClusterSettings.__annotations__.items() <= {f.name: f.type for f in fields(RaySettings)}.items()


@pytest.mark.parametrize("values, message", [
    ({"num_actors": 0}, "ray.num_actors must be a whole number from 1 to 100000 (got 0); e.g. ray.num_actors=2"),
    ({"num_actors": 10**7}, "ray.num_actors must be a whole number from 1 to 100000 (got 10000000)"),
    ({"num_actors": True}, "ray.num_actors must be a whole number"),
    ({"max_restarts": -1}, "ray.max_restarts must be a whole number from 0 to 1000 (got -1)"),
    ({"max_retries": 101}, "ray.max_retries must be a whole number from 0 to 100 (got 101)"),
    ({"cpus_per_actor": 0}, "ray.cpus_per_actor must be"),
    ({"address": ""}, "ray.address must be auto or host:port"),
    ({"runtime_env": "pip"}, "ray.runtime_env must be a mapping"),
    ({"log_to_driver": "yes"}, "ray.log_to_driver must be true or false"),
    ({"num_gpu": 2}, "unknown ray setting(s) ['num_gpu']"),
])
def test_bad_values_are_one_line_naming_the_setting(values, message):
    with pytest.raises(TerraInputError) as err:
        RaySettings.parse(values)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_unknown_executor(tmp_path):
    (tmp_path / "samples.jsonl").write_text("")
    config = BatchConfig(samples=str(tmp_path / "samples.jsonl"), output_dir=str(tmp_path / "out"), executor="dask")
    with pytest.raises(TerraInputError, match=r"unknown executor 'dask'; choose one of: local, ray"):
        check_config(config)
