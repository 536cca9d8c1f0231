"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UsageError(Exception):
    """Bad input: a flag, a config file, a data path, an impossible layout."""


class ConfigError(UsageError):
    """A configuration value that fails validation."""


class DataError(UsageError):
    """A data source that is missing or holds no usable text."""


class Diverged(RuntimeError):
    """Training produced a non-finite loss or gradient norm. Every rank raises it at the same
    update; the CLI prints it as one line and exits with status 3."""

    EXIT_STATUS = 3

    def __init__(self, step: int, what: str):
        super().__init__(f"step {step}: {what}; stopped before applying it (the last checkpoint is intact); "
                         "lower --lr, clip with --clip-grad, or pass --on-nonfinite skip")
        self.step, self.what = step, what
