"""The modules of scripts/benchmark.py, one concept each; the script puts this package's folder on ``sys.path``.

* :mod:`bench.parts`: the configurations ("parts") and the sampling they use;
* :mod:`bench.arguments`: the command line;
* :mod:`bench.models`: Terra's and the plain Llama's model folders (config.json only for random weights), the
  config.json-only folder on vLLM's dummy weights that the other vLLM scripts make too, and saved random-weights
  world models and tokenizers for the scripts that run the apps (benchmark_rollout.py, benchmark_memory_table.py);
* :mod:`bench.backends` and :mod:`bench.plain_llama`: the backend each part measures;
* :mod:`bench.rollouts`, :mod:`bench.engine_stats`, :mod:`bench.environment`: the workload and what is
  recorded about it;
* :mod:`bench.measure`, :mod:`bench.profiling`, :mod:`bench.e2e`: one part's measurements in its worker;
* :mod:`bench.report`: derived ratios, targets and the table over every part;
* :mod:`bench.cli`: what every benchmark script's command line shares (comma lists, exit 2, client threads).
* :mod:`bench.engine_steps`: scripts/check_jacobi_vllm.py's: a vLLM engine's steps counted and timed, and rollouts
  run end to end beside what the step time projects.

The names below load on first use: a script that needs only :mod:`bench.cli` loads no engine.
"""

from terra.core.lazy import lazy_face

__all__, __getattr__ = lazy_face(__name__, {
    "parse_args": "bench.arguments", "build_backend": "bench.backends", "measure_e2e": "bench.e2e",
    "prefix_summary": "bench.engine_stats", "run_part": "bench.measure", "read_layout": "bench.models",
    "write_model_configs": "bench.models", "PARTS": "bench.parts", "busy_time": "bench.profiling",
    "derived": "bench.report", "load_records": "bench.report", "table": "bench.report",
})
