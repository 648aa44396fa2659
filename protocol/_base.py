"""The base model every protocol record derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Record"]


class Record(BaseModel):
    """A frozen, strict-shaped pydantic model: the unit of data that crosses a boundary.

    Frozen because pykka passes messages by reference (docs/pykka.md T13); `extra="forbid"` so a
    misspelt field is an error, not silently dropped data.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=False, ser_json_inf_nan="constants"
    )
