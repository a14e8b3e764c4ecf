"""How a policy's plan moves the ego car, the same in every world."""
