"""``terra-drive``'s run in one world: settings checked, worlds opened, drives made and recorded, resumable."""
