"""Wiring and serving, shared by the four services: the backends a service holds, app lifecycle,
health, reflection, metrics, errors, auth, logs."""
