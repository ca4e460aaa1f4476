"""The package version, read by setup.py and part of auto's tuning-cache file name."""
__version__ = "0.1.0"
