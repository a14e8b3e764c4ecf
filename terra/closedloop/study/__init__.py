"""The fidelity study (``terra-drive world=both``): is a world model a simulator of the true world? A client of the
drive run (terra/closedloop/recording/): its settings wrap the run's, and the run never imports it.

settings.py: ``StudySettings`` (a ``DriveSettings`` and the study's own) and ``terra_drive_settings``, terra-drive's
one entry. drives.py: the study start to end, on the run's parts. control_worlds.py: worlds known to be wrong (the
controls). verdict.py: each statistic judged with its interval. exploit.py: how far a driver tuned in the model can
be trusted in the true world. report.py: the study's drives in every world, and its report.
"""
