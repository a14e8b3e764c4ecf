"""Evaluate a world model + tokenizer on held-out clips of the synthetic world → report.json and a table."""
