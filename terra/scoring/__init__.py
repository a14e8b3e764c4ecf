"""ACT-Bench scoring: generated videos → ACT-Bench's instruction and action fidelity (Terra's published table)."""
