"""The error every checked input raises: a configuration, a data file, a plugin (one line that
names the key or the file). Its own module, below the configuration and the plugin registry."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file or override is malformed or holds an invalid value."""
