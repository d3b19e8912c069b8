"""The retention sweep (``python -m spark.sweep``): a PySpark job that keeps storage bounded."""
