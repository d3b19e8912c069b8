"""How to reach S3 and use its bucket: a plain value, built from MAILQUEUE_S3_* (and the
credentials folder) by services/runtime/settings.py, which describes each variable."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class S3Settings:
    endpoint: str = "127.0.0.1:9000"
    access_key: str = "minioadmin"
    secret_key: str = "minioadmin"
    bucket: str = "mailqueue-blobs"
    secure: bool = False
    ca_file: str = ""
    region: str | None = None
    pool_size: int = 64
    spool_dir: str | None = None
    touch_interval_s: int = 60
