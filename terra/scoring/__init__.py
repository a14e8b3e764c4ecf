"""ACT-Bench scoring: generated videos → ACT-Bench's instruction and action fidelity (Terra's published table).

``terra-score`` (terra/apps/score.py) runs it; from Python::

    from terra.scoring.settings import ScoringSettings
    from terra.scoring.run import score
    result = score(ScoringSettings(videos=Path("out/terra"), samples=(Path("act_bench.jsonl"),),
                                   estimator=Path("ACT-Estimator"), output_dir=Path("results/terra")))
    result.metrics.accuracy, result.metrics.ade, result.metrics.fde

Modules, one concept each: :mod:`~terra.scoring.estimator` (the ACT-Estimator network and its weights),
:mod:`~terra.scoring.labels` (the nine classes, the label mapping, the reference trajectory's frame),
:mod:`~terra.scoring.samples` (ACT-Bench's JSONL rows), :mod:`~terra.scoring.videos` (finding, matching,
decoding, preprocessing), :mod:`~terra.scoring.metrics`, :mod:`~terra.scoring.report` (the files written),
:mod:`~terra.scoring.settings` (checked before torch loads) and :mod:`~terra.scoring.run` (:func:`score`).
Importing this package is light; ``run``, ``estimator`` and ``videos`` import torch.
"""
