"""The modules of scripts/benchmark.py, one concept each; the script puts this package's folder on ``sys.path``.

* :mod:`bench.parts`: the configurations ("parts") and the sampling they use;
* :mod:`bench.arguments`: the command line;
* :mod:`bench.models`: Terra's and the plain Llama's model folders (config.json only for random weights);
* :mod:`bench.backends` and :mod:`bench.plain_llama`: the backend each part measures;
* :mod:`bench.rollouts`, :mod:`bench.engine_stats`, :mod:`bench.environment`: the workload and what is
  recorded about it;
* :mod:`bench.measure`, :mod:`bench.profiling`, :mod:`bench.e2e`: one part's measurements in its worker;
* :mod:`bench.report`: derived ratios, targets and the table over every part.
"""

from bench.arguments import parse_args
from bench.backends import build_backend
from bench.e2e import measure_e2e
from bench.engine_stats import prefix_summary
from bench.measure import run_part
from bench.models import read_layout, write_model_configs
from bench.parts import PARTS
from bench.profiling import busy_time
from bench.report import derived, load_records, table

__all__ = [
    "PARTS", "build_backend", "busy_time", "derived", "load_records", "measure_e2e", "parse_args", "prefix_summary",
    "read_layout", "run_part", "table", "write_model_configs",
]
