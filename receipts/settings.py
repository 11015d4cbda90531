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
