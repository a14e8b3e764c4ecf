"""The fidelity study (``terra-drive world=both``): is a world model a simulator of the true world? A client of the
drive run (terra/closedloop/recording/): its settings wrap the run's, and the run never imports it.

settings.py: ``StudySettings`` (a ``DriveSettings`` and the study's own) and ``terra_drive_settings``, terra-drive's
one entry. drives.py: the study start to end, on the run's parts. processes.py: the study as shard processes of one
machine (study=gpu), and any terra-drive command so. ray_shards.py: the study's shards, exploitability study and report
as tasks on a Ray cluster (executor=ray). control_worlds.py: worlds known to be wrong (the controls).
perturbed_worlds.py: the true world made a little wrong, to drive by name (``world=module:Class``). statistics.py:
what each statistic measures and its band. verdict.py: each statistic judged with its interval. horizons.py: how long
each world stays a simulator (its fidelity horizon) and the verdict within it. exploit.py: how far a driver tuned in
the model can be trusted in the true world. report.py: the study's drives in every world, and its report
(report_text.py writes it).
"""
