"""The benchmarks (``benchmark*.py``, each run as a file: ``python scripts/bench/benchmark_drive.py``) and, in
:mod:`bench.lib`, the code they share; a script puts scripts/ on ``sys.path`` to import it as ``bench.lib``
(scripts/README.md)."""
