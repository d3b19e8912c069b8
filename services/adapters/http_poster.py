"""Poster on the standard library (urllib in a worker thread): one request per call, no pooling
(a batch per request, so a connection per batch costs little next to the batch)."""

from __future__ import annotations

import asyncio
import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping

log = logging.getLogger(__name__)


class UrllibPoster:
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int | None:
        return await asyncio.to_thread(self._post, url, body, dict(headers), timeout_s)

    @staticmethod
    def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int | None:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - operators' URLs
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            log.info("webhook endpoint did not answer", extra={"url": url, "error": str(e)[:200]})
            return None
