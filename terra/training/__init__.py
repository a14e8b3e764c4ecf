"""Fine-tuning and its data: driving logs → shards → training runs."""
