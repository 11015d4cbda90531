"""Process settings read from the environment (names are the documented configuration)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings shared by every role; each field reads the environment variable in its alias."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    database_url: str | None = Field(default=None, alias="RECEIPT_DATABASE_URL")
    data_dir: Path = Field(default=Path(".receipt"), alias="RECEIPT_DATA_DIR")
    pool_min_size: int = Field(default=1, ge=1, alias="RECEIPT_DB_POOL_MIN")
    pool_max_size: int = Field(default=10, ge=1, alias="RECEIPT_DB_POOL_MAX")

    temporal_address: str | None = Field(default=None, alias="RECEIPT_TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", alias="RECEIPT_TEMPORAL_NAMESPACE")
    task_queue_prefix: str = Field(default="", alias="RECEIPT_TASK_QUEUE_PREFIX")
    deliveries_per_attempt: int = Field(
        default=2, ge=1, le=10, alias="RECEIPT_DELIVERIES_PER_ATTEMPT"
    )
    # How long Temporal waits for a heartbeat from a running attempt before it redelivers the
    # attempt to another worker (the attempt activity's heartbeat timeout).
    worker_lost_timeout_ms: int = Field(
        default=30_000, ge=1_000, le=3_600_000, alias="RECEIPT_WORKER_LOST_TIMEOUT_MS"
    )

    resonate_callback_url: str | None = Field(default=None, alias="RECEIPT_RESONATE_CALLBACK_URL")
    event_callback_url: str | None = Field(default=None, alias="RECEIPT_EVENT_CALLBACK_URL")
    callback_token: str | None = Field(default=None, alias="RECEIPT_CALLBACK_TOKEN")
    callback_signing_secret: str | None = Field(
        default=None, alias="RECEIPT_CALLBACK_SIGNING_SECRET"
    )

    def queue(self, name: str) -> str:
        """Return a task queue's name in this deployment (`RECEIPT_TASK_QUEUE_PREFIX` + name)."""
        return self.task_queue_prefix + name

    @property
    def callback_urls(self) -> list[str]:
        """The distinct configured callback URLs, in configuration order."""
        urls = [u for u in (self.resonate_callback_url, self.event_callback_url) if u]
        return list(dict.fromkeys(urls))
