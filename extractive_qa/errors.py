"""The errors a user can fix: each message names the file or field and says what to do."""

from __future__ import annotations


class ConfigError(Exception):
    """A bad config: the message names the file / field and what to do."""


class DataError(Exception):
    """Bad input: the message names the file / field and says what to do."""


class ScalingError(Exception):
    """A problem the user can fix; the message says which and how."""


class TrainingDiverged(Exception):
    """A run whose gradients or weights became NaN or infinite: the message names the step and the
    settings that likely caused it; no checkpoint with such values was written."""
