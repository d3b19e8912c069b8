"""Poster on the standard library (urllib in a thread): one request per call, no pooling (a batch
per request, so a connection per batch costs little next to the batch).

- Each request runs in a thread of its own, never on the event loop's shared pool (which the
  registry reads use): an endpoint that hangs, or answers a byte at a time, holds only its own.
- A call ends by ``2 × timeout_s`` whatever the endpoint does (urllib's timeout is per socket
  operation); the late answer is dropped and the batch is retried.
- One request at a time per lane (an endpoint): while a lane's request outlives its bound, a
  call on that lane sends nothing and is answered "no answer" (retried after its backoff).
  Requests never queue behind a hung one, to leave late with the timestamp signed when queued
  (past the receiver's replay window: refused, dropped), or all at once when it ends.
- The threads are daemons: a request still trickling does not hold up the process's exit.
- Redirects are not followed: a POST redirected would be re-sent as a GET without its body, to
  any host, with the signature headers; the 3xx is the answer (services/domain/webhooks.py).
- At most ``MAX_READ`` bytes of an answer are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from services.domain.webhook_registry import shown_url
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
        #: Each lane's last request, done once its thread ended.
        self._sending: dict[str, asyncio.Future[Answer]] = {}

    async def post(self, lane: str, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Answer:
        previous = self._sending.get(lane)
        if previous is not None and not previous.done():
            log.info("webhook endpoint still holds an earlier request: nothing sent", extra={"endpoint": lane, "url": shown_url(url)})
            return Answer(None)
        loop = asyncio.get_running_loop()
        answer = self._sending[lane] = loop.create_future()

        def send() -> None:
            result = Answer(None)  # whatever _post raises, the lane is free again
            try:
                result = self._post(url, body, dict(headers), timeout_s)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the process stops)
                    loop.call_soon_threadsafe(_settle, answer, result)

        threading.Thread(target=send, name=f"webhook-{lane}"[:60], daemon=True).start()
        try:
            async with asyncio.timeout(2 * timeout_s):
                return await asyncio.shield(answer)  # the lane stays busy until the thread ends
        except TimeoutError:
            log.info("webhook endpoint did not answer in time", extra={"endpoint": lane, "url": shown_url(url), "timeout_s": 2 * timeout_s})
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
            log.info("webhook endpoint did not answer", extra={"url": shown_url(url), "error": str(e)[:200]})
            return Answer(None)


def _settle(answer: asyncio.Future[Answer], result: Answer) -> None:
    if not answer.done():
        answer.set_result(result)
