"""The fidelity study (``terra-drive world=both``): is a world model a simulator of the true world? A client of the
drive run (terra/closedloop/recording/): its settings wrap the run's, and the run never imports it.
"""
