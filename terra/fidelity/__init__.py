"""Measurements of a world model as a driving simulator, each with its uncertainty and each shown to fail on worlds
known to be wrong."""
