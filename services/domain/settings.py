"""The values the use-cases are configured with: input limits and the wanted view configuration.

Plain values; services/runtime/settings.py builds them from the environment and describes each
variable (MAILQUEUE_MAX_*, MAILQUEUE_SLICE_WINDOW_S, ...).
"""

from __future__ import annotations

import dataclasses

KiB = 1024
MiB = 1024 * KiB


@dataclasses.dataclass(frozen=True)
class LimitSettings:
    """Input limits: a request beyond any of them is refused and writes nothing."""

    max_inline_bytes: int = 3 * MiB
    max_mail_bytes: int = 100 * MiB
    max_blob_bytes: int = 1024 * MiB
    max_recipients: int = 1000
    max_attributes: int = 128
    max_attribute_bytes: int = 64 * KiB
    max_metadata_bytes: int = 512 * KiB
    dequeue_inline_bytes: int = 1 * MiB
    #: A delivery, content and metadata, must fit one 16 MiB gRPC message.
    DEQUEUE_INLINE_MAX = 15 * MiB
    max_prefetch: int = 512
    small_blob_bytes: int = 64 * KiB
    SMALL_BLOB_MAX = 1 * MiB
    abandoned_claim_s: float = 30.0
    claim_lease_s: int = 3

    @property
    def blob_limit(self) -> int:
        """The largest blob a Put stores: no mail can be larger, so a larger blob could never be
        enqueued (it was stored all the same, for the retention sweep)."""
        return min(self.max_blob_bytes, self.max_mail_bytes)

    def carried(self, content: bytes | None, size: int) -> bytes | None:
        """The content a mail's RabbitMQ message carries (None: the delivery reads the blob
        store): a small mail's whole content, ``size`` bytes of it."""
        return content if content is not None and len(content) == size <= self.small_blob_bytes else None


@dataclasses.dataclass(frozen=True)
class ViewSettings:
    """The wanted view configuration; unset fields keep what is stored (or the defaults)."""

    slice_window_s: int | None = None
    bucket_count: int | None = None
    update_browse_start_pace: int | None = None


@dataclasses.dataclass(frozen=True)
class EventSettings:
    """Events (services/domain/events.py): recorded or not, and how long a mail's history is kept."""

    #: Off only to measure what events cost (bench/): no history, nothing recorded.
    enabled: bool = True
    #: Where events go: "all" (the history, then the stream). Three more values exist only to tell
    #: apart what each part costs (bench.events_bench --modes): "history" (no stream), "stream"
    #: (no history) and "unwritten" (events made and encoded, then dropped).
    sinks: str = "all"
    #: Seconds a history row lives (its TTL): 7 days.
    history_retention_s: int = 7 * 24 * 3600
    #: Milliseconds a HANDED_OUT event waits to be written with its answer's event; unanswered by
    #: then, it is written on its own. 0: written before the delivery is sent.
    handout_delay_ms: int = 1000
