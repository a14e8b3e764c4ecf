"""The model's contract: what the world model, the data, the simulator and the apps agree on."""
