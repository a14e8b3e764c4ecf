"""The ground floor: what every wing shares and nothing of the project's is imported for."""
