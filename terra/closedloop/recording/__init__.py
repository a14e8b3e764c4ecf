"""``terra-drive``'s run in one world: settings checked, worlds opened, drives made and recorded, resumable.

settings.py: conf/drive.yaml checked once into ``DriveSettings``. open_run.py: the worlds opened and the drives'
scenarios read. run.py: drives made in chunks, written, the manifest and summary. files.py: a drive's files (video,
JSON) and its folder. ray_executor.py: the same drives on Ray's actors. drives.py: a run start to end.
"""
