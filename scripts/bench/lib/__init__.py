"""The code the benchmarks of scripts/bench/ share (scripts/bench/benchmark.py's modules first), one concept each;
each script puts scripts/ on ``sys.path`` and imports it as ``bench.lib``.

* :mod:`bench.lib.parts`: the configurations ("parts") and the sampling they use;
* :mod:`bench.lib.arguments`: the command line;
* :mod:`bench.lib.models`: Terra's and the plain Llama's model folders (config.json only for random weights), the
  config.json-only folder on vLLM's dummy weights that the other vLLM scripts make too, and saved random-weights
  world models and tokenizers for the scripts that run the apps (benchmark_rollout.py, benchmark_memory_table.py);
* :mod:`bench.lib.backends` and :mod:`bench.lib.plain_llama`: the backend each part measures;
* :mod:`bench.lib.rollouts`, :mod:`bench.lib.engine_stats`, :mod:`bench.lib.environment`: the workload and what is
  recorded about it;
* :mod:`bench.lib.measure`, :mod:`bench.lib.profiling`, :mod:`bench.lib.e2e`: one part's measurements in its worker;
* :mod:`bench.lib.report`: derived ratios, targets and the table over every part;
* :mod:`bench.lib.cli`: what the command lines of the benchmarks and experiments share (one-line errors with exit 2,
  number ranges, input paths found from any folder, outputs checked first, comma lists, client threads).
* :mod:`bench.lib.engine_steps`: scripts/checks/check_jacobi_vllm.py's: a vLLM engine's steps counted and timed,
  and rollouts run end to end beside what the step time projects.

The names below load on first use: a script that needs only :mod:`bench.lib.cli` loads no engine.
"""

from terra.core.lazy import lazy_face

__all__, __getattr__ = lazy_face(__name__, {
    "parse_args": "bench.lib.arguments", "build_backend": "bench.lib.backends", "measure_e2e": "bench.lib.e2e",
    "prefix_summary": "bench.lib.engine_stats", "run_part": "bench.lib.measure", "read_layout": "bench.lib.models",
    "write_model_configs": "bench.lib.models", "PARTS": "bench.lib.parts", "busy_time": "bench.lib.profiling",
    "derived": "bench.lib.report", "load_records": "bench.lib.report", "table": "bench.lib.report",
})
