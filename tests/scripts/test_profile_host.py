"""scripts/bench/profile_host.py: py-spy's samples sorted by part, from a raw file and from a run (CPU)."""

from __future__ import annotations

import pytest

from tests.conftest import load_script, save_tiny_pair

CLIENT = 'process 41:"python scripts/bench/profile_host.py -c import x\nrun()"'  # a cmdline over two lines
CORE = 'process 57:"VLLM::EngineCore"'
WORKER = f'{CORE};process 58:"VLLM::Worker"'  # the engine core's child that runs the model
THREAD = "Thread._bootstrap (/usr/lib/python3.11/threading.py:1002);Thread.run (/usr/lib/python3.11/threading.py:982)"
GRPC = f"{THREAD};_serve (/site-packages/grpc/_server.py:1200);_handle_call (/site-packages/grpc/_server.py:900)"
ENCODE = ("render_video_chunk (/terra/alpasim/service.py:200);SessionTable._encode (/terra/alpasim/sessions.py:289);"
          "encode_image (/decoder/writers.py:40);Image.save (/site-packages/PIL/Image.py:2400)")
LOOP = "EngineCoreProc.run_busy_loop (/site-packages/vllm/v1/engine/core.py:800)"
WAIT = "Condition.wait (/usr/lib/python3.11/threading.py:320)"
BUSY = [  # the threads on a CPU
    f"{CLIENT};{GRPC};{ENCODE} 30",  # JPEG inside a gRPC call: the innermost part named decides
    f"{CLIENT};{GRPC};render_video_chunk (/terra/alpasim/service.py:210) 10",  # gRPC
    f"{CLIENT};{THREAD};helper (/somewhere/else.py:3) 5",  # no part named
    f"{CLIENT};{WORKER};Worker.execute_model (/site-packages/vllm/v1/worker/gpu_worker.py:400);"
    "Module._call_impl (/site-packages/torch/nn/modules/module.py:1700) 60",
    f"{CLIENT};{CORE};{LOOP};hash_block_tokens (/site-packages/vllm/v1/core/kv_cache_utils.py:500) 20",
    f"{CLIENT};{CORE} 5",  # a thread of no Python frames
]
IDLE = BUSY + [  # every thread: those waiting too
    f"{CLIENT};{GRPC};{ENCODE};{WAIT} 40",
    f"{CLIENT};{THREAD};helper (/somewhere/else.py:3) 7",  # off the CPU at a line that does not look like a wait
    f"{CLIENT};{CORE};{LOOP};Queue.get (/usr/lib/python3.11/queue.py:171) 15",
]


def test_samples_of_a_raw_file_are_sorted_by_part(tmp_path, capsys):
    (tmp_path / "idle.raw").write_text("\n".join(IDLE) + "\n")
    (tmp_path / "busy.raw").write_text("\n".join(BUSY) + "\n")
    bench = load_script("bench/profile_host")
    record = bench.main(["--read", str(tmp_path)])
    waiting = bench.WAITING["busy"]
    assert record["parts"] == {
        "client": {"JPEG (PIL, encode_image)": 30, "gRPC": 10, "other": 5, waiting: 47},
        "engine core": {"model execution": 60, "prefix-cache hashing": 20, "other": 5, waiting: 15}}
    rows = {line.split(" | ")[0][2:]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["JPEG (PIL, encode_image)"] == "| JPEG (PIL, encode_image) | 30 | 33 | 0 | 0 |"
    assert rows["model execution"] == "| model execution | 0 | 0 | 60 | 60 |"
    assert rows[waiting] == f"| {waiting} | 47 | 51 | 15 | 15 |"
    assert rows["all"] == "| all | 92 | 100 | 100 | 100 |"


def test_bad_arguments_of_the_profile(tmp_path, capsys):
    bench = load_script("bench/profile_host")
    (tmp_path / "a_file").write_text("")
    for argv in (["--read", "/no/such"], ["--read", str(tmp_path)], ["--path", "drive"], ["--rate", "0"],
                 ["--raw", str(tmp_path / "a_file")]):
        with pytest.raises(SystemExit) as exit_:
            bench.parse_args(argv)
        assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1, argv


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


@pytest.fixture
def bench():
    """The script, where py-spy is installed (the dev extra has it)."""
    script = load_script("bench/profile_host")
    try:
        script.py_spy()
    except script.TerraInputError:
        pytest.skip("py-spy is not installed")
    return script


def test_a_stream_of_terra_generate_profiled(bench, tiny_pair, tmp_path, capsys, single_thread):
    """py-spy records the run's generation: the model's forward passes are where the client's time goes."""
    raw = tmp_path / "samples"
    record = bench.main(["--path", "generate", "--frames", "4", "--rate", "200", "--raw", str(raw),
                         f"model.world_model={tiny_pair / 'world_model'}", f"tokenizer.path={tiny_pair / 'tokenizer'}",
                         "backend=hf", "device=cpu", "num_threads=1"])
    client = record["parts"]["client"]
    assert record["frames"] == 4 and (raw / "idle.raw").stat().st_size > 0
    # the Transformers backend starts no engine core; one an earlier test of this worker left only waits, blocked or
    # spinning on its message queue (a loaded machine samples the spin)
    assert set(record["parts"]["engine core"]) <= {bench.WAITING["busy"], "executor messages (shared memory, spinning)"}
    busy = {part: count for part, count in client.items() if part != bench.WAITING["busy"]}
    assert max(busy, key=busy.get) == "model execution", client
    printed = capsys.readouterr().out
    assert "generate: 4 frames in " in printed and "| model execution | " in printed


def test_alpasim_sessions_profiled(bench, tiny_pair, capsys, single_thread):
    """Two sessions at once: every thread of the server and its clients is sampled, the waiting ones too."""
    pytest.importorskip("carla_driver_interface")
    record = bench.main(["--path", "alpasim", "--sessions", "2", "--chunks", "1", "--rate", "200",
                         f"model.world_model={tiny_pair / 'world_model'}", f"tokenizer.path={tiny_pair / 'tokenizer'}",
                         "backend=hf", "device=cpu", "num_threads=1"])
    client = record["parts"]["client"]
    assert record["frames"] == 2 * (5 + 8)
    assert client[bench.WAITING["busy"]] > 0 and sum(client.values()) > client[bench.WAITING["busy"]]
    assert "alpasim: 26 frames in " in capsys.readouterr().out
