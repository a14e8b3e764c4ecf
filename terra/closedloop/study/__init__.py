"""The fidelity study (``terra-drive world=both``): is a world model a simulator of the true world?"""
