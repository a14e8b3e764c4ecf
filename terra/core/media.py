"""The file types read as frames: images and videos (tokenizer/images.py for context frames,
terra/inputs/driving_logs.py for a driving log's clips, terra/batch/samples.py for a sample's context)."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".mp4", ".mov", ".avi", ".mkv", ".webm", ".gif")
