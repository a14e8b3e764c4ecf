"""Closed-loop driving: a policy in the loop with a world, step by step."""
