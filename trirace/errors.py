"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UsageError(Exception):
    """Bad input: a flag, a config file, a data path, an impossible layout."""


class ConfigError(UsageError):
    """A configuration value that fails validation."""


class DataError(UsageError):
    """A data source that is missing or holds no usable text."""
