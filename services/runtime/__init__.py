"""The server runtime shared by the four services: app lifecycle, health, reflection, metrics, errors."""
