"""Evaluate a world model + tokenizer on held-out clips of the synthetic world → report.json and a table
(``terra-evaluate``, terra/apps/evaluate.py).

    terra-evaluate                                       # the shipped demo models, Transformers backend
    terra-evaluate quality.num_clips=32 adherence.num_cases=20 out_dir=outputs/eval/demo
    terra-evaluate backend=vllm sampling=terra           # sampled rollouts on vLLM

Everything is rendered on the fly by :mod:`terra.sim` from scene seeds that the training data never used
(``quality.scene_seed`` / ``adherence.scene_seed`` and up; the scene seeds of the world model's training clips,
``numpy.random.default_rng([exclude_training.seed, i])``'s first draw in ``terra-make-dataset``, are
skipped), so the ground truth is exact. ``domain`` (terra/sim/scene.py: ``day``, the demo models' world, ``night``
or ``left_hand``) sets the scenes of both measurements; the same seeds give the same roads by day and at night,
and those roads mirrored in ``left_hand``.

:mod:`terra.evaluation.settings` checks the settings into a frozen spec, :mod:`terra.evaluation.cases` draws the
clips, :mod:`terra.evaluation.measure` measures (details there), :mod:`terra.evaluation.run` runs both and writes
the report, each measurement a phase whose results are kept in the output folder as it finishes, so that a run into
it resumes at the first phase left (:mod:`terra.evaluation.phases`):

Frame quality
    One clip per scene seed (manoeuvres cycled, speed and manoeuvre parameters drawn as for training): the
    first ``num_context`` frames are context, ``horizon`` frames are generated under the clip's own actions and
    compared with the ground truth (PSNR and SSIM per step, with the tokenizer's reconstruction and a repeated
    last context frame as references).

Manoeuvre adherence
    For each case and pair of opposite manoeuvres (``curve_left`` / ``curve_right``, ``accelerate`` /
    ``decelerate``), one context of ``num_context`` frames driving straight along the lane is followed by
    each manoeuvre in turn; each rollout is attributed to the manoeuvre whose ground-truth render its frames at
    ``adherence.horizons`` are closer to.

Beside them, :mod:`terra.evaluation.decoding` counts the forward passes per frame of sequential and speculative
decoding on held-out clips of the training distribution (scripts/experiments/measure_decoding.py runs it).

Every setting is checked once (``evaluate_spec`` in terra/evaluation/settings.py; the model and engine settings by
``run_spec``, terra/config/spec.py, as in every app) before torch is imported or any model loads, the output folder
included; a bad one ends with one line on stderr and exit code 2 (terra/apps/runner.py).
"""
