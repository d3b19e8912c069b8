"""Poster on the standard library (urllib in a worker thread): one request per call, no pooling
(a batch per request, so a connection per batch costs little next to the batch).

- Each endpoint (by URL) has a thread of its own: an endpoint that hangs, or answers a byte at a
  time, holds only its own lane, never the event loop's shared pool (which the others and the
  registry reads use).
- A call ends by ``2 × timeout_s`` whatever the endpoint does (urllib's timeout is per socket
  operation); the late answer is dropped and the batch is retried.
- Redirects are not followed: a POST redirected would be re-sent as a GET without its body, to
  any host, with the signature headers; the 3xx is the answer (services/domain/webhooks.py).
- At most ``MAX_READ`` bytes of an answer are read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from services.domain.webhooks import Answer, retry_after_s

log = logging.getLogger(__name__)

#: Bytes of an endpoint's answer read at most (its status is what counts).
MAX_READ = 64 * 1024


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]  # noqa: ANN001
        return None  # urllib then raises HTTPError with the 3xx


_OPENER = urllib.request.build_opener(_NoRedirects())


class UrllibPoster:
    def __init__(self) -> None:
        self._lanes: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Answer:
        lane = self._lanes.get(url)
        if lane is None:
            lane = self._lanes[url] = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook")
        call = asyncio.get_running_loop().run_in_executor(lane, self._post, url, body, dict(headers), timeout_s)
        try:
            async with asyncio.timeout(2 * timeout_s):
                return await call
        except TimeoutError:
            log.info("webhook endpoint did not answer in time", extra={"url": url, "timeout_s": 2 * timeout_s})
            return Answer(None)

    @staticmethod
    def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Answer:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with _OPENER.open(request, timeout=timeout_s) as response:
                response.read(MAX_READ)
                return Answer(int(response.status))
        except urllib.error.HTTPError as e:
            asked = retry_after_s(e.headers.get("Retry-After") if e.headers is not None else None, time.time())
            e.close()
            return Answer(int(e.code), asked)
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:  # ValueError: a URL it cannot send
            log.info("webhook endpoint did not answer", extra={"url": url, "error": str(e)[:200]})
            return Answer(None)
